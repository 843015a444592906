"""Which world kvnumba runs in, decided once at import: a real GPU or Numba's CUDA simulator.

Everything that differs between the two (memory primitives, launching, what an array's address
means) branches on ``SIMULATOR`` at import time, so kernel bodies never branch on it.
"""
import os

try:  # numba-cuda keeps its own copy of the config; older numba kept it in numba.config
    from numba.cuda.core import config as _config
except ImportError:  # pragma: no cover
    from numba import config as _config

SIMULATOR = bool(_config.ENABLE_CUDASIM)

WARP_SIZE = 32


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
    the GPU only, the simulator has no use for them."""
    from numba import cuda

    return cuda.jit(fn) if SIMULATOR else cuda.jit(fn, **gpu_options)


def gpu_available():
    """True when a real CUDA GPU can be used (never on the simulator)."""
    if SIMULATOR:
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver install means "no GPU" here
        return False


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
