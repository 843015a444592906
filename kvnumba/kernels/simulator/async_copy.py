"""The simulator's twin of ``kernels.async_copy``: a copy lands at once (through ctypes, alignment checked as
on the GPU by ``simulator.alignment``), so committing, waiting and arriving when they land do nothing."""
import ctypes
import functools

from .alignment import check_aligned

__all__ = ["commit", "copy4", "copy8", "landed_arrive", "load_shared_i64", "store_shared_i64", "waiter"]


def copy4(shared, address):
    value = ctypes.c_uint32.from_address(check_aligned(address, 4, "cp.async 4 (global)")).value
    ctypes.c_uint32.from_address(check_aligned(shared, 4, "cp.async 4 (shared)")).value = value


def copy8(shared, address):
    value = ctypes.c_uint64.from_address(check_aligned(address, 8, "cp.async 8 (global)")).value
    ctypes.c_uint64.from_address(check_aligned(shared, 8, "cp.async 8 (shared)")).value = value


def commit():
    pass


@functools.lru_cache(maxsize=None)
def waiter(n):
    def wait():
        pass

    return wait


def landed_arrive(bar):
    pass  # the copies have landed already


def load_shared_i64(shared):
    return ctypes.c_int64.from_address(check_aligned(shared, 8, "ld.shared.b64")).value


def store_shared_i64(shared, value):
    ctypes.c_int64.from_address(check_aligned(shared, 8, "st.shared.b64")).value = int(value)
