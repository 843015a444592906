"""SIGINT, SIGTERM and SIGHUP as ``Interrupted`` while a file is converted, so that its temporary output is
removed (``kvnumba.convert.files``)."""
import contextlib
import signal
import threading

from ..errors import Interrupted


_CLEANUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_on_signals():
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``, so that the converters'
    ``except`` clauses remove their temporary file (by default SIGTERM and SIGHUP end the process at
    once, leaving it behind). Only default handlers are replaced, and only on the main thread (the only
    one that may set them): an ignored signal or someone's own handler is left alone. The previous
    handlers are restored afterwards."""
    replaced = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _CLEANUP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_DFL or previous is signal.default_int_handler:
                replaced[signum] = previous
                signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)


__all__ = ["interrupt_on_signals"]
