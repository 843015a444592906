"""The simulator's twin of ``kernels.jit``: Numba's decorators as the simulator runs them."""
from ...driver.target import announce

__all__ = ["device_function", "kernel"]


def device_function(fn):
    """``fn`` itself: on the simulator a plain function is far cheaper to call than a simulated device
    function, and behaves the same."""
    return fn


def kernel(fn, **gpu_options):
    """``fn`` as a simulated CUDA kernel; ``gpu_options`` (e.g. ``max_registers``) apply on the GPU only. The
    first one made says, if kvnumba chose the simulator by itself (no CUDA driver), that kernels run here
    (``kvnumba.driver.target.announce``)."""
    from numba import cuda

    announce()
    return cuda.jit(fn)
