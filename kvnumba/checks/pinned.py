"""Is a host buffer page-locked (pinned)? A kernel reaches host memory through unified addressing, which
works only for pinned memory: given a pageable buffer it faults and the CUDA context is lost, so
``require`` raises ``PageableMemoryError`` first. Torch CPU tensors answer ``is_pinned()``; NumPy arrays
on a GPU are asked of the driver at their first and last byte (``driver.pointers``; nothing is remembered:
``numba.cuda.pinned`` registers memory only for its ``with`` block). On the simulator nothing is checked.
"""
from ..driver.target import SIMULATOR
from ..errors import PageableMemoryError

HOW_TO_PIN = ("pin it: torch `tensor.pin_memory()`; NumPy `numba.cuda.pinned_array(shape, dtype)` (or "
              "`numba.cuda.mapped_array`), or register an existing array for the call with "
              "`with numba.cuda.pinned(arr):` (cudaHostRegister)")


def require(name, info):
    """Raise ``PageableMemoryError`` if ``info`` (an ``ArrayInfo``) is host memory a GPU cannot reach."""
    if info.on_device or SIMULATOR or info.nbytes == 0:
        return
    if info.is_torch:
        pinned = info.obj.is_pinned()
    else:
        from ..driver.pointers import is_pinned_host

        pinned = is_pinned_host(info.ptr) and is_pinned_host(info.ptr + info.nbytes - 1)
    if not pinned:
        kind = "a CPU torch tensor" if info.is_torch else "a NumPy array"
        raise PageableMemoryError(
            f"{name} is {kind} in pageable host memory: a GPU kernel cannot read or write it (it would "
            f"fault with an illegal address); {HOW_TO_PIN}")
