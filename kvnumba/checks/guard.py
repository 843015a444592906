"""The kernels' error flag, and the optional synchronous check.

Indices in GPU memory are not read by the host before a launch (that would synchronise every call).
Instead each launch gets exclusive token limits for both sides (``checks.bounds``) and the address of one
int64 flag: the kernel skips any item outside its buffer, copies the others, and stores 1 to the flag.

The flag lives in pinned host memory (one per process), so the host reads it without a copy. It is
reported at the call with ``check=True`` (or ``KVNUMBA_CHECK=1``): the call synchronises its stream and
raises ``IndexOutOfRangeError``; otherwise at the start of the next kvnumba call, or by
``kvnumba.check_errors()``. It is cleared when raised, and shared by every stream and thread, so a
deferred report says that *an* earlier call skipped items, not which one.

"""
import threading

import numpy as np

from .. import config
from ..driver.target import SIMULATOR
from ..errors import IndexOutOfRangeError

# KVNUMBA_CHECK=1: every call behaves as if given check=True (the hot paths read this module attribute).
ALWAYS_CHECK = config.always_check()


def _read_setting():
    global ALWAYS_CHECK
    ALWAYS_CHECK = config.always_check()


config.on_change(_read_setting)

_lock = threading.Lock()
_flag = None  # the int64 flag (a NumPy array over pinned memory on a GPU)
_view = None  # a memoryview of it: the cheapest read on the hot path
_address = 0  # where kernels write it


def flag_address():
    """Address of the error flag, allocated on first use."""
    global _flag, _view, _address
    if _flag is None:
        with _lock:
            if _flag is None:
                if SIMULATOR:
                    flag = np.zeros(1, np.int64)
                else:
                    from numba import cuda

                    # Pinned host memory is mapped into the GPU's unified address space: the kernel
                    # writes it at its host address, the host reads it as a plain NumPy array.
                    flag = cuda.pinned_array(1, np.int64)
                    flag[0] = 0
                _view = memoryview(flag)  # type: ignore[arg-type, unused-ignore]
                _address = flag.ctypes.data
                _flag = flag
    return _address


def flag_view():
    """The flag as a memoryview (``view[0] != 0``: a kernel skipped items)."""
    flag_address()
    return _view


def flag_set():
    return _view is not None and _view[0] != 0


def clear():
    if _view is not None:
        _view[0] = 0


def raise_pending():
    """At the start of every entry point: report what an earlier asynchronous launch flagged."""
    if _view is not None and _view[0]:
        _view[0] = 0
        raise IndexOutOfRangeError(
        "an earlier kvnumba transfer skipped items whose token indices (in GPU memory) were out of range "
        "for their buffers; the other items were copied. This call did nothing. Pass check=True (or set "
        "KVNUMBA_CHECK=1) to raise at the call that does it.")


def synchronize(handle):
    """Wait for stream ``handle`` (0: the default stream); nothing to wait for on the simulator."""
    if SIMULATOR:
        return
    from ..driver.bindings import check, cu

    check(cu.cuStreamSynchronize(cu.CUstream(handle)), "cuStreamSynchronize")


def check_errors() -> None:
    """Wait for the GPU, then raise ``IndexOutOfRangeError`` if any earlier kvnumba kernel skipped items
    with out-of-range indices (and clear the flag).

    Cost: a synchronisation of every device kvnumba has used (``numba.cuda.synchronize()`` on each).

    Raises
    ------
    IndexOutOfRangeError
        A ``ValueError`` (and ``IndexError``) subclass, from ``kvnumba.errors``.
    """
    if not SIMULATOR and _flag is not None:
        from ..driver.devices import synchronize_all

        synchronize_all()
    raise_pending()
