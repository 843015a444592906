"""One timer for GPU work, shared by the benchmark, the demo and the GPU tests: ``GpuTimer`` (a block's GPU
time on a stream, by two CUDA events, and its host time), ``gpu_time`` (device seconds per call, median of
groups) and ``host_time`` (host seconds per call). On Numba's CUDA simulator there are no events: every time
is the host's wall clock, which says nothing about a GPU (``CLOCK`` says which clock is in use).
"""
import statistics
import time

from ..driver.streams import stream_handle
from ..driver.target import SIMULATOR
from ..testing import synchronize

CLOCK = "wall clock (the CUDA simulator has no CUDA events; the times say nothing about a GPU)" if SIMULATOR \
    else "CUDA events"


def _numba_stream(handle):
    """The Numba stream object for raw stream ``handle`` (events are recorded on Numba streams)."""
    from numba import cuda

    named = {0: cuda.default_stream, 1: cuda.legacy_default_stream, 2: cuda.per_thread_default_stream}
    return named[handle]() if handle in named else cuda.external_stream(handle)


class GpuTimer:
    """``with GpuTimer(stream) as t: ...``: ``t.seconds`` is the GPU time of the work the block issued on
    ``stream`` (``stream=`` as kvnumba takes it), ``t.host_seconds`` the block's own host time (before waiting
    for the end event); on the simulator both are the block's wall time."""

    clock = CLOCK

    def __init__(self, stream=None):
        self.stream = stream
        self._handle = stream_handle(stream)  # a TypeError for what is not a stream, here too on the simulator
        self.seconds = None
        self.host_seconds = None
        self._events = None

    def __enter__(self):
        if not SIMULATOR:
            from numba import cuda

            self._numba_stream = _numba_stream(self._handle)
            self._events = (cuda.event(), cuda.event())
            self._events[0].record(self._numba_stream)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.host_seconds = time.perf_counter() - self._start
        if self._events is None:
            self.seconds = self.host_seconds
            return False
        start, end = self._events
        end.record(self._numba_stream)
        end.synchronize()
        self.seconds = start.elapsed_time(end) / 1e3
        return False


def gpu_time(fn, repeats=1, stream=None, *, groups=1, warmup=1):
    """Device seconds per call of ``fn()``: ``warmup`` calls first (compilation, first touch), then
    ``groups`` groups of ``repeats`` back-to-back calls, each group timed by CUDA events on ``stream``
    (the stream ``fn`` issues its work on); the median of the groups' per-call times. On the
    simulator: wall time (``CLOCK``)."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(groups):
        with GpuTimer(stream) as timer:
            for _ in range(repeats):
                fn()
        times.append(timer.seconds / repeats)
    return statistics.median(times)


def host_time(fn, calls=1, *, groups=1, warmup=0, include_sync=False):
    """Host seconds per call of ``fn()``: ``warmup`` calls, then ``groups`` groups of ``calls``
    back-to-back calls with no synchronisation inside a group (the device is synchronised before each
    group, and after the last); the median of the groups. ``include_sync``: each group's time also
    waits for its GPU work (the wall time of synchronised calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(groups):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if include_sync:
            synchronize()
        times.append((time.perf_counter() - start) / calls)
    synchronize()
    return statistics.median(times)
