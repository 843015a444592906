"""Which CUDA stream a transfer runs on, as a raw handle (an int; 0 is the legacy default stream).

Like the seed, a call given torch tensors follows torch's current stream; otherwise the ``stream=``
argument, else the default stream. ``stream=`` accepts a raw handle, a torch, CuPy, Numba or
``cuda.core`` stream.
"""
import sys

from .target import SIMULATOR


def _torch_current_stream():
    torch = sys.modules["torch"]
    try:  # the raw C getters cost well under a microsecond; current_stream() builds an object
        return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    except AttributeError:  # pragma: no cover - older torch
        return torch.cuda.current_stream().cuda_stream


def stream_handle(stream, uses_torch=False):
    """The handle for ``stream`` (see the module docstring). Raises ``TypeError`` if unusable."""
    if stream is None:
        if uses_torch and not SIMULATOR:
            return _torch_current_stream()
        return 0
    if isinstance(stream, int):
        return stream
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
    raise TypeError(f"stream must be a CUDA stream or a raw stream handle (int), got {type(stream).__name__}")
