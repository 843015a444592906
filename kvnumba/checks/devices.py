"""One call, one GPU: the device that owns a call's buffers, or an error naming two that disagree."""
from ..driver.pointers import HOST
from ..driver.devices import current_device
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError


def one_device(placed, what="kvnumba copies within one GPU (and pinned host memory); move the buffers to "
                            "one device"):
    """The one GPU of ``placed`` (``(name, device)`` pairs; pinned host memory goes with any), or
    the current device when everything is host memory. ``DeviceMismatchError`` names two others."""
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
