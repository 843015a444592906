"""The NVFP4 codec's NumPy reference (``kvnumba.quant.nvfp4``): values on e2m1's grid, the ties vLLM's
``round_to_nearest_e2m1`` documents, zero, NaN and infinite blocks, the global scale, the page regions in both
orders against the offsets vLLM's kernel computes, and bad input named. Pure NumPy."""
import ml_dtypes
import numpy as np
import pytest

from kvnumba.quant import NVFP4, ScaleHome
from kvnumba.quant import nvfp4 as q

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def bf16(values):
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16)


def test_the_codec_says_where_its_scales_live_and_how_big_a_head_is():
    assert NVFP4.scales is ScaleHome.PAGE and NVFP4.group == 16 and NVFP4.code_bits == 4
    assert NVFP4.code_bytes(128) == 64 and NVFP4.scale_count(128) == 8
    assert q.full_dim(128) == 72 and q.head_dim_of(72) == 128 and q.full_dim(64) == 36
    with pytest.raises(ValueError, match="D/2 \\+ D/16 bytes"):
        q.head_dim_of(70)


def test_values_on_the_grid_keep_their_codes_in_pack_fp4s_nibble_order():
    x = bf16(GRID + [-v for v in GRID])  # vmax 6: the block scale is 1.0 (e4m3 0x38)
    data, scales = q.quantise(x)
    assert scales.tolist() == [0x38]
    # element 2j in the low nibble of byte j; codes 0..7 then their negatives 8..15 (-0 is 0x8)
    assert data.tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    back = q.dequantise(data, scales)
    assert np.array_equal(back.view(np.uint16), x.view(np.uint16))


def test_ties_round_to_even_as_vllm_documents():
    x = bf16([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6] + [0] * 8)
    data, _ = q.quantise(x)
    codes = np.stack([data & 0xF, data >> 4], -1).reshape(-1)[:8]
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 7]  # 0, 1, 1, 2, 2, 4, 4, 6


def test_zero_nan_and_infinite_blocks():
    zeros = bf16([0, -0.0] * 8)
    data, scales = q.quantise(zeros)
    assert scales.tolist() == [0] and data.tolist() == [0x80] * 8  # -0 keeps its sign
    some_nan = bf16([np.nan, 3] + [1] * 14)  # NaN does not count for the amax; its code is 7
    data, scales = q.quantise(some_nan)
    assert scales.tolist() == [0x38 - 8] and data[0] & 0xF == 7  # vmax 3: scale 0.5 (0x30)
    data, scales = q.quantise(bf16([np.nan] * 16))
    assert scales.tolist() == [0x7F] and data.tolist() == [0x77] * 8
    data, scales = q.quantise(bf16([np.inf, -np.inf] + [1] * 14))
    assert scales.tolist() == [0x7E] and data[0] == 0xF7  # 448, saturated; ±inf -> ±6
    values = q.dequantise(np.array([0x77], np.uint8).repeat(8), np.array([0x7F], np.uint8))
    assert (values.view(np.uint16) == 0x7FC0).all()  # a NaN scale: the canonical NaN


def test_round_trips_stay_within_a_step_and_follow_the_global_scale():
    rng = np.random.default_rng(0)
    x = bf16(rng.normal(size=(64, 128)) * 3)
    for scale in (0.25, 1.0, 3.0):
        data, scales = q.quantise(x, scale)
        y = q.dequantise(data, scales, scale).astype(np.float32).reshape(64, 8, 16)
        wide = x.astype(np.float32).reshape(64, 8, 16)
        vmax = np.abs(wide).max(-1, keepdims=True)
        assert (np.abs(y - wide) <= vmax * (1 / 6 + 1 / 16) + 1e-6).all()
    exact = bf16(GRID * 2)
    for scale in (0.5, 2.0):  # the global scale divides in and multiplies out
        assert np.array_equal(q.dequantise(*q.quantise(exact, scale), scale).view(np.uint16), exact.view(np.uint16))


def test_float16_and_bit_patterns():
    x = np.asarray(GRID * 2, np.float16)
    assert np.array_equal(q.quantise(x)[0], q.quantise(bf16(GRID * 2))[0])
    assert q.dequantise(*q.quantise(x), dtype="float16").dtype == np.float16
    bits = bf16(GRID * 2).view(np.uint16)
    assert np.array_equal(q.quantise(bits, dtype="bfloat16")[0], q.quantise(bf16(GRID * 2))[0])


@pytest.mark.parametrize("layout", q.LAYOUTS)
def test_regions_are_vllms_page_regions(layout):
    blocks, block, heads, d = 3, 4, 2, 64
    full = q.full_dim(d)
    page = 2 * block * heads * full
    cache = np.arange(blocks * page, dtype=np.int64).astype(np.uint8).reshape(blocks, 2, block, heads, full)
    flat = cache.reshape(-1)
    data, scales = q.regions(cache, heads, block, d, layout)
    for p, kind, t, h in [(0, 0, 0, 0), (1, 1, 3, 1), (2, 0, 2, 1), (2, 1, 1, 0)]:
        slot = t * heads + h if layout == "NHD" else h * block + t
        side = p * page + kind * page // 2  # [K_data | K_scale | V_data | V_scale]
        assert np.array_equal(data[p, kind, t, h], flat[side + slot * d // 2:][:d // 2])
        assert np.array_equal(scales[p, kind, t, h], flat[side + heads * block * d // 2 + slot * d // 16:][:d // 16])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="multiple of 16"):
        q.quantise(bf16([1.0] * 8))
    with pytest.raises(ValueError, match="global_scale must be a finite"):
        q.quantise(bf16([1.0] * 16), 0.0)
    with pytest.raises(TypeError, match="x must be bfloat16 or float16"):
        q.quantise(np.ones(16, np.float32))
    with pytest.raises(TypeError, match="data must be uint8"):
        q.dequantise(np.zeros(8, np.int8), np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="do not fit"):
        q.dequantise(np.zeros(8, np.uint8), np.zeros(2, np.uint8))
