"""A kernel's PTX for a compute capability, as the PTX tests and the tools read it: NVVM compiles it, no GPU
needed. Every kernel module's ``kernel_ptx`` comes here."""
from ..driver.target import SIMULATOR

__all__ = ["ptx_of"]


def ptx_of(dispatcher, signature, cc=(9, 0)):
    """The PTX of kernel ``dispatcher`` (one ``jit.kernel`` made) for ``signature`` and compute capability
    ``cc``; not on the simulator, whose kernels are Python."""
    if SIMULATOR:
        raise RuntimeError("kernel_ptx needs the real CUDA target: set NUMBA_ENABLE_CUDASIM=0 (no GPU needed)")
    from numba import cuda

    ptx, _ = cuda.compile_ptx(dispatcher.py_func, signature, cc=cc)
    return ptx
