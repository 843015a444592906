"""kv.copy with FP8 views: every built-in layout pair quantising (bfloat16/float16 view -> FP8 view) and
dequantising (FP8 -> plain), FP8 -> FP8 copies, MLA, head counts and sizes, against
kvnumba.quant_reference.copy byte for byte with destinations poisoned (untouched bytes must stay). Launches
are small: the simulator runs a Python thread per CUDA thread."""
import ml_dtypes
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from tests.helpers.view_cases import assert_same_bytes
from tests.fp8.cases import (FP8_LAYOUTS, FP8_POISON, KV_ONLY, LAYOUTS, fp8_bytes, make_fp8, make_view, put_values,
                             view_bytes)
from tests.helpers.placement import PLACE

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 8  # 8 tokens in pages of 4; 2 heads of 8 elements


def tokens(rng, count, total=T):
    return (rng.choice(total, count, replace=False).astype(np.int64),
            rng.choice(total, count, replace=False).astype(np.int64))


def quantise_case(plain_name, fp8_name, *, mla=False, fmt="e4m3", dtype="bfloat16", count=3, seed=0,
                  geometry=(L, T, P, H, D), layers=None, places=("device", "device"), launch=(1, 2), plain=None):
    rng = np.random.default_rng(seed)
    g = geometry
    src_np, src = make_view(plain_name, *g, rng, poison=False, mla=mla, place=(places[0], "numba"))
    if plain is not None:  # chosen values for the source (uint16 bit patterns), the same in both views
        for which in ("k",) if mla else ("k", "v"):
            for values, placed in zip(src_np.buffers(which), src.buffers(which)):
                plain(values)
                put_values(placed, values)
    dst_np, dst = make_fp8(fp8_name, *g, mla=mla, place=places[1], fmt=fmt, dtype=dtype)
    si, di = tokens(rng, count, g[1])
    put = PLACE["device"]
    kv.copy(src, dst, put(si), put(di), layers, block_quota=launch[0], num_warps_per_block=launch[1])
    qr.copy(src_np, dst_np, si, di, layers)
    moved = assert_same_bytes(fp8_bytes(dst), fp8_bytes(dst_np), FP8_POISON, f"{plain_name} -> {fp8_name}")
    assert count == 0 or moved > 0, "the reference moved nothing"
    return dst_np


def dequantise_case(fp8_name, plain_name, *, mla=False, fmt="e4m3", dtype="bfloat16", count=3, seed=0,
                    geometry=(L, T, P, H, D), launch=(1, 2), special_codes=True):
    rng = np.random.default_rng(seed)
    g = geometry
    src_np, src = make_fp8(fp8_name, *g, mla=mla, fmt=fmt, dtype=dtype, rng=rng, special_codes=special_codes)
    dst_np, dst = make_view(plain_name, *g, rng, poison=True, mla=mla, place=("device", "numba"))
    si, di = tokens(rng, count, g[1])
    kv.copy(src, dst, si, di, block_quota=launch[0], num_warps_per_block=launch[1])
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"{fp8_name} -> {plain_name}")


PLAIN = list(LAYOUTS)  # HeadMajorPages too: a layout of the user's on the plain side
PAIRS = [(p, q) for p in PLAIN for q in FP8_LAYOUTS]


@pytest.mark.parametrize("plain_name,fp8_name", PAIRS, ids=[f"{p}-{q}" for p, q in PAIRS])
def test_quantise_every_pair(plain_name, fp8_name):
    quantise_case(plain_name, fp8_name)


@pytest.mark.parametrize("fp8_name,plain_name", [(q, p) for p, q in PAIRS], ids=[f"{q}-{p}" for p, q in PAIRS])
def test_dequantise_every_pair(fp8_name, plain_name):
    dequantise_case(fp8_name, plain_name)


MLA = [n for n in FP8_LAYOUTS if n not in KV_ONLY]
MLA_PAIRS = [(p, q) for p in MLA for q in MLA]


@pytest.mark.parametrize("a,b", MLA_PAIRS, ids=[f"{a}-{b}" for a, b in MLA_PAIRS])
def test_mla_both_ways(a, b):
    quantise_case(a, b, mla=True, geometry=(L, T, P, 1, 64))
    dequantise_case(b, a, mla=True, geometry=(L, T, P, 1, 64))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_formats_and_dtypes(fmt, dtype):
    quantise_case("PageFirst", "FlashInferHND", fmt=fmt, dtype=dtype, seed=1)
    dequantise_case("PageHead", "LayerFirstList", fmt=fmt, dtype=dtype, seed=2)


@pytest.mark.parametrize("heads,dim", [(1, 64), (3, 128), (5, 8), (1, 576), (2, 12)])
def test_heads_and_head_sizes(heads, dim):
    """Odd head counts, D=64/128, D=576 (MLA-sized: four words a lane in registers, the rest read twice)."""
    g = (1, 4, 2, heads, dim)
    quantise_case("PageHead", "VllmFlashAttn", geometry=g, count=2, launch=(1, 1))
    dequantise_case("LayerFirst", "PageHead", geometry=g, count=2, launch=(1, 1))


def test_mla_576():
    g = (2, 4, 2, 1, 576)
    quantise_case("PageFirst", "LayerFirstList", mla=True, geometry=g, count=2, launch=(2, 1))
    dequantise_case("PageFirstDirect", "PageFirst", mla=True, geometry=g, count=2, launch=(2, 1))


COPY_PAIRS = [(a, b) for a in FP8_LAYOUTS for b in FP8_LAYOUTS if a == b or (FP8_LAYOUTS.index(a) + 1) % len(
    FP8_LAYOUTS) == FP8_LAYOUTS.index(b)]


@pytest.mark.parametrize("a,b", COPY_PAIRS, ids=[f"{a}-{b}" for a, b in COPY_PAIRS])
@pytest.mark.parametrize("heads", [2, 3])
def test_fp8_to_fp8(a, b, heads):
    rng = np.random.default_rng(4)
    g = (L, T, P, heads, D)
    src_np, src = make_fp8(a, *g, rng=rng)
    dst_np, dst = make_fp8(b, *g)
    si, di = tokens(rng, 3)
    kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(fp8_bytes(dst), fp8_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layers", [0, 1, range(0, 2)])
def test_layers(layers):
    quantise_case("PageFirst", "VllmFlashAttn", layers=layers)


@pytest.mark.parametrize("count", [0, 1, 8])
def test_one_token_none_and_every_token_with_the_last_page(count):
    dst_np = quantise_case("LayerFirst", "PageFirstDirect", count=count, launch=(2, 1))
    if count == T:  # the last page's last token was written
        assert (dst_np.codes.k[-1, :, -1] != FP8_POISON).any()


@pytest.mark.parametrize("places", [("host", "device"), ("device", "host")], ids=["h2d", "d2h"])
def test_pinned_host_memory(places):
    quantise_case("PageFirst", "LayerFirst", places=places)


def _bf16_bits(values):
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_extreme_values():
    """NaN, ±inf, values at ±448 * scale and around it, subnormals, zero heads, ties that round to even:
    every head of the source filled from them."""
    specials = np.concatenate([
        _bf16_bits([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 448.0, -448.0, 464.0, 480.0, 1.0, -1.0]),
        np.array([0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F88, 0x3F98], np.uint16),  # subnormals, max
        _bf16_bits(np.float32(448.0) * np.float32([1.0625, 1.125, 0.9375, 1 / 64, 1 / 512, 3 / 1024]))])
    rng = np.random.default_rng(5)

    def fill(buffer):  # the same values in the NumPy and the placed buffers
        local = np.random.default_rng(7)
        array = np.asarray(buffer)
        flat = array.reshape(-1, D)
        for row in range(flat.shape[0]):
            kind = row % 4
            if kind == 0:
                flat[row] = 0  # an all-zero head
            elif kind == 1:
                flat[row] = local.choice(specials, D)
            elif kind == 2:
                flat[row] = np.where(local.random(D) < 0.5, 0x8000, 0)  # ±0 only
                flat[row, 0] = 0x7F80  # and one infinity: amax 0, scale 0
            else:
                flat[row] = np.resize(np.roll(specials, row), D)

    for fmt in ("e4m3", "e5m2"):
        dst_np = quantise_case("PageFirst", "PageHead", fmt=fmt, plain=fill, count=8, launch=(2, 1))
        back_np, back = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
        _, dst = make_fp8("PageHead", L, T, P, H, D, fmt=fmt)
        for got, want in zip((dst.codes.k, dst.codes.v, dst.scales.k, dst.scales.v),
                             (dst_np.codes.k, dst_np.codes.v, dst_np.scales.k, dst_np.scales.v)):
            put_values(got, want)  # the same quantised tokens, placed
        idx = np.arange(T, dtype=np.int64)
        kv.copy(dst, back, idx, idx, block_quota=2, num_warps_per_block=1)
        qr.copy(dst_np, back_np, idx, idx)
        for got, want in zip(view_bytes(back), view_bytes(back_np)):
            np.testing.assert_array_equal(got, want)


def test_fp8_like_allocates_twins():
    for name in FP8_LAYOUTS:
        _, view = make_view(name, L, T, P, H, D, np.random.default_rng(0), poison=False, mla=False,
                            place=("device", "numba"))
        twin = kv.fp8_like(view, "e5m2", dtype="float16")
        assert type(twin.codes) is type(view) and twin.fmt == "e5m2" and twin.dtype == "float16"
        assert (twin.heads, twin.head_dim, twin.geometry.tokens, twin.geometry.layers) == (H, D, T, L)
