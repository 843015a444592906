"""What users pass, reduced to what a kernel needs: an address, a size, and where it lives.

Accepted without importing any of them (torch and CuPy stay optional):
- torch tensors (CUDA, or CPU: pinned for the GPU to read them),
- anything with ``__cuda_array_interface__`` (CuPy arrays, Numba device arrays),
- NumPy arrays (on a GPU: host memory, pinned with ``numba.cuda.pinned_array`` or registered;
  on the simulator: stand-ins for device and host memory alike).
Every buffer must be C-contiguous: kernels address it as raw bytes.
"""
from typing import NamedTuple

import numpy as np

from ._target import SIMULATOR


class ArrayInfo(NamedTuple):
    """One array as kvnumba sees it."""

    ptr: int  # address of the first byte (a device or unified address)
    nbytes: int
    shape: tuple
    dtype: str  # NumPy-style name: "int64", "uint64", "bfloat16", ...
    on_device: bool  # GPU memory (always True on the simulator)
    is_torch: bool
    obj: object  # the caller's object, kept alive while it is in use


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _torch_info(t, name):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    dtype = str(t.dtype).removeprefix("torch.")
    return ArrayInfo(t.data_ptr(), t.numel() * t.element_size(), tuple(t.shape), dtype,
                     bool(t.is_cuda) or SIMULATOR, True, t)


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _cai_info(obj, name):
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and any(n > 1 for n in shape) and tuple(strides) != _contiguous_strides(shape, dtype.itemsize):
        raise ValueError(f"{name} must be C-contiguous, got strides {tuple(strides)} for shape {shape}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return ArrayInfo(int(cai["data"][0] or 0), nbytes, shape, dtype.name, True, False, obj)


def _numpy_info(a, name):
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    ptr = a.__array_interface__["data"][0]
    return ArrayInfo(ptr, a.nbytes, a.shape, a.dtype.name, SIMULATOR, False, a)


def array_info(obj, name):
    """Describe ``obj`` or raise ``TypeError`` naming the argument ``name``."""
    if _is_torch(obj):
        return _torch_info(obj, name)
    if isinstance(obj, np.ndarray):  # before CAI: Numba's mapped arrays are ndarrays too
        return _numpy_info(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_info(obj, name)
    raise TypeError(
        f"{name} must be an array (torch tensor, CuPy or Numba device array, NumPy array), "
        f"got {type(obj).__name__}"
    )
