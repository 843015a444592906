"""FP8 special values through every FP8 route: NaN, ±inf, values past the largest code, subnormals (of the
plain type, of FP8, and scales too small to invert), -0.0, all-zero heads; every code byte and special scales
on the way back. Each route (quantising on the general and the wide kernel, the backup into pinned page-first
memory, dequantising on the general and the pipelined kernel, the staged load of one layer, FP8 to FP8) writes
what ``kvnumba.quant_reference`` writes, bit for bit, and the documented saturation holds: an infinity is the
largest code of its sign, a finite value never a NaN code, a NaN code the canonical NaN of its sign."""
import contextlib

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba import quant_reference as qr
from kvnumba.kernels import staged
from kvnumba.quant.fp8 import CANONICAL_NAN, FORMATS, PLAIN_DTYPES
from kvnumba.plan import kernel_plan
from kvnumba.plan.fp8_plan import Fp8Plan
from tests.fp8.cases import FP8_POISON, copy_plan, fp8_bytes, make_fp8, make_view, put_values, view_bytes
from tests.helpers.placement import device
from tests.helpers.view_cases import assert_same_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 16  # heads of 16: the wide and the pipelined kernels take them
RING = staged.StagedShape(stages=2, stage_bytes=1024, slots=8, min_bulk_bytes=64, direct_batch=8, fallback_runs=0)
SUBNORMAL = {"bfloat16": [0x0001, 0x8001, 0x007F, 0x8040], "float16": [0x0001, 0x8001, 0x03FF, 0x8200]}
LARGEST = {"bfloat16": 0x7F7F, "float16": 0x7BFF}


def specials(dtype):
    """uint16 bit patterns of ``dtype``: zeros, NaNs, infinities, values at and past 448 and 57344 (e5m2's
    largest), the plain type's largest and its subnormals."""
    floats = np.float32([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 448.0, -448.0, 449.0, 464.0, 480.0, 500.0,
                         1e4, -1e4, 57344.0, 61440.0, 1.0, -1.0, 2.0**-14, 2.0**-126])
    bits = floats.astype(PLAIN_DTYPES[dtype]).view(np.uint16)
    return np.concatenate([bits, np.uint16(SUBNORMAL[dtype] + [LARGEST[dtype], LARGEST[dtype] | 0x8000])])


def _bits(values, dtype):
    return np.float32(values).astype(PLAIN_DTYPES[dtype]).view(np.uint16)


# One kind of head per row, in turn: what each one probes.
HEADS = {
    "zeros": lambda rng, s, dt: np.zeros(D, np.uint16),
    "negative zeros (-0.0)": lambda rng, s, dt: np.full(D, 0x8000, np.uint16),
    "any specials": lambda rng, s, dt: rng.choice(s, D),
    "an infinity among zeros (scale 0)": lambda rng, s, dt: np.where(np.arange(D) == 3, _bits(-np.inf, dt),
                                                                      rng.choice(np.uint16([0, 0x8000]), D)),
    "NaNs and infinities only": lambda rng, s, dt: rng.choice(_bits([np.nan, -np.nan, np.inf, -np.inf], dt), D),
    "subnormals only (a scale too small to invert)": lambda rng, s, dt: rng.choice(np.uint16(SUBNORMAL[dt]), D),
    "the largest value and small ones (FP8 subnormals)": lambda rng, s, dt: np.where(
        np.arange(D) == 0, LARGEST[dt], _bits(rng.choice([1e-3, -2e-3, 3e-4, 1.0, 0.0, -0.0], D), dt)),
    "just past the largest code": lambda rng, s, dt: _bits(rng.permutation(np.float32(448.0) * np.float32(
        [1.0, 1.0625, 1.125, 0.9375, -1.03125, 1 / 64, 1 / 512, 3 / 1024, -1.0, 0.5, 2.0**-9, 2.0**-10, 1.0009765625,
         -0.99951171875, 0.0, -0.0])), dt),
}
# Scales of FP8 sources: zero, -0.0, subnormal, 1, large enough that products overflow, inf and NaN.
SCALES = np.float32([0.0, -0.0, 1e-45, 1e-40, 2.0**-126, 1.0, 448.0, 1e30, 3.0e38, np.inf, np.nan, 0.25])


def fill_plain(array, dtype, seed):
    rng = np.random.default_rng(seed)
    rows = array.reshape(-1, D)
    table = specials(dtype)
    kinds = list(HEADS.values())
    for row in range(rows.shape[0]):
        rows[row] = kinds[row % len(kinds)](rng, table, dtype)


def _each_buffer(np_view, placed, fill):
    """``fill(numpy buffer, i)`` on each of ``np_view``'s buffers, then the same bytes into ``placed``'s."""
    i = 0
    for which in ("k",) if np_view.v is None or np_view.v is np_view.k else ("k", "v"):
        for values, target in zip(np_view.buffers(which), placed.buffers(which)):
            fill(values, i)
            put_values(target, values)
            i += 1


def plain_source(name, dtype, place="device"):
    rng = np.random.default_rng(0)
    src_np, src = make_view(name, L, T, P, H, D, rng, poison=False, mla=False, place=(place, "numba"))
    _each_buffer(src_np, src, lambda values, i: fill_plain(np.asarray(values).view(np.uint16), dtype, i))
    return src_np, src


def fp8_source(name, fmt, dtype, place="device"):
    """Codes of every byte value (NaN codes, e5m2's infinities, FP8 subnormals, 0x80) and the special scales."""
    src_np, src = make_fp8(name, L, T, P, H, D, place=place, fmt=fmt, dtype=dtype, rng=np.random.default_rng(1))

    def codes(values, i):  # 37 is odd: every byte value, each as often
        flat = np.asarray(values).reshape(-1)
        flat[:] = (np.arange(flat.size) * 37 + 11 * i) % 256

    def scales(values, i):
        flat = np.asarray(values).reshape(-1)
        flat[:] = np.resize(np.roll(SCALES, i), flat.size)

    _each_buffer(src_np.codes, src.codes, codes)
    _each_buffer(src_np.scales, src.scales, scales)
    return src_np, src


# route -> (mode, source (layout, place), destination (layout, place), kernel setting, layer, what the plan takes)
ROUTES = {
    "quantise, general kernel": ("quantise", ("LayerFirst", "device"), ("LayerFirst", "device"), "general", None, 0),
    "quantise, wide kernel": ("quantise", ("LayerFirst", "device"), ("LayerFirst", "device"), None, None, "slots"),
    "backup into pinned page-first": ("quantise", ("LayerFirst", "device"), ("PageFirst", "host"), None, None, "slots"),
    "dequantise, general kernel": ("dequantise", ("LayerFirst", "device"), ("LayerFirst", "device"), "general", None,
                                   0),
    "dequantise, pipelined kernel": ("dequantise", ("LayerFirst", "device"), ("LayerFirst", "device"), None, None,
                                     "slots"),
    "staged load of one layer from pinned page-first": ("dequantise", ("PageFirst", "host"), ("LayerFirst", "device"),
                                                        None, 1, "staged"),
    "FP8 to FP8": ("copy", ("PageFirst", "device"), ("LayerFirst", "device"), None, None, 0),
}


@pytest.fixture
def settings(monkeypatch, staged_ring):
    """``settings(kernel, staged)``: the FP8 kernel setting and, for a staged load, the forced staged path on a
    small ring; returns the list the staged plans' choices go to."""
    chosen = []
    with contextlib.ExitStack() as stack:
        def use(kernel, staged_load):
            if kernel is not None:
                stack.enter_context(config.override(fp8_kernel=kernel))
            if staged_load:
                monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
                staged_ring(RING)
                stack.enter_context(kernel_plan.watching(
                    lambda plan: isinstance(plan, Fp8Plan) and chosen.append(plan.staged is not None)))
            return chosen
        yield use


def saturation_holds(plain_bits, codes, fmt, dtype):
    """The documented saturation of a quantising copy: ±inf -> the largest code of its sign, NaN -> the NaN
    code of its sign, a finite value never a NaN code (nor, in e5m2, an infinity's)."""
    f = FORMATS[fmt]
    values = plain_bits.view(PLAIN_DTYPES[dtype]).astype(np.float32)
    sign = np.signbit(values).astype(np.uint8) << 7
    inf, nan = np.isinf(values), np.isnan(values)
    assert inf.any() and nan.any() and (values == 0).any() and np.signbit(values[values == 0]).any()
    np.testing.assert_array_equal(codes[inf], (sign | f.max_code)[inf], err_msg="an infinity is not the largest code")
    np.testing.assert_array_equal(codes[nan], (sign | f.nan_code)[nan], err_msg="a NaN is not the NaN code")
    finite = codes[~(inf | nan)] & 0x7F
    assert (finite <= f.max_code).all(), "a finite value took a NaN (or infinity) code"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_special_values_on_every_route_match_the_reference(settings, route, fmt, dtype):
    mode, (src_name, src_place), (dst_name, dst_place), kernel, layer, takes = ROUTES[route]
    chosen = settings(kernel, takes == "staged")
    if mode == "quantise":
        src_np, src = plain_source(src_name, dtype, src_place)
        dst_np, dst = make_fp8(dst_name, L, T, P, H, D, place=dst_place, fmt=fmt, dtype=dtype)
    else:
        src_np, src = fp8_source(src_name, fmt, dtype, src_place)
        if mode == "copy":
            dst_np, dst = make_fp8(dst_name, L, T, P, H, D, place=dst_place, fmt=fmt, dtype=dtype)
        else:
            dst_np, dst = make_view(dst_name, L, T, P, H, D, np.random.default_rng(2), poison=True, mla=False,
                                    place=(dst_place, "numba"))
    si = np.random.default_rng(3).permutation(T).astype(np.int64)
    di = np.arange(T, dtype=np.int64)
    kv.copy(src, dst, device(si), device(di), layer, block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di, layer)
    plan = copy_plan(src, dst, layer)
    if takes == "slots":
        assert plan.slots > 0, f"{route}: the plan did not take the fast kernel"
    elif takes == "staged":
        assert chosen == [True], f"{route}: the staged path was not taken"
    else:
        assert plan.slots == 0
    if mode == "dequantise":
        for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
            np.testing.assert_array_equal(got, want, err_msg=route)
    else:
        assert_same_bytes(fp8_bytes(dst), fp8_bytes(dst_np), FP8_POISON, route)
    # The kernel's bytes are the reference's (above): the documented values, position by position (si -> di).
    if layer is not None or dst_name != "LayerFirst":
        return
    if mode == "quantise":
        saturation_holds(np.asarray(src_np.k).view(np.uint16)[:, si], np.asarray(dst_np.codes.k)[:, di], fmt, dtype)
    elif mode == "dequantise":
        codes = np.asarray(src_np.codes.k)[:, si]
        nan_codes = (codes & 0x7F) == 0x7F if fmt == "e4m3" else (codes & 0x7F) > 0x7C
        sign = (codes.astype(np.uint16) & 0x80) << 8
        got = np.asarray(dst_np.k).view(np.uint16)[:, di]
        assert nan_codes.any()
        np.testing.assert_array_equal(got[nan_codes], (sign | CANONICAL_NAN[dtype])[nan_codes],
                                      err_msg="a NaN code is not the canonical NaN of its sign")
