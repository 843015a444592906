"""One call, one GPU: the device that owns a call's buffers, or an error naming two that disagree; and a stream
that says it belongs to another GPU, refused."""
from ..driver.pointers import HOST
from ..driver.devices import current_device
from ..driver.lanes import LaneStream
from ..driver.streams import stream_handle
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError


def one_device(placed, what="kvnumba copies within one GPU (and pinned host memory); move the buffers to "
                            "one device"):
    """The one GPU of ``placed`` (``(name, device)`` pairs; host memory goes with any), or the current device
    when everything is host memory; else ``DeviceMismatchError`` naming two."""
    seen: dict[int, str] = {}  # device -> the first name placed on it
    for name, device in placed:
        if device != HOST:
            seen.setdefault(device, name)
    if len(seen) > 1:
        (d0, n0), (d1, n1) = list(seen.items())[:2]
        raise DeviceMismatchError(f"{n0} is on cuda:{d0} but {n1} is on cuda:{d1}: {what}")
    if seen:
        return next(iter(seen))
    return 0 if SIMULATOR else current_device()


def stream_device(stream):
    """The GPU a stream object says it belongs to: an SM lane's ``device``, a torch stream's
    ``device.index``, a CuPy stream's ``device_id``; None where it says nothing (raw handles, Numba's)."""
    if stream is None or type(stream) is int:
        return None
    if type(stream) is LaneStream:
        return stream.device
    module = type(stream).__module__
    if module.startswith("torch"):
        found = getattr(stream, "device_index", None)
        if found is None:
            found = getattr(getattr(stream, "device", None), "index", None)
    elif module.startswith("cupy"):
        found = getattr(stream, "device_id", None)
    else:
        return None
    return found if type(found) is int else None


def call_stream(stream, device, uses_torch):
    """The handle a call on ``device`` runs on: ``stream``'s (refused if it says it is on another GPU), or for
    ``None`` torch's current stream where the call has torch tensors (``uses_torch``), else the default stream."""
    same_device_stream(stream, device)
    return stream_handle(stream, device if uses_torch else None)


def same_device_stream(stream, device):
    """``DeviceMismatchError`` if ``stream`` says it is on another GPU than the call's buffers (``device``)."""
    on = stream_device(stream)
    if on is not None and on != device:
        raise DeviceMismatchError(f"stream is on cuda:{on} but the buffers are on cuda:{device}: pass a stream "
                                  f"of cuda:{device}")
