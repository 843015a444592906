"""Progress of long jobs (``kvnumba convert``, ``scripts/bench.py``) on a stream, usually stderr: tqdm's bar
where tqdm draws one (a terminal), else plain lines (docs/guides/convert.md, "Chunks and progress").
"""
import importlib
import sys
import time

from ..units import format_bytes

PLAIN_INTERVAL_S = 1.0


def _is_terminal(stream):
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress(label, total, *, stream=sys.stderr, unit="B", line_per_step=False):
    """A progress reporter for ``total`` units (bytes when ``unit="B"``), labelled ``label``.

    ``stream=None`` draws nothing; a terminal without tqdm gets a plain line at most every
    ``PLAIN_INTERVAL_S`` seconds, a pipe or log only the summary line (and with ``line_per_step=True``, a
    line per step). It has ``advance(n=1, note=None)``, ``write(text)`` (a line on stdout without tearing
    the bar), ``close()`` and ``abandon()`` (a failure: no summary); as a context manager it closes, or
    abandons when the block raises.
    """
    if stream is None:
        return Silent()
    try:
        tqdm = importlib.import_module("tqdm").tqdm  # an optional dependency
    except ImportError:
        interval = PLAIN_INTERVAL_S if _is_terminal(stream) else None
    else:
        bar = TqdmBar(tqdm, label, total, stream, unit)
        if not bar.disabled:  # tqdm draws only on a terminal (disable=None)
            return bar
        interval = None
    return PlainLines(label, total, stream, unit, interval=interval, line_per_step=line_per_step)


class _Reporter:
    def advance(self, n=1, note=None):
        pass

    def write(self, text):
        print(text, flush=True)

    def close(self):
        pass

    def abandon(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.close()
        else:
            self.abandon()


class Silent(_Reporter):
    """``--quiet``: the steps are counted by nobody."""


class TqdmBar(_Reporter):
    """tqdm's bar on a terminal; it stays on screen, complete, when closed."""

    def __init__(self, tqdm, label, total, stream, unit):
        self._tqdm = tqdm
        self._bar = tqdm(total=total, desc=label, unit=unit, unit_scale=unit == "B", unit_divisor=1000,
                         file=stream, leave=True, dynamic_ncols=True, mininterval=0.1, disable=None)
        self.disabled = bool(self._bar.disable)  # not a terminal: tqdm draws nothing

    def advance(self, n=1, note=None):
        if note is not None:
            self._bar.set_postfix_str(note, refresh=False)
        self._bar.update(n)

    def write(self, text):
        self._tqdm.write(text, file=sys.stdout)  # clears the bar, prints, redraws it
        sys.stdout.flush()

    def close(self):
        self._bar.close()

    def abandon(self):
        self._bar.leave = False
        self._bar.close()


class PlainLines(_Reporter):
    """Whole lines only: no carriage returns or escape codes in a log."""

    def __init__(self, label, total, stream, unit, *, interval=None, line_per_step=False):
        self.label, self.total, self.stream, self.unit = label, total, stream, unit
        self.interval, self.line_per_step = interval, line_per_step
        self.done, self.steps = 0, 0
        self._start = self._last_line = time.monotonic()
        self._closed = False

    def _amount(self, n):
        return format_bytes(n) if self.unit == "B" else f"{n} {self.unit}{'' if n == 1 else 's'}"

    def _line(self, text):
        self.stream.write(text + "\n")
        self.stream.flush()

    def advance(self, n=1, note=None):
        self.done += n
        self.steps += 1
        now = time.monotonic()
        if self.line_per_step:
            where = (f"{self._amount(self.done)} / {self._amount(self.total)}" if self.unit == "B"
                     else f"{self.done}/{self.total}")
            self._line(f"{self.label} [{where}]{f' {note}' if note else ''} ({now - self._start:.1f} s)")
            self._last_line = now
        elif self.interval is not None and now - self._last_line >= self.interval and self.done < self.total:
            percent = 100 * self.done // max(self.total, 1)
            self._line(f"{self.label}: {percent}% {self._amount(self.done)} / {self._amount(self.total)}")
            self._last_line = now

    def close(self):
        if not self._closed:
            self._closed = True
            self._line(f"{self.label}: {self._amount(self.done)} in {time.monotonic() - self._start:.1f} s")

    def abandon(self):
        self._closed = True


__all__ = ["PLAIN_INTERVAL_S", "format_bytes", "progress"]
