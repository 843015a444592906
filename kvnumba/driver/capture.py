"""Whether a call's stream is being captured into a CUDA graph, and the refusal of what a graph cannot hold.

Host work between a stream's operations is not recorded, so a captured call must need none: reading host
indices, waiting for the stream (``check=True``), building a plan, or a copy-engine batch (which CUDA refuses
to capture). Each raises ``CaptureError`` before anything is recorded, and the capture stays valid. The check
(``cuStreamIsCapturing``) is made only on paths that do host work anyway. The simulator has no graphs:
``simulated_capture`` marks a stream as capturing so that the refusals can be tried there.
"""
import contextlib
import sys

from ..errors import CaptureError
from .target import SIMULATOR

_simulated: dict[int, int] = {}  # the simulator's "capturing" stream handles, and how deep (simulated_capture)


@contextlib.contextmanager
def simulated_capture(handle=0):
    """On the simulator: the block runs as if stream ``handle`` were being captured (for tests). Nested blocks
    count: the stream captures until the outermost one ends."""
    if not SIMULATOR:
        raise RuntimeError("simulated_capture is the simulator's stand-in; on a GPU capture a real graph")
    handle = int(handle)
    _simulated[handle] = _simulated.get(handle, 0) + 1
    try:
        yield
    finally:
        _simulated[handle] -= 1
        if not _simulated[handle]:
            del _simulated[handle]


if SIMULATOR:

    def capturing(handle):
        return int(handle) in _simulated

else:
    from .bindings import cu
    from .launch import stream_object

    _NONE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
    _IMPLICIT = cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT

    def capturing(handle):
        """Whether stream ``handle`` (a raw handle) is being captured. The legacy default stream answers an
        error while another stream captures in global mode (using it would break that capture): capturing."""
        err, status = cu.cuStreamIsCapturing(stream_object(handle))
        if err == _IMPLICIT:
            return True
        return not err and status != _NONE


def current_handle(stream):
    """The stream a call with ``stream=stream`` would run on, as far as it is known before the call's buffers
    are read: the stream given, else torch's current stream (if torch is in use), else the default stream."""
    from .streams import stream_handle, torch_current_stream

    if stream is not None:
        return stream_handle(stream)
    torch = sys.modules.get("torch")
    if torch is not None and not SIMULATOR and torch.cuda.is_initialized():
        return torch_current_stream(torch.cuda.current_device())
    return 0


def refuse(handle, what, instead):
    """Raise ``CaptureError`` if stream ``handle`` is being captured: ``what`` cannot be captured,
    ``instead`` says what to do."""
    if capturing(handle):
        raise CaptureError(f"{what} cannot be captured in a CUDA graph (the stream is capturing); {instead}. "
                           "Nothing was recorded")
