"""kvnumba.reference covers FP8: ``quantise``/``dequantise`` are quant_reference's, and ``reference.copy`` with an
``Fp8View`` on either side gives quant_reference.copy's bytes (and kv.copy's), so a user checking ``kv.copy``
against ``kvnumba.reference.copy`` needs nothing else."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba import reference
from tests.fp8.cases import fp8_bytes, make_fp8, make_view, view_bytes

L, T, P, H, D = 2, 8, 4, 2, 8


def test_the_reference_offers_the_quantisation():
    assert reference.quantise is qr.quantise and reference.dequantise is qr.dequantise
    assert {"quantise", "dequantise", "copy"} <= set(reference.__all__)
    assert all(callable(getattr(reference, name)) for name in reference.__all__)


def _pair(kind, seed, fmt="e4m3"):
    """Two identical NumPy copies of a plain (``"plain"``) or FP8 (``"fp8"``) source, and of a poisoned
    destination of the other kind (or FP8 for FP8 -> FP8)."""
    def make(what, fill):
        rng = np.random.default_rng(seed)
        if what == "plain":
            return make_view("PageFirst", L, T, P, H, D, rng, poison=not fill, mla=False)[0]
        return make_fp8("PageHead", L, T, P, H, D, place=None, fmt=fmt, rng=rng if fill else None)[0]

    return make


@pytest.mark.parametrize("src_kind,dst_kind", [("plain", "fp8"), ("fp8", "plain"), ("fp8", "fp8")])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_reference_copy_is_quant_reference_copy(src_kind, dst_kind, fmt):
    make = _pair(src_kind, 3, fmt)
    si, di = np.array([5, 0, 7], np.int64), np.array([1, 6, 2], np.int64)
    def everything(dst):
        return fp8_bytes(dst) if dst_kind == "fp8" else view_bytes(dst)

    results = []
    for copy in (reference.copy, qr.copy):
        src, dst = make(src_kind, True), make(dst_kind, False)
        copy(src, dst, si, di)
        results.append(everything(dst))
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    untouched = everything(make(dst_kind, False))
    assert any((got != before).any() for got, before in zip(results[0], untouched)), "nothing was written"


def test_reference_copy_checks_fp8_indices_as_it_does_plain_ones():
    make = _pair("plain", 0)
    src, dst = make("plain", True), make("fp8", False)
    with pytest.raises(TypeError, match="src_indices must be a 1-D int64 array"):
        reference.copy(src, dst, np.array([0, 1], np.int32), np.array([0, 1], np.int64))


def test_reference_copy_with_layers():
    make = _pair("plain", 1)
    si = di = np.array([2, 3], np.int64)
    src, dst, want = make("plain", True), make("fp8", False), make("fp8", False)
    reference.copy(src, dst, si, di, layers=1)
    qr.copy(src, want, si, di, layers=1)
    for got, expected in zip(fp8_bytes(dst), fp8_bytes(want)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.needs_target
def test_kv_copy_matches_kvnumba_reference():
    rng = np.random.default_rng(9)
    src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_fp8("PageFirst", L, T, P, H, D)
    si, di = np.array([1, 4], np.int64), np.array([7, 0], np.int64)
    kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=2)
    reference.copy(src_np, dst_np, si, di)
    for got, want in zip(fp8_bytes(dst), fp8_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
