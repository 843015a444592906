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

        Numba copies its whole IR at every call site, so call a large function from one site (a build's time
        grows with the copies). Numba's inlining, not NVVM's, which builds for the current GPU: ``kernel_ptx``
        must work without one."""
        from numba import cuda

        return cuda.jit(device=True, inline="always")(fn)

    def kernel(fn, **gpu_options):
        """Make ``fn`` a lazily compiled CUDA kernel with ``gpu_options`` (e.g. ``max_registers``); the first
        one made says if kvnumba chose the simulator by itself (``driver.target.announce``)."""
        from numba import cuda

        announce()
        return cuda.jit(fn, **gpu_options)
