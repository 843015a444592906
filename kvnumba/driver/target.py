"""Which world kvnumba runs in, decided once at import: a real GPU or Numba's CUDA simulator.

Everything that differs between the two (memory primitives, launching, what an array's address
means) branches on ``SIMULATOR`` at import time, so kernel bodies never branch on it.
"""
try:  # numba-cuda keeps its own copy of the config; older numba kept it in numba.config
    from numba.cuda.core import config as _config
except ImportError:  # pragma: no cover
    from numba import config as _config

SIMULATOR = bool(_config.ENABLE_CUDASIM)


def gpu_available():
    """True when a real CUDA GPU can be used (never on the simulator)."""
    if SIMULATOR:
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver install means "no GPU" here
        return False
