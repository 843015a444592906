"""The kernels' FP8 arithmetic (kvnumba.kernels.fp8) against the reference (kvnumba.quant.fp8, ml_dtypes)
exhaustively: every code decodes, every bfloat16 and float16 value quantises under several scales, every code
dequantises under several scales. The device functions run as the Python functions they are on the simulator
(on a GPU, their ``py_func`` cannot run: the bit casts are GPU intrinsics, so these tests are skipped there;
the kernel tests cover the compiled functions)."""
import ml_dtypes
import numpy as np
import pytest

from kvnumba import quant_reference as qr
from kvnumba.quant import fp8 as codec
from kvnumba.driver.target import SIMULATOR
from kvnumba.kernels import fp8

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the device functions run as Python on the simulator only")

FMTS = ["e4m3", "e5m2"]
DTYPES = ["bfloat16", "float16"]
ALL_CODES = np.arange(256, dtype=np.uint8)
ALL_16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def f32_bits(values):
    return np.asarray(values, np.float32).view(np.uint32).astype(np.int64)


@pytest.mark.parametrize("fmt", FMTS)
def test_every_code_decodes(fmt):
    f = codec.fp8_format(fmt)
    want = ALL_CODES.view(f.dtype).astype(np.float32)
    widen = fp8.widen(fmt)
    got = np.array([widen(int(c)) for c in ALL_CODES], np.int64).astype(np.uint32).view(np.float32)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_every_float16_widens_and_narrows_back():
    widen, narrow = fp8.widen("float16"), fp8.narrow("float16")
    values = ALL_16.view(np.float16)
    finite = np.isfinite(values)
    got = np.array([widen(int(b)) for b in ALL_16], np.int64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(got[finite], values[finite].astype(np.float32))
    back = np.array([narrow(int(u)) for u in got[finite].view(np.uint32)], np.int64)
    np.testing.assert_array_equal(back, ALL_16[finite])


@pytest.mark.parametrize("target", ["e4m3", "e5m2", "float16", "bfloat16"])
def test_narrowing_float32_rounds_to_nearest_even(target):
    """float32 values around every representable value and halfway point of the target, and random ones."""
    rng = np.random.default_rng(1)
    if target == "bfloat16":
        grid = ALL_16.view(ml_dtypes.bfloat16).astype(np.float32)
    elif target == "float16":
        grid = ALL_16.view(np.float16).astype(np.float32)
    else:
        grid = ALL_CODES.view(codec.fp8_format(target).dtype).astype(np.float32)
    grid = np.sort(grid[np.isfinite(grid)])
    mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2
    near = np.concatenate([grid, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(mids.astype(np.float32), np.float32(-np.inf))]).astype(np.float32)
    rand = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([near, rand[np.isfinite(rand)]])
    if target == "bfloat16":
        want = values.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
        function = fp8.bf16_from_f32
    elif target == "float16":
        with np.errstate(over="ignore"):
            want = values.astype(np.float16).view(np.uint16).astype(np.int64)
        function = fp8.narrow("float16")
    else:
        f = codec.fp8_format(target)
        want = np.clip(values, -f.max_value, f.max_value).astype(f.dtype).view(np.uint8).astype(np.int64)
        function = fp8.narrow(target)
    got = np.array([function(int(u)) for u in values.view(np.uint32)], np.int64)
    bad = np.flatnonzero(got != want)
    assert not len(bad), f"{values[bad[:5]]}: got {got[bad[:5]]}, want {want[bad[:5]]}"


SCALES = [1.0, 0.0107421875, 3.1e-5, 117.3, 1e-38, 1e-40, 0.0]  # 1e-40: its inverse overflows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_every_16_bit_value_quantises_as_the_reference(fmt, dtype):
    """Every bfloat16 (float16) bit pattern, quantised with each of a few scales (a zero scale too, and
    one whose inverse overflows, so the format divides), against the code the format's rule gives; the
    reference's scale of a head against scale_of."""
    magnitude, scale_of, inverse_of, quantise = fp8.quantiser(fmt, dtype)
    f = codec.fp8_format(fmt)
    values = ALL_16.view(codec.PLAIN_DTYPES[dtype])
    for scale in SCALES:
        s = np.float32(scale)
        with np.errstate(all="ignore"):
            wide = values.astype(np.float32)
            inverse = np.float32(1) / s if s else np.float32(0)
            finite = np.where(np.isfinite(wide), wide, 0).astype(np.float32)
            scaled = finite * inverse if np.isfinite(inverse) and s else finite / (s if s else np.float32(1))
            quotient = np.clip(scaled, -f.max_value, f.max_value).astype(np.float32)
        want = quotient.astype(f.dtype).view(np.uint8).copy()
        if s == 0:
            want[:] = 0
        sign = (ALL_16 >> 15).astype(np.uint8) << 7
        want = np.where(np.isinf(wide), sign | f.max_code, want)
        want = np.where(np.isnan(wide), sign | f.nan_code, want)
        sbits = int(f32_bits(s))
        with np.errstate(all="ignore"):  # scales no head has: quotients overflow to inf, which saturates
            ibits = inverse_of(sbits)
            got = np.array([quantise(int(b), sbits, ibits) for b in ALL_16], np.int64)
        assert ibits == (0 if not s or not np.isfinite(inverse) else int(f32_bits(inverse)))
        bad = np.flatnonzero(got != want)
        assert not len(bad), f"scale {scale}: bits {ALL_16[bad[:5]]}: got {got[bad[:5]]}, want {want[bad[:5]]}"
    # the scale of a head whose amax is each finite positive value
    positive = ALL_16[(ALL_16 < 0x8000)]
    positive = positive[np.isfinite(positive.view(codec.PLAIN_DTYPES[dtype]))]
    _, want_scales = qr.quantise(positive.view(codec.PLAIN_DTYPES[dtype])[:, None], fmt)
    got = np.array([scale_of(magnitude(int(b))) for b in positive], np.int64)
    np.testing.assert_array_equal(got, f32_bits(want_scales[:, 0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_every_code_dequantises_as_the_reference(fmt, dtype):
    dequantise = fp8.dequantiser(fmt, dtype)
    for scale in SCALES + [np.inf, 3.4e38, 1e-45]:
        want = qr.dequantise(ALL_CODES[:, None], np.full((256, 1), scale, np.float32), dtype, fmt)
        sbits = int(f32_bits(np.float32(scale)))
        with np.errstate(all="ignore"):  # scales no head has: products overflow
            got = np.array([dequantise(int(c), sbits) for c in ALL_CODES], np.int64)
        np.testing.assert_array_equal(got, want.view(np.uint16)[:, 0].astype(np.int64), err_msg=f"scale {scale}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_reference_round_trip_is_close(fmt, dtype):
    """The format does what it is for: values come back within FP8's precision of their head's amax."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 4, 128)).astype(np.float32)
    x[3] = 0
    x = x.astype(codec.PLAIN_DTYPES[dtype])
    codes, scales = qr.quantise(x, fmt)
    y = qr.dequantise(codes, scales, dtype, fmt).astype(np.float32)
    amax = np.abs(x.astype(np.float32)).max(axis=-1, keepdims=True)
    tolerance = 2.0 ** -(codec.fp8_format(fmt).mantissa_bits) * amax + 1e-30
    assert (np.abs(y - x.astype(np.float32)) <= tolerance).all()
    assert (y[3] == 0).all() and (scales[3] == 0).all()
