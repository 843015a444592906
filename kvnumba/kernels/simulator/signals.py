"""The simulator's twin of ``kernels.signals``: the words through ctypes under one lock (the host may read them
while a grid runs)."""
import ctypes
import threading

from .alignment import check_aligned

__all__ = ["acquire_u32", "arrive_u32", "backoff", "fence_system", "publish_u32"]

_lock = threading.Lock()


def arrive_u32(addr):
    with _lock:
        word = ctypes.c_uint32.from_address(check_aligned(int(addr), 4, "atom.global.add.u32"))
        old = word.value
        word.value = old + 1
    return old


def publish_u32(addr, value):
    with _lock:
        word = ctypes.c_uint32.from_address(check_aligned(int(addr), 4, "red.global.max.u32"))
        word.value = max(word.value, int(value) & 0xFFFFFFFF)


def acquire_u32(addr):
    with _lock:
        return ctypes.c_uint32.from_address(check_aligned(int(addr), 4, "ld.acquire.global.u32")).value


def backoff():
    """Between two polls: nothing to wait for on the simulator (its grids run one at a time)."""


def fence_system():
    """Nothing: the simulator's stores are seen at once, in order (its words go through one lock)."""
