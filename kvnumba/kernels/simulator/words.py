"""The simulator's twin of ``kernels.words``: 4- and 8-byte loads and stores at raw integer
addresses through ctypes, float32 bit casts and arithmetic through NumPy, and a warp's shuffles and votes
(a group's maximum, a lane's value, any) exchanged through ``simulator.warp`` (Numba's simulator has no warp
shuffles). Each access checks its address's alignment as the GPU does (``simulator.alignment``)."""
import ctypes

import numpy as np

from .alignment import access, check_aligned
from .warp import exchange

__all__ = ["f32_bits", "f32_div", "f32_from_bits", "f32_mul", "group_max", "lane_value", "load_i32", "store_i32",
           "store_i64", "store_i128", "warp_any"]

load_i32, store_i32 = access(ctypes.c_uint32)
store_i64 = access(ctypes.c_uint64)[1]


def store_i128(addr, low, high):
    """16 bytes at a 16-byte aligned ``addr``: ``low``'s 8, then ``high``'s."""
    addr = check_aligned(addr, 16, "st.global.v2.b64")
    ctypes.c_uint64.from_address(addr).value = int(low) & 0xFFFFFFFFFFFFFFFF
    ctypes.c_uint64.from_address(addr + 8).value = int(high) & 0xFFFFFFFFFFFFFFFF


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


def group_max(lane, value, width):
    """The largest ``value`` over the aligned group of ``width`` lanes (a power of two) holding ``lane``."""
    first = lane & ~(width - 1)
    return max(exchange(value)[first:first + width])


def lane_value(lane, value, source):
    """``value`` of lane ``source`` (each lane names its own)."""
    return exchange(value)[source]


def warp_any(lane, flag):
    """Whether ``flag`` holds in any lane of the warp."""
    return any(exchange(bool(flag)))
