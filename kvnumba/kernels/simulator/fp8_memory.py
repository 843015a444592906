"""The simulator's twin of ``kernels.fp8_memory``: 4- and 8-byte loads and stores at raw integer
addresses through ctypes, float32 bit casts and arithmetic through NumPy, and a warp's shuffles and votes
(a maximum, a lane's value, any) exchanged at a meeting point per simulated warp (Numba's simulator has no
warp shuffles). Each access checks its address's alignment as the GPU does (``simulator.alignment``)."""
import ctypes
import threading
from typing import Any

import numpy as np

from .alignment import access, on_fault, raise_block_fault

__all__ = ["f32_bits", "f32_div", "f32_from_bits", "f32_mul", "group_max", "lane_value", "load_i32", "store_i32",
           "store_i64", "warp_any", "warp_max"]

load_i32, store_i32 = access(ctypes.c_uint32)
store_i64 = access(ctypes.c_uint64)[1]


def f32_bits(x):
    """The bits of float32 ``x`` as a non-negative int."""
    return int(np.float32(x).view(np.uint32))


def f32_from_bits(bits):
    """The float32 (a NumPy float32, so that arithmetic on it is float32's) whose bits are ``bits``."""
    return np.uint32(int(bits) & 0xFFFFFFFF).view(np.float32)


def f32_mul(a_bits, b_bits):
    """The float32 bits of the product (inf or NaN quietly, as on the GPU)."""
    with np.errstate(all="ignore"):
        return f32_bits(f32_from_bits(a_bits) * f32_from_bits(b_bits))


def f32_div(a_bits, b_bits):
    """The float32 bits of the quotient (inf or NaN quietly, as on the GPU)."""
    with np.errstate(all="ignore"):
        return f32_bits(f32_from_bits(a_bits) / f32_from_bits(b_bits))


class _Warp:
    """One simulated warp's meeting point: a barrier of its 32 threads that gives up, instead of waiting, once
    a thread of the block has failed (the simulator's ``abort`` flag, or a fault: ``_break_warps``)."""

    __slots__ = ("cond", "values", "arrived", "generation", "broken")

    def __init__(self):
        self.cond = threading.Condition()
        self.values = [0] * 32
        self.arrived = 0
        self.generation = 0
        self.broken = False

    def meet(self, thread):
        with self.cond:
            generation = self.generation
            self.arrived += 1
            if self.arrived == 32:
                self.arrived = 0
                self.generation += 1
                self.cond.notify_all()
                return
            while self.generation == generation:
                if self.broken or getattr(thread, "abort", False):
                    raise_block_fault("a lane of the warp failed")
                self.cond.wait(0.05)


_lock = threading.Lock()


def _warps_of(thread):
    """The warps of ``thread``'s block, kept on the simulator's block manager: one launch's, never another's."""
    block = thread._manager
    warps = vars(block).get("_kvnumba_warps")
    if warps is None:
        with _lock:
            warps = vars(block).setdefault("_kvnumba_warps", {})
    return warps


@on_fault
def _break_warps(thread):
    """A thread faulted: its block's warps stop waiting for it."""
    block = getattr(thread, "_manager", None)
    for warp in list(vars(block).get("_kvnumba_warps", {}).values()) if block is not None else ():
        with warp.cond:
            warp.broken = True
            warp.cond.notify_all()


def _exchange(lane, value, read):
    """``read(values)`` of the 32 lanes' ``value`` s of the calling thread's warp (every lane must call it,
    as every lane of a warp takes part in a shuffle or a vote)."""
    thread: Any = threading.current_thread()  # the simulator's BlockThread
    warps = _warps_of(thread)
    key = thread.threadIdx.x >> 5
    warp = warps.get(key)
    if warp is None:
        with _lock:
            warp = warps.setdefault(key, _Warp())
    warp.values[lane] = value
    warp.meet(thread)
    result = read(warp.values)
    warp.meet(thread)  # every lane has read before any lane writes again
    return result


def warp_max(lane, value):
    """The largest ``value`` over the 32 lanes of the calling thread's warp (every lane must call it)."""
    return _exchange(lane, value, max)


def group_max(lane, value, width):
    """The largest ``value`` over the aligned group of ``width`` lanes (a power of two) holding ``lane``."""
    first = lane & ~(width - 1)
    return _exchange(lane, value, lambda values: max(values[first:first + width]))


def lane_value(lane, value, source):
    """``value`` of lane ``source`` (each lane names its own)."""
    return _exchange(lane, value, lambda values: values[source])


def warp_any(lane, flag):
    """Whether ``flag`` holds in any lane of the warp."""
    return _exchange(lane, bool(flag), any)
