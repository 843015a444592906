"""What users pass, reduced to what a kernel needs: an address, a size, and where it lives.

Accepted without importing any of them (torch and CuPy stay optional): torch tensors (CUDA, or pinned
CPU), anything with ``__cuda_array_interface__`` (CuPy, Numba device arrays), and NumPy arrays (on a GPU:
pinned or registered host memory; on the simulator: stand-ins for any memory). Every buffer must be
C-contiguous: kernels address it as raw bytes.
"""
import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from .driver.pointers import HOST  # ArrayInfo.device of host memory (-1)
from .driver.target import SIMULATOR


class ArrayInfo(NamedTuple):
    """One array as kvnumba sees it."""

    ptr: int  # address of the first byte (a device or unified address)
    nbytes: int
    shape: tuple
    dtype: str  # NumPy-style name: "int64", "uint64", "bfloat16", ...; ">int64" if not native order
    on_device: bool  # GPU memory (always True on the simulator)
    device: int  # the GPU that owns it (0 on the simulator), or HOST (-1)
    is_torch: bool
    writable: bool
    obj: Any  # the caller's object, kept alive while it is in use


_new = tuple.__new__


def _is_torch_type(kind):
    return kind.__module__.startswith("torch") and hasattr(kind, "data_ptr")


def is_torch(obj):
    """Whether ``obj`` is a torch tensor (without importing torch)."""
    return _is_torch_type(type(obj))


# Every call describes several arrays, so this is on the hot path of an entry point's host time:
# dtype names are looked up in dicts filled on first sight rather than recomputed.
_torch_dtype_names: dict[object, str] = {}
_typestr_dtypes: dict[str, tuple[str, int]] = {}


def _torch_info(t, name, _names=_torch_dtype_names):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    torch_dtype = t.dtype
    dtype = _names.get(torch_dtype)
    if dtype is None:
        dtype = _names[torch_dtype] = str(torch_dtype).removeprefix("torch.")
    device = 0 if SIMULATOR else t.get_device()
    return _new(ArrayInfo, (t.data_ptr(), t.nbytes, tuple(t.shape), dtype, device >= 0, device, True, True, t))


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


_dtype_names: dict[Any, str] = {}  # dtype -> its name (numpy builds dtype.name anew, slowly, on each read)


def _dtype_name(dtype):
    name = _dtype_names.get(dtype)
    if name is None:
        name = dtype.name if dtype.isnative or dtype.itemsize == 1 else f"{dtype.byteorder}{dtype.name}"
        if len(_dtype_names) < 256:
            _dtype_names[dtype] = name
    return name


def _cai_info(obj, name):
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    known = _typestr_dtypes.get(typestr)
    if known is None:
        dtype = np.dtype(typestr)
        known = _typestr_dtypes[typestr] = (_dtype_name(dtype), dtype.itemsize)
    dtype, itemsize = known
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, itemsize) and max(shape, default=0) > 1:
        raise ValueError(f"{name} must be C-contiguous, got strides {tuple(strides)} for shape {shape}")
    ptr, read_only = cai["data"]
    ptr = ptr or 0
    return _new(ArrayInfo, (ptr, math.prod(shape) * itemsize, shape, dtype, True, _device_of(obj, ptr), False,
                            not read_only, obj))


def compiled(function):
    """``function`` compiled for the CPU, cached on disk where Numba finds a directory it may write (the host
    passes: address reads here, index checks in ``checks.bounds``, copy lists in ``plan.direct_fill``)."""
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:  # no cache locator (no writable directory): compiled again in each process
        return njit(nogil=True)(function)


@compiled
def typed_address(array):
    """The address of the first element of a NumPy array whose dtype Numba types (an int64 index array), compiled:
    about 0.3 us. ``numpy_address`` takes any array."""
    return array.ctypes.data


_DIRECT, _BY_NUMPY = "direct", "numpy"
_address_ways: dict[Any, Any] = {}  # dtype -> _DIRECT, an unsigned dtype of its size to view it as, or _BY_NUMPY


def numpy_address(array: np.ndarray) -> int:
    """The address of NumPy array ``array``'s first element, read by a compiled function (about 0.3 us, where
    ``__array_interface__`` builds a dict: 1.6-1.9 us). A dtype Numba cannot type (float16, ml_dtypes' bfloat16
    and FP8) is viewed as unsigned integers of its size first; anything else (subclasses too) is read through
    NumPy."""
    if type(array) is not np.ndarray:
        return array.__array_interface__["data"][0]
    way = _address_ways.get(array.dtype)
    if way is None:
        way = _learn_address_way(array)
    if way is _DIRECT:
        return typed_address(array)
    if way is _BY_NUMPY:
        return array.__array_interface__["data"][0]
    return typed_address(array.view(way))


def _learn_address_way(array):
    size = array.dtype.itemsize
    options = [_DIRECT] + ([np.dtype(f"u{size}")] if size in (1, 2, 4, 8) else [])
    way: Any = _BY_NUMPY
    for option in options:
        try:
            form = array if option is _DIRECT else array.view(option)
            if typed_address(form) == array.__array_interface__["data"][0]:
                way = option
                break
        except Exception:  # noqa: BLE001 - Numba's typing errors (TypingError, NotImplementedError), NumPy's view
            continue
    _address_ways[array.dtype] = way
    return way


def _device_of(obj, ptr):
    """The GPU holding a ``__cuda_array_interface__`` array: CuPy says so, else the driver."""
    if SIMULATOR:
        return 0
    device = getattr(obj, "device", None)
    ordinal = getattr(device, "id", None)
    if isinstance(ordinal, int):
        return ordinal
    from .driver.devices import current_device
    from .driver.pointers import pointer_info

    if not ptr:
        return current_device()
    found = pointer_info(ptr).device
    return found if found >= 0 else current_device()


def _numpy_info(a, name):
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    ptr = numpy_address(a)
    return _new(ArrayInfo, (ptr, a.nbytes, a.shape, _dtype_name(a.dtype), SIMULATOR, 0 if SIMULATOR else HOST,
                            False, bool(a.flags.writeable), a))


def _simulated_device_info(obj, name):
    """Numba's simulated device arrays (``cuda.to_device`` etc. on the simulator) wrap a NumPy array."""
    return _numpy_info(obj._ary, name)._replace(obj=obj)


# type -> describing function, found on the first array of each type
_describe_by_type: dict[type, Callable[[Any, str], ArrayInfo]] = {}


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


def memory_of(obj):
    """``(address, bytes)`` of an array: what is compared to find that its memory moved."""
    info = array_info(obj, "buffer")
    return info.ptr, info.nbytes


WRITEABLE = operator.attrgetter("flags.writeable")  # all(map(WRITEABLE, flagged(...)))


def flagged(objects):
    """The NumPy arrays among ``objects`` (for the simulator's device arrays, the arrays they wrap): those
    whose ``flags.writeable`` may change after a plan was made (``setflags(write=False)``), so that what
    writes through a cached or prepared plan reads it again. Other arrays cannot turn read-only."""
    found = {}
    for obj in objects:
        if SIMULATOR and type(obj).__name__ == "FakeCUDAArray":
            obj = obj._ary
        if isinstance(obj, np.ndarray):
            found[id(obj)] = obj
    return tuple(found.values())


def dtype_bytes(info):
    """Bytes per element of the array ``info`` describes (from its dtype name when it has no elements)."""
    elements = math.prod(info.shape)
    if elements:
        return info.nbytes // elements
    try:
        return np.dtype(info.dtype.lstrip("<>=|")).itemsize
    except TypeError:  # a torch-only dtype of an empty array: its name ends in its bits
        return int("".join(c for c in info.dtype if c.isdigit())[:2] or 8) // 8


def shape_of(buffer, name):
    """``(shape, itemsize, dtype name)`` of an array, without asking for contiguity (a shape may be
    read off an array with no memory behind it)."""
    try:
        info = array_info(buffer, name)
        return tuple(info.shape), dtype_bytes(info), info.dtype
    except ValueError:  # not contiguous: the kernels would refuse it, but its shape is still its shape
        pass
    if type(buffer).__module__.startswith("torch") and hasattr(buffer, "element_size"):
        return tuple(buffer.shape), buffer.element_size(), str(buffer.dtype).removeprefix("torch.")
    if isinstance(buffer, np.ndarray):
        return buffer.shape, buffer.itemsize, buffer.dtype.name
    cai = getattr(buffer, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        return tuple(cai["shape"]), dtype.itemsize, dtype.name
    raise TypeError(f"{name} must be an array (torch tensor, CuPy or Numba device array, NumPy array), "
                    f"got {type(buffer).__name__}")


# --- copies where the GPU reads them ----------------------------------------------------------------------

def device_array(a: Any) -> Any:
    """A copy of ``a`` (anything ``numpy.asarray`` takes) in GPU memory: a Numba device array (a NumPy copy
    on the simulator). ``TypeError`` on a GPU for a dtype Numba's arrays cannot hold (bfloat16)."""
    a = np.ascontiguousarray(a)
    if SIMULATOR:
        return a.copy()
    from numba import cuda
    from numba.core.errors import NumbaNotImplementedError
    from numba.np.numpy_support import from_dtype

    try:
        from_dtype(a.dtype)
    except NumbaNotImplementedError:  # e.g. ml_dtypes' bfloat16: CUDA would fail deep in Numba's copy
        raise TypeError(f"device_array: a Numba GPU array cannot hold {a.dtype}; copy a view of the same "
                        f"bytes (a.view(np.uint{8 * a.dtype.itemsize})), or use torch or CuPy") from None
    return cuda.to_device(a)


def pinned(a: Any) -> Any:
    """A copy of ``a`` in pinned (page-locked) host memory, which the GPU reads and writes directly (a NumPy
    copy on the simulator, and for an empty array: CUDA cannot pin zero bytes)."""
    a = np.asarray(a)
    if SIMULATOR or a.size == 0:
        return np.array(a, copy=True)
    from numba import cuda

    out = cuda.pinned_array(a.shape, dtype=a.dtype)
    out[...] = a
    return out
