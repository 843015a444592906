"""Bad FP8 views and bad kv.copy calls with them: TypeError/ValueError naming the argument (or
IndexOutOfRangeError for an index), and nothing written."""
import ml_dtypes
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from tests.fp8.cases import FP8_POISON, fp8_bytes, make_fp8, make_view, view_bytes
from tests.helpers.placement import PLACE

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 8


def codes_and_scales(codes_dtype=np.uint8, scales_dtype=np.float32, scale_last=1, d=D, mla=False):
    shape = (L, T, d) if mla else (L, T, H, d)
    codes = np.zeros(shape, codes_dtype)
    scales = np.zeros(shape[:-1] + (scale_last,), scales_dtype)
    return kv.LayerFirst(codes, codes.copy() if not mla else None), kv.LayerFirst(scales, scales.copy() if not mla
                                                                                   else None)


def test_a_good_view():
    view = kv.Fp8View(*codes_and_scales())
    assert (view.heads, view.head_dim, view.fmt, view.mla) == (H, D, "e4m3", False)
    assert "Fp8View(LayerFirst" in repr(view)


@pytest.mark.parametrize("make,error,words", [
    (lambda: kv.Fp8View(np.zeros(4), codes_and_scales()[1]), TypeError, "codes must be a kvnumba cache view"),
    (lambda: kv.Fp8View(codes_and_scales()[0], None), TypeError, "scales must be"),
    (lambda: kv.Fp8View(codes_and_scales()[0], kv.PageFirst(np.zeros((T, L, H, 1), np.float32))), TypeError,
     "codes is a LayerFirst but scales a PageFirst"),
    (lambda: kv.Fp8View(*codes_and_scales(codes_dtype=np.uint16)), TypeError, "codes must hold uint8"),
    (lambda: kv.Fp8View(*codes_and_scales(codes_dtype=np.int8)), TypeError, "codes must hold uint8 .* got int8"),
    (lambda: kv.Fp8View(*codes_and_scales(scales_dtype=np.float16)), TypeError, "scales must be float32"),
    (lambda: kv.Fp8View(*codes_and_scales(scale_last=2)), ValueError, "one float32 per head"),
    (lambda: kv.Fp8View(*codes_and_scales(d=6)), ValueError, "multiple of 4"),
    (lambda: kv.Fp8View(*codes_and_scales(), fmt="e3m4"), ValueError, "fmt must be"),
    (lambda: kv.Fp8View(*codes_and_scales(), dtype="float32"), TypeError, "bfloat16 or float16"),
    (lambda: kv.Fp8View(codes_and_scales()[0], codes_and_scales(mla=True)[1]), ValueError, "MLA"),
])
def test_bad_views(make, error, words):
    with pytest.raises(error, match=words):
        make()


def scales_in(memory, offset=0):
    """Float32 scales (L, T, H, 1) over ``memory``'s bytes from ``offset``: an alias of whatever is there."""
    count = L * T * H
    return memory.reshape(-1)[offset:offset + 4 * count].view(np.float32).reshape(L, T, H, 1)


def aliased(case):
    codes, scales = codes_and_scales()
    k, v = codes.k, codes.v
    if case == "scales.k inside codes.k":
        return kv.LayerFirst(k, v), kv.LayerFirst(scales_in(k), scales.v)
    if case == "scales.v inside codes.v, at an offset":
        return kv.LayerFirst(k, v), kv.LayerFirst(scales.k, scales_in(v, 8))
    if case == "scales.k across the end of codes.k":
        both = np.zeros(2 * k.nbytes, np.uint8)
        codes_k = both[:k.nbytes].reshape(k.shape)
        return kv.LayerFirst(codes_k, v), kv.LayerFirst(scales_in(both, k.nbytes - 4), scales.v)
    if case == "a per-layer scale inside a per-layer code":
        layers = [np.zeros((T, H, D), np.uint8) for _ in range(L)]
        per_layer_scales = [np.zeros((T, H, 1), np.float32) for _ in range(L)]
        per_layer_scales[1] = layers[0].reshape(-1)[:T * H * 4].view(np.float32).reshape(T, H, 1)
        return kv.LayerFirst(layers, [x.copy() for x in layers]), kv.LayerFirst(per_layer_scales,
                                                                             [x.copy() for x in per_layer_scales])
    raise AssertionError(case)


@pytest.mark.parametrize("case, words", [
    ("scales.k inside codes.k", r"scales.k overlaps codes.k \(bytes 0x"),
    ("scales.v inside codes.v, at an offset", "scales.v overlaps codes.v"),
    ("scales.k across the end of codes.k", "scales.k overlaps codes.k"),
    ("a per-layer scale inside a per-layer code", r"scales.k\[1\] overlaps codes.k\[0\]"),
])
def test_scales_that_alias_codes_are_refused(case, words):
    codes, scales = aliased(case)
    before = [np.array(b, copy=True) for b in (codes.buffers("k") + codes.buffers("v"))]
    with pytest.raises(ValueError, match="Fp8View: " + words + ".*must be separate buffers"):
        kv.Fp8View(codes, scales)
    for old, new in zip(before, codes.buffers("k") + codes.buffers("v")):
        np.testing.assert_array_equal(old, new)


def test_scales_next_to_codes_are_accepted():
    both = np.zeros(L * T * H * (D + 4), np.uint8)
    split = L * T * H * D
    codes = both[:split].reshape(L, T, H, D)
    view = kv.Fp8View(kv.LayerFirst(codes, np.zeros_like(codes)),
                      kv.LayerFirst(scales_in(both, split), np.zeros((L, T, H, 1), np.float32)))
    assert view.head_dim == D


def test_layer_table_is_refused():
    table = np.zeros(L, np.uint64)
    raw = kv.LayerTable(table, table, tokens=T, item_size=H * D)
    with pytest.raises(TypeError, match="LayerTable"):
        kv.Fp8View(raw, codes_and_scales()[1])


def poisoned_pair(**kwargs):
    rng = np.random.default_rng(0)
    _, src = make_view("PageFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_fp8("LayerFirst", L, T, P, H, D, **kwargs)
    return src, dst


def untouched(dst):
    return all((b == FP8_POISON).all() for b in fp8_bytes(dst))


IDX = np.arange(3, dtype=np.int64)


@pytest.mark.parametrize("call,error,words", [
    (lambda s, d: kv.copy(s, d, np.array([0, 8, 1]), IDX), kv.IndexOutOfRangeError, r"src_indices\[1\] = 8"),
    (lambda s, d: kv.copy(s, d, IDX, np.array([0, 1, -1])), kv.IndexOutOfRangeError, r"dst_indices\[2\] = -1"),
    (lambda s, d: kv.copy(s, d, IDX, IDX.astype(np.int32)), TypeError, "int64"),
    (lambda s, d: kv.copy(s, d, IDX, IDX[:2]), ValueError, "length"),
    (lambda s, d: kv.copy(s, d, IDX, IDX, route="copy_engine"), ValueError, "copy_engine"),
    (lambda s, d: kv.copy(s, d, IDX, IDX, route="fast"), ValueError, "route"),
    (lambda s, d: kv.copy(s, d, IDX, IDX, layers=5), ValueError, "layers"),
    (lambda s, d: kv.copy(s, d, IDX, IDX, block_quota=0), ValueError, "block_quota"),
    (lambda s, d: kv.copy(np.zeros(4), d, IDX, IDX), TypeError, "src_view"),
    (lambda s, d: kv.copy(d, d, IDX, IDX), None, None),  # allowed: FP8 -> FP8 onto itself
])
def test_bad_calls_write_nothing(call, error, words):
    src, dst = poisoned_pair(dtype=None)
    if error is None:
        call(src, dst)
        return
    src, dst = poisoned_pair(dtype="bfloat16")
    with pytest.raises(error, match=words):
        call(src, dst)
    assert untouched(dst)


def test_uint16_source_needs_a_dtype():
    src, dst = poisoned_pair(dtype=None)
    with pytest.raises(TypeError, match="dtype='bfloat16'"):
        kv.copy(src, dst, IDX, IDX)
    assert untouched(dst)


def test_dtypes_must_agree():
    k = np.zeros((T, L, H, D), ml_dtypes.bfloat16)
    src = kv.PageFirst(PLACE["host"](k), PLACE["host"](k))  # pinned: a Numba GPU array cannot hold bfloat16
    _, dst = make_fp8("LayerFirst", L, T, P, H, D, dtype="float16")
    with pytest.raises(TypeError, match="float16"):
        kv.copy(src, dst, IDX, IDX)
    _, dst = make_fp8("LayerFirst", L, T, P, H, D, dtype=None)
    kv.copy(src, dst, IDX, IDX, block_quota=1, num_warps_per_block=1)  # bfloat16 buffers say it themselves
    assert (np.asarray(dst.scales.k)[:, :3] == 0).all()


def test_mismatched_geometry():
    rng = np.random.default_rng(0)
    _, src = make_view("PageFirst", L, T, P, H, 16, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_fp8("LayerFirst", L, T, P, H, D)
    with pytest.raises(ValueError, match="heads"):
        kv.copy(src, dst, IDX, IDX)
    assert untouched(dst)
    _, mla = make_fp8("LayerFirst", L, T, P, H, D, mla=True)
    with pytest.raises(ValueError, match="MLA"):
        kv.copy(src, mla, IDX, IDX)
    _, a = make_fp8("LayerFirst", L, T, P, H, D, fmt="e4m3")
    _, b = make_fp8("PageFirst", L, T, P, H, D, fmt="e5m2")
    with pytest.raises(ValueError, match="formats|e4m3"):
        kv.copy(a, b, IDX, IDX)


def test_read_only_destination():
    src, dst = poisoned_pair(dtype="bfloat16", place="host")  # NumPy's read-only flag: host arrays
    for buffer in (dst.codes.k, dst.codes.v, dst.scales.k, dst.scales.v):
        np.asarray(buffer).setflags(write=False)
    with pytest.raises(ValueError, match="dst_view.codes.k"):
        kv.copy(src, dst, IDX, IDX)
    assert untouched(dst)


def test_device_indices_out_of_range_are_skipped_and_flagged(device_path):
    src, dst = poisoned_pair(dtype="bfloat16")
    with pytest.raises(kv.IndexOutOfRangeError):
        kv.copy(src, dst, PLACE["device"](np.array([0, 99], np.int64)), PLACE["device"](np.array([0, 1], np.int64)),
                block_quota=1, num_warps_per_block=2, check=True)
    codes = np.asarray(dst.codes.k)
    assert (codes[:, 0] != FP8_POISON).any() and (codes[:, 1] == FP8_POISON).all()


@pytest.mark.skipif(not SIMULATOR, reason="builds index arrays inside a destination's NumPy memory")
@pytest.mark.parametrize("side", ["src_indices", "dst_indices"])
@pytest.mark.parametrize("mode", ["quantise", "dequantise"])
def test_index_arrays_inside_a_destination_are_refused(mode, side):
    """Index arrays whose memory is one of many destination buffers' (a middle layer's of per-layer arrays,
    which a call finds among the plan's sorted destination ranges): OverlapError naming both, nothing written."""
    layers = 8
    _, plain = make_view("LayerFirstList", layers, T, P, H, D, np.random.default_rng(1), poison=True, mla=False)
    _, fp8 = make_fp8("LayerFirstList", layers, T, P, H, D, place=None)
    src, dst = (plain, fp8) if mode == "quantise" else (fp8, plain)
    buffers = fp8.codes.buffers("k") if mode == "quantise" else plain.buffers("k")
    inside = np.asarray(buffers[layers // 2]).view(np.uint8).reshape(-1)[:8 * len(IDX)].view(np.int64)
    inside[:] = IDX
    before = [b.copy() for b in (fp8_bytes(dst) if mode == "quantise" else view_bytes(dst))]
    indices = {"src_indices": IDX, "dst_indices": IDX, side: inside}
    with pytest.raises(kv.OverlapError, match=rf"dst_view\S*\[{layers // 2}\]\S* overlaps {side}"):
        kv.copy(src, dst, indices["src_indices"], indices["dst_indices"], block_quota=1, num_warps_per_block=1)
    after = fp8_bytes(dst) if mode == "quantise" else view_bytes(dst)
    assert all(np.array_equal(a, b) for a, b in zip(after, before))
