"""The simulator's twin of ``kernels.memory``: loads and stores at raw integer addresses, through ctypes.

The same names as the GPU's inline-PTX intrinsics, as plain Python functions, so the kernel bodies are
identical in both worlds. Cache hints mean nothing here: ``make_loads`` returns the same pair for any
qualifier.
"""
import ctypes

__all__ = ["access", "load_i64", "load_u64", "load_u128", "make_loads", "store_u64", "store_u128"]

_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64


# int(): an address computed from a shared-memory slot is a NumPy integer, which ctypes refuses.
def load_u64(addr):
    return _u64.from_address(int(addr)).value


def store_u64(addr, value):
    _u64.from_address(int(addr)).value = value


def load_u128(addr):
    addr = int(addr)
    return (_u64.from_address(addr).value, _u64.from_address(addr + 8).value)


def store_u128(addr, pair):
    addr = int(addr)
    _u64.from_address(addr).value = pair[0]
    _u64.from_address(addr + 8).value = pair[1]


def load_i64(addr):
    return _i64.from_address(int(addr)).value


def make_loads(qualifier="nc"):
    return load_u64, load_u128


def access(ctype):
    """``(load, store)`` of one ctypes unsigned integer type at raw integer addresses; ``store`` keeps the
    value's low bits (a kernel's negative or wide integers, as the GPU's stores of that width do)."""
    mask = (1 << (8 * ctypes.sizeof(ctype))) - 1

    def load(addr):
        return ctype.from_address(int(addr)).value

    def store(addr, value):
        ctype.from_address(int(addr)).value = int(value) & mask

    return load, store
