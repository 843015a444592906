"""The simulator's twin of ``kernels.jit``: Numba's decorators as the simulator runs them."""
from ...driver.target import announce

__all__ = ["device_function", "kernel"]


def device_function(fn):
    """``fn`` itself: on the simulator a plain function is far cheaper to call than a simulated device
    function, and behaves the same."""
    return fn


def kernel(fn, **gpu_options):
    """``fn`` as a simulated CUDA kernel (``gpu_options`` apply on the GPU only), as ``kernels.jit.kernel``."""
    from numba import cuda

    announce()
    return cuda.jit(fn)
