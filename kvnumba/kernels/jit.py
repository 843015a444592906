"""Numba's two decorators as kvnumba uses them: device functions and kernels, in both worlds (the simulator's
in ``kernels.simulator.jit``, chosen here once, at import)."""
from ..driver.launch import WARP_SIZE  # the kernels' warp size, defined once with the launch
from ..driver.target import SIMULATOR, announce

__all__ = ["WARP_SIZE", "device_function", "kernel"]

if SIMULATOR:
    from .simulator.jit import device_function, kernel  # noqa: F401
else:

    def device_function(fn):
        """Compile ``fn`` as an always-inlined CUDA device function (the simulator's twin returns ``fn``).

        Numba inlines it by copying its whole IR, with all it inlined, at every call site, so a kernel's build
        time grows with the copies: call a large function from one site (a loop over four elements, not four
        calls; ``fp8.word_dequantiser``). Numba's own inlining, not NVVM's (``forceinline``), because the
        latter builds each device function for the current GPU, and ``kernel_ptx`` must work without one."""
        from numba import cuda

        return cuda.jit(device=True, inline="always")(fn)

    def kernel(fn, **gpu_options):
        """Make ``fn`` a lazily compiled CUDA kernel; ``gpu_options`` (e.g. ``max_registers``) apply on
        the GPU only, the simulator has no use for them. The first one made says, if kvnumba chose the
        simulator by itself (no CUDA driver), that kernels run there (``kvnumba.driver.target.announce``)."""
        from numba import cuda

        announce()
        return cuda.jit(fn, **gpu_options)
