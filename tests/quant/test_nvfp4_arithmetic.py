"""The NVFP4 kernels' arithmetic (``kvnumba.kernels.nvfp4``) against the reference's (``kvnumba.quant.nvfp4``), value by
value: every e2m1 code from float32 (every bfloat16 value, the neighbours of every rounding threshold, NaN and
infinities), every e2m1 code's float32, and the flushing reciprocal. Integer and
float32 operations that the GPU computes alike; the device functions run as Python on the simulator."""
import numpy as np
import pytest

from kvnumba.driver.target import SIMULATOR
from kvnumba.kernels import nvfp4 as k
from kvnumba.quant import nvfp4 as q

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the device functions run as Python on the simulator only")


def _bits(values):
    return np.asarray(values, np.float32).view(np.uint32).astype(np.int64)


def test_every_code_from_float32_is_the_references():
    every_bf16 = np.arange(1 << 16, dtype=np.uint32) << 16
    edges = _bits([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 1, 0.5, 4])
    near = np.concatenate([edges + d for d in (-1, 0, 1)])
    bits = np.concatenate([every_bf16, near, near | 0x80000000]).astype(np.int64)
    got = np.array([k.e2m1_code(int(b)) for b in bits], np.uint8)
    want = q._e2m1(bits.astype(np.uint32).view(np.float32))
    np.testing.assert_array_equal(got, want)


def test_every_code_decodes_to_its_value():
    codes = np.arange(16)
    got = np.array([k.e2m1_bits(int(c)) for c in codes], np.int64).astype(np.uint32).view(np.float32)
    want = np.where(codes & 8, -1, 1) * q.E2M1[codes & 7]
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.signbit(got[8]) and not np.signbit(got[0])  # -0 and 0


def test_the_reciprocal_flushes_as_the_reference():
    values = np.array([1, 3, 1e-30, 1e38, 3e38, 1e-39, -1e-39, 0, -0.0, np.inf, 6, 0.1], np.float32)
    got = np.array([k.rcp(int(b)) for b in _bits(values)], np.int64).astype(np.uint32)
    np.testing.assert_array_equal(got, q._rcp(values).view(np.uint32))
