"""The simulator's twin of ``kernels.tma``: barriers are condition variables keyed by address, and
``tensor_load`` walks a tensor map of kvnumba's own format (``plan.tensor_maps``) row by row; bulk copies land
at once. A simulated warp's threads have no ``__syncwarp``, so every thread of a consumer warp arrives
(``ARRIVALS_PER_WARP = 32``): a stage is released only once all have read it.
"""
import ctypes
import threading
from typing import Any

from .alignment import check_aligned, raise_block_fault
from .warp import exchange

__all__ = ["ARRIVALS_PER_WARP", "arrive", "arrive_expect_bytes", "ballot", "barrier_fence", "barrier_init",
           "barrier_inval", "broadcast", "bulk_commit", "bulk_store", "bulk_wait", "bulk_wait_read", "count_set",
           "expect_bytes", "first_set", "load_shared_i128", "load_shared_u128", "load_shared_u32", "release",
           "shared_address", "sync_warp", "tensor_load", "try_wait"]

ARRIVALS_PER_WARP = 32
_MAP_WORDS = 16  # the simulator's tensor map: base, 5 sizes, 4 byte strides, 5 box sizes

_barriers: dict[int, Any] = {}  # shared address -> _Barrier
_barriers_lock = threading.Lock()


class _Barrier:
    def __init__(self, count):
        self.count, self.pending, self.bytes, self.phase = count, count, 0, 0
        self.cond = threading.Condition()

    def _complete_if_done(self):
        if self.pending == 0 and self.bytes == 0:
            self.phase += 1
            self.pending = self.count
            self.cond.notify_all()


def _barrier(address):
    check_aligned(address, 8, "mbarrier")
    with _barriers_lock:
        return _barriers[address]


def shared_address(array):
    return array.ctypes.data


def barrier_init(bar, count):
    check_aligned(bar, 8, "mbarrier.init")
    with _barriers_lock:
        _barriers[bar] = _Barrier(count)


def barrier_inval(bar):
    check_aligned(bar, 8, "mbarrier.inval")
    with _barriers_lock:
        del _barriers[bar]


def arrive(bar):
    arrive_expect_bytes(bar, 0)


def arrive_expect_bytes(bar, nbytes):
    b = _barrier(bar)
    with b.cond:
        b.bytes += nbytes
        b.pending -= 1
        b._complete_if_done()


def expect_bytes(bar, nbytes):
    b = _barrier(bar)
    with b.cond:
        b.bytes += nbytes


def try_wait(bar, parity):
    if getattr(threading.current_thread(), "abort", False):  # another thread of the block failed
        raise_block_fault("the block's launch failed in another thread")
    b = _barrier(bar)
    with b.cond:
        if (b.phase & 1) == parity:  # the phase of this parity is still running
            b.cond.wait(0.01)
        return 1 if (b.phase & 1) != parity else 0


def release(bar, lane):
    arrive(bar)


def _words(address, count):
    return (ctypes.c_int64 * count).from_address(address)


def tensor_load(dst, tensor_map, c0, c1, c2, c3, c4, bar):
    dst = check_aligned(dst, 128, "cp.async.bulk.tensor's shared-memory destination")
    words = _words(check_aligned(tensor_map, 64, "cp.async.bulk.tensor's tensor map"), _MAP_WORDS)
    base, dims, strides, box = words[0], words[1:6], (8, *words[6:10]), words[10:15]
    row_bytes = box[0] * 8
    out = dst
    for i4 in range(box[4]):
        for i3 in range(box[3]):
            for i2 in range(box[2]):
                for i1 in range(box[1]):
                    at = (c0, c1 + i1, c2 + i2, c3 + i3, c4 + i4)
                    if all(0 <= a < d for a, d in zip(at[1:], dims[1:])) and c0 + box[0] <= dims[0]:
                        src = base + sum(a * s for a, s in zip(at, strides))
                        ctypes.memmove(out, src, row_bytes)
                    else:  # outside the tensor: zeros, as the hardware fills
                        ctypes.memset(out, 0, row_bytes)
                    out += row_bytes
    b = _barrier(bar)
    with b.cond:
        b.bytes -= out - dst
        b._complete_if_done()


def bulk_store(dst, src, nbytes):
    check_aligned(nbytes, 16, "cp.async.bulk's size")
    ctypes.memmove(check_aligned(dst, 16, "cp.async.bulk's destination"),
                   check_aligned(src, 16, "cp.async.bulk's source"), int(nbytes))


def _landed():
    """A fence or a wait for bulk copies: they have landed already."""


barrier_fence = bulk_commit = bulk_wait_read = bulk_wait = _landed


def load_shared_u128(addr):
    addr = check_aligned(addr, 16, "ld.shared.v2.u64")
    return (ctypes.c_uint64.from_address(addr).value, ctypes.c_uint64.from_address(addr + 8).value)


def load_shared_i128(addr):
    addr = check_aligned(addr, 16, "ld.shared.v2.s64")
    return (ctypes.c_int64.from_address(addr).value, ctypes.c_int64.from_address(addr + 8).value)


def load_shared_u32(addr):
    return ctypes.c_uint32.from_address(check_aligned(addr, 4, "ld.shared.u32")).value


def ballot(predicate):
    return sum(1 << i for i, bit in enumerate(exchange(bool(predicate))) if bit)


def sync_warp():
    exchange(0)


def broadcast(value):
    return exchange(int(value))[0]


def first_set(mask):
    mask = int(mask) & 0xFFFFFFFF
    return (mask & -mask).bit_length()


def count_set(mask):
    return bin(int(mask) & 0xFFFFFFFF).count("1")
