"""The wide FP8 kernels (``kvnumba.kernels.quantise_wide``): which copies take them, and that they write what
the reference writes, byte for byte, in passes of several heads (many heads of 16 elements), in part-filled
passes, MLA heads of 512, and with the heads they hand to the exact element functions (infinities, NaNs,
zero heads, scales too small to invert, NaN codes) beside the ones they convert themselves."""
import ml_dtypes
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba.plan import fp8_plan
from kvnumba.kernels import quantise_wide
from tests.fp8.test_copy import dequantise_case, quantise_case, tokens
from tests.fp8.cases import eight_past_sixteen, fp8_bytes, make_fp8, make_view
from tests.helpers.placement import PLACE
from tests.helpers.view_cases import view_bytes
from kvnumba import quant_reference as qr

pytestmark = pytest.mark.needs_target


def test_which_heads_the_wide_kernel_takes():
    slots = quantise_wide.SLOTS
    assert [quantise_wide.slots_for(d) for d in (16, 32, 64, 128, 256, 512)] == [
        min(slots, d // 16) for d in (16, 32, 64, 128, 256, 512)]
    assert [quantise_wide.slots_for(d) for d in (8, 12, 48, 96, 576, 1024)] == [0] * 6


def _plan(fmt_view_dim, **override):
    rng = np.random.default_rng(0)
    _, src = make_view("LayerFirst", 1, 4, 2, 2, fmt_view_dim, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_fp8("PageFirst", 1, 4, 2, 2, fmt_view_dim)
    with config.override(**override):
        return fp8_plan.Fp8Plan(src, dst, None)


def test_a_plan_takes_the_wide_kernel_where_it_runs_unless_told():
    assert _plan(64).slots == min(quantise_wide.SLOTS, 4) and _plan(32).slots == min(quantise_wide.SLOTS, 2)
    assert _plan(8).slots == 0  # heads of 8: scaled_copy's kernel
    assert _plan(64, fp8_kernel="general").slots == 0
    with pytest.raises(kv.SettingError, match="fp8_kernel must be one of general, wide"):
        with config.override(fp8_kernel="fast"):
            pass


GEOMETRIES = {"many heads, passes of 32": (1, 4, 2, 20, 16), "a part-filled pass": (2, 4, 2, 3, 32),
              "heads of 64": (1, 4, 2, 2, 64)}


# Finite values: random bit patterns (the cases above) put a NaN or an infinity in most heads of 64 or more, and
# those heads go to the exact functions. Where a kind's chunks fill whole passes (H * D / 16 a multiple of
# 32 * slots), the kernel's whole passes run: a lane's addresses are offsets fixed for the copy, no chunk is checked;
# the others take the general pass (across K and V, part-filled).
FINITE = {"whole: 8 heads of 128": (1, 4, 2, 8, 128), "whole: 32 heads of 16": (1, 4, 2, 32, 16),
          "whole: 2 heads of 512": (1, 4, 2, 2, 512), "general: 3 heads of 128": (1, 4, 2, 3, 128),
          "general: 5 heads of 64": (1, 4, 2, 5, 64)}


@pytest.mark.parametrize("name", FINITE)
@pytest.mark.parametrize("fmt,dtype", [("e4m3", "bfloat16"), ("e5m2", "float16")])
def test_finite_heads_quantise_as_the_reference(name, fmt, dtype):
    g = FINITE[name]

    def normal(buffer):
        values = np.random.default_rng(7).normal(size=np.shape(buffer)) * 3
        buffer[...] = values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).view(np.uint16)

    quantise_case("LayerFirst", "PageFirst", geometry=g, fmt=fmt, dtype=dtype, count=3, launch=(1, 2), plain=normal)
    quantise_case("PageHead", "LayerFirstList", geometry=g, fmt=fmt, dtype=dtype, count=2, launch=(1, 1), seed=4,
                  plain=normal)


@pytest.mark.parametrize("name", GEOMETRIES)
@pytest.mark.parametrize("fmt,dtype", [("e4m3", "bfloat16"), ("e5m2", "float16")])
def test_quantise_and_dequantise_as_the_reference(name, fmt, dtype):
    g = GEOMETRIES[name]
    quantise_case("PageHead", "PageFirst", geometry=g, fmt=fmt, dtype=dtype, count=2, launch=(1, 1))
    quantise_case("LayerFirst", "LayerFirstList", geometry=g, fmt=fmt, dtype=dtype, count=2, launch=(1, 1), seed=3)
    dequantise_case("PageFirst", "LayerFirst", geometry=g, fmt=fmt, dtype=dtype, count=2, launch=(1, 1),
                    special_codes=False)
    dequantise_case("PageHead", "PageFirst", geometry=g, fmt=fmt, dtype=dtype, count=2, launch=(1, 1))


def test_mla_heads_of_512():
    g = (1, 4, 2, 1, 512)
    quantise_case("PageFirst", "LayerFirst", mla=True, geometry=g, count=2, launch=(1, 1))
    dequantise_case("LayerFirst", "PageFirst", mla=True, geometry=g, count=2, launch=(1, 1), special_codes=False)


def _bits(values):
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.mark.parametrize("H", [40, 32])
def test_odd_heads_beside_plain_ones(H):
    """Passes of 32 heads of 16 elements, some holding an infinity, a NaN, only zeros, or values so small that
    their scale's inverse overflows (the format divides there), the rest normal values: both kinds of pass
    (40 heads: a pass across K and V; 32: whole passes)."""
    L, T, P, D = 1, 4, 2, 16

    def fill(buffer):
        local = np.random.default_rng(11)
        flat = np.asarray(buffer).reshape(-1, D)
        flat[:] = _bits(local.normal(size=flat.shape))
        for row in range(0, flat.shape[0], 7):
            flat[row, row % D] = (0x7F80, 0xFFC1, 0x0000, 0x0001)[(row // 7) % 4]
            if (row // 7) % 4 == 2:
                flat[row] = 0
            if (row // 7) % 4 == 3:
                flat[row] = _bits(local.normal(size=D) * 1e-38)
    quantise_case("LayerFirst", "PageHead", geometry=(L, T, P, H, D), plain=fill, count=3, launch=(1, 1))
    quantise_case("PageFirst", "PageFirst", geometry=(L, T, P, 2 if H == 40 else 8, 128), plain=fill, count=2,
                  launch=(1, 1), fmt="e5m2")


@pytest.mark.parametrize("mode,H", [("quantise", 2), ("quantise", 32), ("dequantise", 2)])
def test_destinations_only_8_byte_aligned(mode, H):
    """The wide kernels store 16 bytes at once where the destination allows, 8 where it is 8 bytes past a
    16-byte boundary: both write what the reference writes (32 heads of 32: the quantiser's whole passes)."""
    L, T, P, D = 1, 4, 2, 32
    rng = np.random.default_rng(5)
    si, di = tokens(rng, 3, T)
    if mode == "quantise":
        src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
        poisoned, _ = make_fp8("PageFirst", L, T, P, H, D, place=None)
        codes = [np.asarray(b) for b in (poisoned.codes.k, poisoned.codes.v)]
        scales = [np.asarray(b) for b in (poisoned.scales.k, poisoned.scales.v)]
        dst_np = kv.Fp8View(kv.PageFirst(*[c.copy() for c in codes]), kv.PageFirst(*[s.copy() for s in scales]), "e4m3",
                            dtype="bfloat16")
        dst = kv.Fp8View(kv.PageFirst(*[eight_past_sixteen(c) for c in codes]),
                         kv.PageFirst(*[PLACE["device"](s) for s in scales]), "e4m3", dtype="bfloat16")
    else:
        src_np, src = make_fp8("PageFirst", L, T, P, H, D, rng=rng, special_codes=False)
        poison = np.full((L, T, H, D), 0xA5A5, np.uint16)
        dst_np = kv.LayerFirst(poison.copy(), poison.copy())
        dst = kv.LayerFirst(eight_past_sixteen(poison), eight_past_sixteen(poison))
    assert fp8_plan.Fp8Plan(src, dst, None).slots  # the wide kernel
    kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=1)
    qr.copy(src_np, dst_np, si, di)
    got = fp8_bytes(dst) if mode == "quantise" else view_bytes(dst)
    want = fp8_bytes(dst_np) if mode == "quantise" else view_bytes(dst_np)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("H,D", [(32, 32), (8, 128)])
def test_sources_only_8_byte_aligned(H, D):
    """The quantiser's whole passes read a lane's chunks 16 bytes at once where the source allows, 8 at once
    where it starts 8 bytes past a 16-byte boundary: both write what the reference writes."""
    L, T, P = 1, 4, 2
    rng = np.random.default_rng(6)
    si, di = tokens(rng, 3, T)
    k, v = (_bits(rng.normal(size=(L, T, H, D))) for _ in range(2))
    src_np, src = kv.LayerFirst(k, v), kv.LayerFirst(eight_past_sixteen(k), eight_past_sixteen(v))
    for placed in (src, kv.LayerFirst(PLACE["device"](k), PLACE["device"](v))):
        dst_np, dst = make_fp8("PageFirst", L, T, P, H, D)  # both poisoned
        assert fp8_plan.Fp8Plan(placed, dst, None).slots  # the wide kernel
        kv.copy(placed, dst, si, di, block_quota=1, num_warps_per_block=1)
        qr.copy(src_np, dst_np, si, di)
        for g, w in zip(fp8_bytes(dst), fp8_bytes(dst_np)):
            np.testing.assert_array_equal(g, w)


def test_out_of_range_items_are_skipped_and_flagged(device_path):
    """An item whose index is out of range (indices in GPU memory: the kernel's guard) is skipped and flagged;
    the items before and after it are written as the reference writes them, and its destination keeps its
    poison. 8 heads of 128: the wide kernel's whole passes."""
    L, T, P, H, D = 2, 8, 4, 8, 128
    rng = np.random.default_rng(12)
    k, v = (rng.normal(size=(L, T, H, D)).astype(ml_dtypes.bfloat16).view(np.uint16) for _ in range(2))
    src = kv.LayerFirst(PLACE["device"](k), PLACE["device"](v))
    src_np = kv.LayerFirst(k, v)
    dst_np, dst = make_fp8("PageFirst", L, T, P, H, D)  # both poisoned
    si, di = np.array([3, 99, 5], np.int64), np.array([1, 2, 6], np.int64)
    assert fp8_plan.Fp8Plan(src, dst, None).slots  # the wide kernel
    # after the launch, the call names the first index the kernel skipped, as every kernel plan's call does
    with pytest.raises(kv.IndexOutOfRangeError, match=r"src_indices\[1\] = 99 is out of range for src_view .*"
                                                      r"valid tokens are \[0, 8\); the kernel skipped"):
        kv.copy(src, dst, PLACE["device"](si), PLACE["device"](di), block_quota=1, num_warps_per_block=2, check=True)
    keep = np.array([True, False, True])
    qr.copy(src_np, dst_np, si[keep], di[keep])  # the reference of the items in range; item 1's stays poison
    for g, w in zip(fp8_bytes(dst), fp8_bytes(dst_np)):
        np.testing.assert_array_equal(g, w)
