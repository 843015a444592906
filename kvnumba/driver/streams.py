"""Which CUDA stream a transfer runs on, as a raw handle (an int; 0 is the legacy default stream).

Like the seed, a call given torch tensors follows torch's current stream *for the device the
transfer runs on*; otherwise the ``stream=`` argument, else the default stream. ``stream=`` accepts a
raw handle, a torch, CuPy, Numba or ``cuda.core`` stream (anything with ``__cuda_stream__``).
"""
import sys
import weakref

from .target import SIMULATOR


def torch_current_stream(device):
    """torch's current stream on ``device`` (raw handle), by the raw C getter: well under a microsecond."""
    torch = sys.modules["torch"]
    try:
        return torch._C._cuda_getCurrentRawStream(device)
    except AttributeError:  # pragma: no cover - older torch
        return torch.cuda.current_stream(device).cuda_stream


def stream_handle(stream, torch_device=None):
    """The handle for ``stream``; ``None`` means torch's current stream on ``torch_device`` when the
    call has torch tensors (``torch_device`` not None), else the default stream. Raises
    ``TypeError`` for something that is not a stream."""
    if stream is None:
        if torch_device is not None and not SIMULATOR:
            return torch_current_stream(torch_device)
        return 0
    if type(stream) is int:
        return stream
    return _handles(stream)


def _object_handle(stream):
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream or a raw stream handle (int), got bool")
    if isinstance(stream, int):
        return int(stream)
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    protocol = getattr(stream, "__cuda_stream__", None)  # cuda.core and Numba streams
    if protocol is not None:
        return int(protocol()[1])
    handle = getattr(stream, "handle", None)
    if handle is not None:
        return int(getattr(handle, "value", handle) or 0)
    if SIMULATOR and type(stream).__module__.startswith("numba.cuda.simulator"):
        return 0  # numba's simulated streams have no handle: the simulator runs everything in order
    raise TypeError(f"stream must be a CUDA stream or a raw stream handle (int), got {type(stream).__name__}")


class PerStream:
    """``memo(stream)``: ``compute(stream)``, kept per stream object while it lives, for torch's and CuPy's streams,
    which wrap one stream (and one device) for life and cost a few attribute reads per call. Other objects (a
    ``cuda.core`` stream can be closed, a Numba one is cheap to read) are asked every time."""

    def __init__(self, compute):
        self.compute = compute
        self.known: dict[int, tuple] = {}  # id(stream) -> (weak reference to it, value)

    def __call__(self, stream):
        known = self.known.get(id(stream))
        if known is not None and known[0]() is stream:
            return known[1]
        value = self.compute(stream)
        if type(stream).__module__.startswith(("torch", "cupy")):
            key, known_ = id(stream), self.known

            def forget(_reference):  # when the stream goes, before its id can be another object's
                known_.pop(key, None)

            try:
                known_[key] = (weakref.ref(stream, forget), value)
            except TypeError:  # no weak references to it: asked every time
                pass
        return value


_handles = PerStream(_object_handle)
