"""kv.prepare("copy", ...) with an Fp8View: validated once at prepare, then each call checks its indices and
launches; the bytes and the errors are plain kv.copy's (bit-exact against kvnumba.reference.copy, nothing
written on a bad call)."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.plan import fp8_plan
from tests.fp8.cases import FP8_POISON, fp8_bytes, make_fp8, make_view, view_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 8
CALLS = [(np.array([1, 6], np.int64), np.array([0, 7], np.int64)),
         (np.array([3, 0, 5], np.int64), np.array([2, 4, 6], np.int64))]


def quantise_pair(seed=0, place="device"):
    rng = np.random.default_rng(seed)
    src_np, src = make_view("PageFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_fp8("PageHead", L, T, P, H, D, place=place)
    return src_np, src, dst_np, dst


def dequantise_pair(seed=0):
    rng = np.random.default_rng(seed)
    src_np, src = make_fp8("LayerFirstList", L, T, P, H, D, rng=rng)
    dst_np, dst = make_view("PageFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    return src_np, src, dst_np, dst


def fp8_pair(seed=0):
    rng = np.random.default_rng(seed)
    src_np, src = make_fp8("PageFirst", L, T, P, H, D, rng=rng)
    dst_np, dst = make_fp8("VllmFlashAttn", L, T, P, H, D)
    return src_np, src, dst_np, dst


def everything(view):
    return fp8_bytes(view) if isinstance(view, kv.Fp8View) else view_bytes(view)


def same(got, want):
    for a, b in zip(everything(got), everything(want)):
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def builds(monkeypatch):
    """How many FP8 plans are built (each one validates the views)."""
    count = [0]
    real = fp8_plan.Fp8Plan.__init__

    def counted(self, *args, **kwargs):
        count[0] += 1
        real(self, *args, **kwargs)

    monkeypatch.setattr(fp8_plan.Fp8Plan, "__init__", counted)
    kv.clear_plan_caches()
    yield count
    kv.clear_plan_caches()


@pytest.mark.parametrize("pair", [quantise_pair, dequantise_pair, fp8_pair], ids=["quantise", "dequantise", "fp8"])
@pytest.mark.parametrize("bind_layers", [False, True])
def test_prepared_copy_is_bit_exact_and_validated_once(pair, bind_layers, builds):
    src_np, src, dst_np, dst = pair()
    extra = {"layers": None} if bind_layers else {}
    copy = kv.prepare("copy", src_view=src, dst_view=dst, block_quota=1, num_warps_per_block=2, **extra)
    assert builds[0] == 1  # validated at prepare
    for si, di in CALLS:
        copy(si, di)
        reference.copy(src_np, dst_np, si, di)
        same(dst, dst_np)
    copy(src_indices=CALLS[0][0], dst_indices=CALLS[0][1])  # by keyword too
    assert builds[0] == 1  # the calls only checked indices and launched


def test_prepared_copy_with_layers_per_call():
    src_np, src, dst_np, dst = quantise_pair(1)
    copy = kv.prepare("copy", src_view=src, dst_view=dst)
    for layers in (1, range(0, 1)):
        si, di = CALLS[1]
        copy(si, di, layers, block_quota=1, num_warps_per_block=1)
        reference.copy(src_np, dst_np, si, di, layers)
        same(dst, dst_np)


def test_views_given_per_call():
    src_np, src, dst_np, dst = dequantise_pair(2)
    copy = kv.prepare("copy", block_quota=1, num_warps_per_block=2)
    si, di = CALLS[0]
    copy(src, dst, si, di)
    reference.copy(src_np, dst_np, si, di)
    same(dst, dst_np)


def test_errors_at_prepare_are_kv_copys():
    rng = np.random.default_rng(0)
    _, src = make_view("PageFirst", L, T, P, H, 16, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_fp8("LayerFirst", L, T, P, H, D)
    with pytest.raises(ValueError, match="heads"):
        kv.prepare("copy", src_view=src, dst_view=dst)
    _, a = make_fp8("LayerFirst", L, T, P, H, D, fmt="e4m3")
    _, b = make_fp8("PageFirst", L, T, P, H, D, fmt="e5m2")
    with pytest.raises(ValueError, match="e4m3"):
        kv.prepare("copy", src_view=a, dst_view=b, layers=0)


IDX = np.arange(3, dtype=np.int64)
BAD_CALLS = [
    ((np.array([0, 8, 1]), IDX), {}, kv.IndexOutOfRangeError, r"src_indices\[1\] = 8"),
    ((IDX, np.array([0, 1, -1])), {}, kv.IndexOutOfRangeError, r"dst_indices\[2\] = -1"),
    ((IDX, IDX.astype(np.int32)), {}, TypeError, "int64"),
    ((IDX, IDX[:2]), {}, ValueError, "length"),
    ((IDX, IDX), {"route": "copy_engine"}, ValueError, "copy_engine"),
    ((IDX, IDX, 5), {}, ValueError, "layers"),
]


@pytest.mark.parametrize("args,kwargs,error,words", BAD_CALLS,
                         ids=["src-out-of-range", "dst-out-of-range", "int32", "lengths", "copy-engine", "layers"])
def test_bad_calls_raise_kv_copys_errors_and_write_nothing(args, kwargs, error, words):
    _, src, _, dst = quantise_pair()
    copy = kv.prepare("copy", src_view=src, dst_view=dst)
    with pytest.raises(error, match=words) as prepared:
        copy(*args, **kwargs)
    assert all((b == FP8_POISON).all() for b in fp8_bytes(dst))
    with pytest.raises(error) as plain:
        kv.copy(src, dst, *args, **kwargs)
    assert str(prepared.value) == str(plain.value)


def test_a_destination_made_read_only_after_prepare():
    _, src, _, dst = quantise_pair(place="host")  # NumPy's read-only flag: host arrays
    for bound in ({}, {"layers": None}):
        copy = kv.prepare("copy", src_view=src, dst_view=dst, **bound)
        copy(*CALLS[0], block_quota=1, num_warps_per_block=1)
        before = [b.copy() for b in fp8_bytes(dst)]
        np.asarray(dst.codes.v).setflags(write=False)
        with pytest.raises(ValueError, match="dst_view.codes.v"):
            copy(*CALLS[1])
        for got, want in zip(fp8_bytes(dst), before):
            np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match="dst_view.codes.v"):
            kv.copy(src, dst, *CALLS[1])
        np.asarray(dst.codes.v).setflags(write=True)
