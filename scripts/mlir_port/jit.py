# numba-cuda-mlir's decorators in place of numba-cuda's: the change of import alone.
from numba_cuda_mlir import cuda as _cuda


def device_function(fn):
    return _cuda.jit(device=True, inline="always")(fn)


def kernel(fn, **gpu_options):
    announce()
    return _cuda.jit(fn, **gpu_options)
