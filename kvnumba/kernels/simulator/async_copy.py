"""The simulator's twin of ``kernels.async_copy``: a copy lands at once, so committing, waiting and arriving
when the copies land do nothing."""
import ctypes

from .alignment import check_aligned

__all__ = ["commit", "copy4", "copy8", "landed_arrive", "load_shared_i64", "store_shared_i64", "waiter"]


def copy4(shared, address):
    value = ctypes.c_uint32.from_address(check_aligned(address, 4, "cp.async 4 (global)")).value
    ctypes.c_uint32.from_address(check_aligned(shared, 4, "cp.async 4 (shared)")).value = value


def copy8(shared, address):
    value = ctypes.c_uint64.from_address(check_aligned(address, 8, "cp.async 8 (global)")).value
    ctypes.c_uint64.from_address(check_aligned(shared, 8, "cp.async 8 (shared)")).value = value


def commit(*bar):
    """Nothing to do: the copies have landed already (also ``landed_arrive(bar)`` and ``waiter(n)``'s wait)."""


landed_arrive = commit


def waiter(n):
    return commit


def load_shared_i64(shared):
    return ctypes.c_int64.from_address(check_aligned(shared, 8, "ld.shared.b64")).value


def store_shared_i64(shared, value):
    ctypes.c_int64.from_address(check_aligned(shared, 8, "st.shared.b64")).value = int(value)
