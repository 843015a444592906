"""What the driver knows about an address (one ``cuPointerGetAttributes``): host or device memory, which
device, which allocation. ``HOST`` is the device number kvnumba gives host memory, for every module above.
"""
import functools
from typing import NamedTuple

from .bindings import check, cu

HOST = -1  # the device number of host memory: no GPU owns it
MEMORY_HOST, MEMORY_DEVICE = 1, 2  # CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE


class PointerInfo(NamedTuple):
    memory_type: int  # 0 (unknown to CUDA: pageable host memory), MEMORY_HOST (pinned) or MEMORY_DEVICE
    device: int  # ordinal of the device that owns it (-1 if unknown)
    start: int  # the allocation holding the address (0 if the driver gives no range)
    size: int


@functools.cache
def _attributes():  # the CUpointer_attribute values queried
    a = cu.CUpointer_attribute
    return [a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            a.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a.CU_POINTER_ATTRIBUTE_RANGE_SIZE]


def _query(address):
    attributes = _attributes()
    return cu.cuPointerGetAttributes(len(attributes), attributes, address)


def pointer_info(address):
    """``PointerInfo`` of ``address``; memory CUDA does not know gives memory type 0."""
    result = _query(address)
    if result[0] == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT:  # the driver wants some context current
        from numba import cuda

        cuda.current_context()
        result = _query(address)
    if result[0] == cu.CUresult.CUDA_ERROR_INVALID_VALUE:  # not an address CUDA knows
        return PointerInfo(0, -1, 0, 0)
    memory_type, device, start, size = check(result, "cuPointerGetAttributes")
    known = int(memory_type or 0)
    return PointerInfo(known, int(device) if known and device is not None else -1, int(start or 0),
                       int(size or 0))


def is_pinned_host(address):
    """True if ``address`` is page-locked host memory CUDA knows (allocated or registered)."""
    return pointer_info(address).memory_type == MEMORY_HOST


def allocation(address):
    """``(start, size, device)`` of the allocation (device, or pinned host) holding ``address``, or
    None if CUDA does not know it. Where the driver gives no range for pinned host memory, the
    extent from ``address`` is found by probing which bytes are pinned (doubling, then bisecting)."""
    info = pointer_info(address)
    if not info.memory_type:
        return None
    if info.size:
        return info.start, info.size, info.device
    return address, _pinned_extent(address), info.device


def _pinned_extent(address):
    good, step = 1, 1
    while is_pinned_host(address + 2 * step - 1) and step < 2**46:
        step *= 2
        good = step
    bad = 2 * step
    while bad - good > 1:
        mid = (good + bad) // 2
        if is_pinned_host(address + mid - 1):
            good = mid
        else:
            bad = mid
    return good
