"""Helpers for code that must run on a GPU and on Numba's CUDA simulator alike: tests, notebooks, examples.

``device_array(a)`` and ``pinned(a)`` copy NumPy array ``a`` to GPU memory and to pinned host memory (on
the simulator both are NumPy copies); ``to_numpy(x)`` brings any of them back, once the GPU is done.
``requires_gpu`` marks a pytest test, class or module that needs a real GPU: skipped, with the reason,
where there is none, decided when the test runs (collecting never touches CUDA; pytest is needed only here).

>>> dst = device_array(np.zeros((16, 64), np.uint8))              # doctest: +SKIP
>>> kv.transfer_kv_per_layer_mla(src, dst, idx, idx, item_size=64)  # doctest: +SKIP
>>> to_numpy(dst)                                                  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np

from .arrays import device_array, pinned
from .driver.devices import device_count
from .driver.target import CHOICE, SIMULATOR, gpu_available

__all__ = ["ON_SIMULATOR", "device_array", "gpu_count", "gpu_skip_reason", "pinned", "requires_gpu", "synchronize",
           "to_numpy", "where"]

ON_SIMULATOR = SIMULATOR
_ON_THE_SIMULATOR = f"needs a real CUDA GPU (kvnumba runs on Numba's CUDA simulator: {CHOICE.reason})"


def where() -> str:
    """What kernels run on here, in words: ``"the GPU, <its name>"`` or ``"Numba's CUDA simulator (<why>)"``."""
    if SIMULATOR:
        return f"Numba's CUDA simulator ({CHOICE.reason})"
    try:
        from numba import cuda

        name = cuda.get_current_device().name
        return f"the GPU, {name.decode() if isinstance(name, bytes) else name}"
    except Exception as exc:  # noqa: BLE001 - words for a notebook's first line, never a failure
        return f"the GPU target ({type(exc).__name__}: {exc})"


def synchronize() -> None:
    """Wait for the GPU's work (nothing to wait for on the simulator)."""
    if not SIMULATOR:
        from numba import cuda

        cuda.synchronize()


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of any array kvnumba takes (Numba device array, torch tensor, CuPy array, NumPy), once the
    GPU's work is done."""
    synchronize()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    module = type(x).__module__
    if module.startswith("torch"):
        return x.detach().cpu().numpy()
    if module.startswith("cupy"):
        return x.get()
    return np.array(x, copy=True)


def gpu_skip_reason() -> str | None:
    """Why a test that needs a real GPU cannot run here, or None when it can (this initialises CUDA)."""
    if SIMULATOR:
        return _ON_THE_SIMULATOR
    if CHOICE.refusal is not None:
        return f"needs a real CUDA GPU ({CHOICE.refusal})"
    if not gpu_available():
        return "needs a real CUDA GPU (a CUDA driver, but no usable device)"
    return None


def gpu_count() -> int:
    """How many CUDA GPUs can be used (0 on the simulator or without one)."""
    return 0 if gpu_skip_reason() is not None else device_count()


class _NoGpu:
    """True where there is no real GPU; asked when a marked test is set up (pytest evaluates a ``skipif``
    condition then), not when this module is imported."""

    def __bool__(self) -> bool:
        return gpu_skip_reason() is not None

    def __repr__(self) -> str:
        return "no real CUDA GPU"


def __getattr__(name: str) -> Any:
    if name == "requires_gpu":  # pytest only for this one
        import pytest

        reason = _ON_THE_SIMULATOR if SIMULATOR else "needs a real CUDA GPU (none usable here)"  # no CUDA asked yet
        return pytest.mark.skipif(cast(bool, _NoGpu()), reason=reason)
    raise AttributeError(f"module 'kvnumba.testing' has no attribute {name!r}")
