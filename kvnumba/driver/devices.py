"""GPUs and their primary contexts (the ones torch, CuPy and Numba share): which device is current, and running
work on a given one without changing the caller's current device.
"""
import functools
import threading

from .bindings import check, cu
from .target import SIMULATOR

_lock = threading.Lock()
_contexts: dict[int, tuple] = {}  # device ordinal -> (CUcontext, its handle as an int)


def device_count():
    """Number of CUDA devices (1 on the simulator: everything lives on "device 0")."""
    if SIMULATOR:
        return 1
    from numba import cuda

    return len(cuda.gpus)


@functools.cache
def attribute(device, name):
    """``CU_DEVICE_ATTRIBUTE_<name>`` of GPU ``device`` (memoised: a device's attributes never change)."""
    which = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(cu.cuDeviceGetAttribute(which, device), "cuDeviceGetAttribute"))


def context(device):
    """``(CUcontext, int handle)`` of ``device``'s primary context, made ready by Numba on first use."""
    known = _contexts.get(device)
    if known is None:
        from numba import cuda

        with _lock:
            known = _contexts.get(device)
            if known is None:
                handle = cuda.gpus[device].get_primary_context().handle
                ctx = handle if isinstance(handle, cu.CUcontext) else cu.CUcontext(int(handle))
                known = _contexts[device] = (ctx, int(ctx))
    return known


def current_context():
    """Handle (int) of the context current on this thread, 0 if none."""
    err, ctx = cu.cuCtxGetCurrent()
    return 0 if err else int(ctx)


def current_device():
    """Ordinal of the device current on this thread (0 if none, as the runtime would pick)."""
    if SIMULATOR:
        return 0
    err, device = cu.cuCtxGetDevice()
    return 0 if err else int(device)


class on_device:
    """``with on_device(d):`` runs the block with device ``d``'s primary context current, restoring the caller's
    afterwards (a no-op when it is already current, checked by one ``cuCtxGetCurrent``; always on the simulator)."""

    __slots__ = ("ctx", "handle", "pushed")

    def __init__(self, device):
        if SIMULATOR:
            self.ctx, self.handle = None, 0
        else:
            self.ctx, self.handle = context(device)
        self.pushed = False

    def __enter__(self):
        if not SIMULATOR and current_context() != self.handle:
            check(cu.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            self.pushed = False
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
        return False


def synchronize_all():
    """Wait for every device kvnumba has launched on (their primary contexts)."""
    for device in list(_contexts):
        with on_device(device):
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
