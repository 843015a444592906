"""``arrays.numpy_address``: the address plans are looked up by (``plan.cache``), a view's fingerprint and an
array's description are read with. It must be NumPy's own for every array, whichever way it takes: compiled
(dtypes Numba types), compiled through a view of the same item size (float16, bfloat16, FP8), or NumPy's
``__array_interface__`` (anything else, and subclasses)."""
import tempfile

import ml_dtypes
import numpy as np
import pytest

from kvnumba.arrays import numpy_address


class Subclass(np.ndarray):
    pass


def _arrays():
    base = np.arange(4 * 6 * 8, dtype=np.uint8).reshape(4, 6, 8)
    yield "uint8", base
    yield "a strided view", base[1:, ::2, 3:]
    yield "a transposed view", base.T
    yield "int64", np.zeros(5, np.int64)[2:]
    yield "float16", np.zeros((3, 4), np.float16)[1:]
    yield "bfloat16", np.zeros((3, 4), ml_dtypes.bfloat16)[:, 1:]
    yield "float8_e4m3fn", np.zeros((3, 4), ml_dtypes.float8_e4m3fn)[2:]
    yield "big-endian int32", np.zeros(6, ">i4")[1:]
    yield "a structured dtype", np.zeros(4, [("a", np.int8), ("b", np.int16)])[1:]
    yield "3-byte void", np.zeros(4, "V3")[1:]
    yield "object", np.zeros(4, object)[1:]
    yield "empty", np.zeros(0, np.float32)
    yield "a subclass", np.zeros(8, np.uint8).view(Subclass)[2:]
    yield "read-only", np.frombuffer(bytes(16), np.uint16)[3:]


@pytest.mark.parametrize("name,array", list(_arrays()), ids=[name for name, _ in _arrays()])
def test_the_address_is_numpys(name, array):
    for _ in range(2):  # the first call finds the dtype's way, the second takes it
        assert numpy_address(array) == array.__array_interface__["data"][0]


def test_a_memory_map():
    with tempfile.NamedTemporaryFile() as file:
        mapped = np.memmap(file.name, dtype=ml_dtypes.bfloat16, mode="w+", shape=(64,))
        for array in (mapped, mapped[7:], np.asarray(mapped)[9:]):
            assert numpy_address(array) == array.__array_interface__["data"][0]
        del mapped
