"""Which CUDA stream a transfer runs on, as a raw handle (an int; 0 is the legacy default stream).

Like the seed, a call given torch tensors follows torch's current stream *for the device the
transfer runs on*; otherwise the ``stream=`` argument, else the default stream. ``stream=`` accepts a
raw handle, a torch, CuPy, Numba or ``cuda.core`` stream (anything with ``__cuda_stream__``).
"""
import sys

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
    return _object_handle(stream)


def _object_handle(stream):
    # Read on every call, never remembered per stream object: torch (2.11) does not clear a collected stream's
    # weak references, so a stream made at a collected one's address looked like it and took its handle.
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
