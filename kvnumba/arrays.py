"""What users pass, reduced to what a kernel needs: an address, a size, and where it lives.

Accepted without importing any of them (torch and CuPy stay optional):
- torch tensors (CUDA, or CPU: pinned for the GPU to read them),
- anything with ``__cuda_array_interface__`` (CuPy arrays, Numba device arrays),
- NumPy arrays (on a GPU: host memory, pinned with ``numba.cuda.pinned_array`` or registered;
  on the simulator: stand-ins for device and host memory alike, as are the simulator's own
  ``numba.cuda.to_device`` arrays).
Every buffer must be C-contiguous: kernels address it as raw bytes.
"""
import math
from typing import NamedTuple

import numpy as np

from .driver.target import SIMULATOR


class ArrayInfo(NamedTuple):
    """One array as kvnumba sees it."""

    ptr: int  # address of the first byte (a device or unified address)
    nbytes: int
    shape: tuple
    dtype: str  # NumPy-style name: "int64", "uint64", "bfloat16", ...
    on_device: bool  # GPU memory (always True on the simulator)
    is_torch: bool
    obj: object  # the caller's object, kept alive while it is in use


_new = tuple.__new__


def _new_info(fields):
    """Build an ArrayInfo without NamedTuple's Python-level constructor (this is the hot path)."""
    return _new(ArrayInfo, fields)


def _is_torch_type(kind):
    return kind.__module__.startswith("torch") and hasattr(kind, "data_ptr")


# Every call describes several arrays, so this is the hot path of an entry point's host time:
# dtype names are looked up in dicts filled on first sight rather than recomputed.
_torch_dtype_names = {}
_typestr_dtypes = {}


def _torch_info(t, name, _names=_torch_dtype_names):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    torch_dtype = t.dtype
    dtype = _names.get(torch_dtype)
    if dtype is None:
        dtype = _names[torch_dtype] = str(torch_dtype).removeprefix("torch.")
    return _new(ArrayInfo, (t.data_ptr(), t.nbytes, t.shape, dtype, t.is_cuda or SIMULATOR, True, t))


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _cai_info(obj, name):
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    known = _typestr_dtypes.get(typestr)
    if known is None:
        dtype = np.dtype(typestr)
        known = _typestr_dtypes[typestr] = (dtype.name, dtype.itemsize)
    dtype, itemsize = known
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, itemsize) and max(shape, default=0) > 1:
        raise ValueError(f"{name} must be C-contiguous, got strides {tuple(strides)} for shape {shape}")
    return _new_info((cai["data"][0] or 0, math.prod(shape) * itemsize, shape, dtype, True, False, obj))


def _numpy_info(a, name):
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    ptr = a.__array_interface__["data"][0]
    return _new_info((ptr, a.nbytes, a.shape, a.dtype.name, SIMULATOR, False, a))


_describe_by_type = {}  # type -> describing function, found on the first array of each type


def _simulated_device_info(obj, name):
    """Numba's simulated device arrays (``cuda.to_device`` etc. on the simulator) wrap a NumPy array."""
    return _numpy_info(obj._ary, name)._replace(obj=obj)


def _describer(kind):
    if SIMULATOR and kind.__name__ == "FakeCUDAArray" and kind.__module__.startswith("numba"):
        return _simulated_device_info
    if _is_torch_type(kind):
        return _torch_info
    if issubclass(kind, np.ndarray):  # before CAI: Numba's mapped arrays are ndarrays too
        return _numpy_info
    if hasattr(kind, "__cuda_array_interface__"):
        return _cai_info
    return None


def array_info(obj, name):
    """Describe ``obj`` or raise ``TypeError`` naming the argument ``name``."""
    kind = type(obj)
    describe = _describe_by_type.get(kind)
    if describe is None:
        describe = _describer(kind)
        if describe is None and hasattr(obj, "__cuda_array_interface__"):  # set on the instance: no caching
            return _cai_info(obj, name)
        if describe is None:
            raise TypeError(
                f"{name} must be an array (torch tensor, CuPy or Numba device array, NumPy array), "
                f"got {kind.__name__}"
            )
        _describe_by_type[kind] = describe
    return describe(obj, name)
