"""Numba's two decorators as kvnumba uses them: device functions and kernels, in both worlds."""
from ..driver.launch import WARP_SIZE  # noqa: F401 - the kernels' warp size
from ..driver.target import SIMULATOR, announce


def device_function(fn):
    """Compile ``fn`` as an always-inlined CUDA device function (plain Python on the simulator).

    On the simulator a plain function is far cheaper to call than a simulated device function,
    and behaves the same.
    """
    if SIMULATOR:
        return fn
    from numba import cuda

    return cuda.jit(device=True, inline="always")(fn)


def kernel(fn, **gpu_options):
    """Make ``fn`` a lazily compiled CUDA kernel; ``gpu_options`` (e.g. ``max_registers``) apply on
    the GPU only, the simulator has no use for them. The first one made says, if kvnumba chose the
    simulator by itself (no CUDA driver), that kernels run there (``kvnumba.driver.target.announce``)."""
    from numba import cuda

    announce()
    return cuda.jit(fn) if SIMULATOR else cuda.jit(fn, **gpu_options)
