"""The simulator's twin of ``kernels.memory``: loads and stores through ctypes, each checked for alignment as
the GPU checks it and recorded inside ``simulator.trace.recording()``. Cache hints mean nothing here:
``make_loads`` returns the same pair for any qualifier.
"""
import ctypes

from . import trace
from .alignment import check_aligned

__all__ = ["load_i64", "load_i128", "load_u64", "load_u128", "make_loads", "store_u64", "store_u128"]

_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64


def _access(op, addr, width, name):
    """``addr``, recorded (inside ``trace.recording()``) and checked for ``width``-byte alignment."""
    if trace.ACCESSES is not None:
        trace.record(op, addr, width)
    return check_aligned(addr, width, name)


def load_u64(addr):
    return _u64.from_address(_access("ld", addr, 8, "ld.global.b64")).value


def store_u64(addr, value):
    _u64.from_address(_access("st", addr, 8, "st.global.b64")).value = value


def load_u128(addr):
    addr = _access("ld", addr, 16, "ld.global.v2.u64")
    return (_u64.from_address(addr).value, _u64.from_address(addr + 8).value)


def store_u128(addr, pair):
    addr = _access("st", addr, 16, "st.global.v2.u64")
    _u64.from_address(addr).value = pair[0]
    _u64.from_address(addr + 8).value = pair[1]


def load_i64(addr):
    return _i64.from_address(_access("ld", addr, 8, "ld.global.b64")).value


def load_i128(addr):
    addr = _access("ld", addr, 16, "ld.global.v2.b64")
    return (_i64.from_address(addr).value, _i64.from_address(addr + 8).value)


def make_loads(qualifier="nc"):
    return load_u64, load_u128

