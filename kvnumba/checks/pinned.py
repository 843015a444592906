"""Is a host buffer page-locked (pinned)? A kernel reads and writes host memory through unified
addressing, which only works for pinned memory: given a pageable buffer it faults with an illegal
address, and the CUDA context is lost. ``require`` turns that into a ``PageableMemoryError``.

- torch CPU tensors: ``tensor.is_pinned()``; a positive answer is remembered per tensor object
  (a tensor's storage cannot be un-pinned through torch), so a reused pool tensor costs a dict lookup.
- NumPy arrays on a GPU: the driver's ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)`` at
  the first and the last byte (pageable memory answers ``CUDA_ERROR_INVALID_VALUE``), through ctypes:
  two calls of a few hundred nanoseconds. Not remembered: ``numba.cuda.pinned(arr)`` registers memory
  only for the duration of its ``with`` block.
- On the simulator there is nothing to check: NumPy arrays stand for every kind of memory.

``address_range`` (for raw layer tables, ``kvnumba.checks.guard``) asks the driver for the allocation that
holds an address.
"""
import ctypes
import threading
import weakref

from ..driver.target import SIMULATOR
from ..errors import BadAddressError, PageableMemoryError

_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
_CU_MEMORYTYPE_HOST = 1
_CUDA_ERROR_INVALID_CONTEXT = 201

HOW_TO_PIN = ("pin it: torch `tensor.pin_memory()`; NumPy `numba.cuda.pinned_array(shape, dtype)` (or "
              "`numba.cuda.mapped_array`), or register an existing array for the call with "
              "`with numba.cuda.pinned(arr):` (cudaHostRegister)")

_lock = threading.Lock()
_driver = None
_pinned_tensors = {}  # id(tensor) -> weakref: tensors seen pinned


def _libcuda():
    global _driver
    with _lock:
        if _driver is None:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuPointerGetAttribute
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            fn.restype = ctypes.c_int
            _driver = lib
    return _driver


def _attribute(attribute, address, ctype):
    """``cuPointerGetAttribute``: (CUresult, value); makes a context current if none is."""
    lib = _libcuda()
    value = ctype()
    err = lib.cuPointerGetAttribute(ctypes.byref(value), attribute, address)
    if err == _CUDA_ERROR_INVALID_CONTEXT:
        from numba import cuda

        cuda.current_context()
        err = lib.cuPointerGetAttribute(ctypes.byref(value), attribute, address)
    return err, value.value


def is_pinned_address(address):
    """True if the driver knows ``address`` as page-locked host memory (allocated or registered)."""
    err, kind = _attribute(_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address, ctypes.c_uint)
    return err == 0 and kind == _CU_MEMORYTYPE_HOST


def _torch_pinned(tensor):
    ref = _pinned_tensors.get(id(tensor))
    if ref is not None and ref() is tensor:
        return True
    if not tensor.is_pinned():
        return False
    if len(_pinned_tensors) > 4096:
        _pinned_tensors.clear()
    _pinned_tensors[id(tensor)] = weakref.ref(tensor)
    return True


def require(name, info):
    """Raise ``PageableMemoryError`` if ``info`` (an ``ArrayInfo``) is host memory a GPU cannot reach."""
    if info.on_device or SIMULATOR or info.nbytes == 0:
        return
    if info.is_torch:
        pinned = _torch_pinned(info.obj)
    else:
        pinned = is_pinned_address(info.ptr) and is_pinned_address(info.ptr + info.nbytes - 1)
    if not pinned:
        kind = "a CPU torch tensor" if info.is_torch else "a NumPy array"
        raise PageableMemoryError(
            f"{name} is {kind} in pageable host memory: a GPU kernel cannot read or write it (it would "
            f"fault with an illegal address); {HOW_TO_PIN}")


def address_range(name, address):
    """``(start, size)`` of the allocation (device, or pinned host) holding ``address``, from the driver.

    Where the driver gives no range for pinned host memory, the extent is found by probing which
    bytes are pinned (a galloping search); raises ``BadAddressError`` naming ``name`` if the driver
    does not know the address at all.
    """
    err, start = _attribute(_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address, ctypes.c_uint64)
    err2, size = _attribute(_CU_POINTER_ATTRIBUTE_RANGE_SIZE, address, ctypes.c_uint64)
    if not (err or err2) and size:
        return start, size
    if is_pinned_address(address):
        return address, _pinned_extent(address)
    raise BadAddressError(f"{name} = 0x{address:x} is not in any allocation CUDA knows (device memory or "
                          f"pinned host memory; cuPointerGetAttribute answered {err or err2})")


def _pinned_extent(address):
    """Bytes from ``address`` that are pinned: the largest n with ``address + n - 1`` pinned, by
    doubling then bisecting (assumes the pinned bytes are contiguous, as one allocation's are)."""
    good, step = 1, 1
    while is_pinned_address(address + 2 * step - 1) and step < 2**46:
        step *= 2
        good = step
    bad = 2 * step
    while bad - good > 1:
        mid = (good + bad) // 2
        if is_pinned_address(address + mid - 1):
            good = mid
        else:
            bad = mid
    return good
