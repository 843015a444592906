"""The pipelined FP8 load (``kvnumba.kernels.dequantise_pipelined``): which copies take it, and that it writes what the
reference writes, byte for byte, where its ring of passes is exercised: many items a warp, several passes an
item (the last part-filled), windows of several layers, heads of 8 and of 1024, and items whose indices are out
of range (skipped and flagged while the walk goes on). Every layout pair, formats, MLA and special codes go
through it in ``tests/fp8/test_copy.py`` (heads of 8 there)."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.plan import fp8_plan
from kvnumba.kernels import dequantise_pipelined
from tests.fp8.cases import FP8_LAYOUTS, LAYOUTS, copy_plan, eight_past_sixteen, make_fp8, make_view, view_bytes
from tests.helpers.placement import PLACE

pytestmark = pytest.mark.needs_target
PLAIN_LAYOUTS = list(LAYOUTS)


def test_which_heads_it_takes():
    assert [dequantise_pipelined.takes(d) for d in (8, 16, 64, 128, 512, 1024)] == [True] * 6
    assert [dequantise_pipelined.takes(d) for d in (0, 4, 12, 48, 96, 576)] == [False] * 6
    rng = np.random.default_rng(0)
    for head_dim, fast in ((8, True), (48, False)):
        _, src = make_fp8("PageFirst", 1, 4, 2, 2, head_dim, rng=rng)
        _, dst = make_view("LayerFirst", 1, 4, 2, 2, head_dim, rng, poison=True, mla=False,
                           place=("device", "numba"))
        assert bool(fp8_plan.Fp8Plan(src, dst, None).slots) is fast, head_dim


@pytest.mark.parametrize("head_dim", [48, 0, 128.0, True])
def test_a_head_size_it_does_not_take_is_a_value_error(head_dim):
    from kvnumba.kernels import layouts

    with pytest.raises(ValueError, match="head_dim"):
        dequantise_pipelined.get_kernel(layouts.PAGE_FIRST, layouts.LAYER_TABLE, False, head_dim=head_dim)


def test_not_where_its_rings_do_not_fit(monkeypatch):
    """On a GPU whose blocks may ask for less shared memory than the rings take (sm_120: 99 KiB), a load goes
    through the general kernel, unless it goes in whole passes (8 heads of 128), whose rings are shorter; on an
    H200 (227 KiB) every such load goes through the pipelined one."""
    from types import SimpleNamespace

    monkeypatch.setattr(fp8_plan, "SIMULATOR", False)
    monkeypatch.setattr(fp8_plan, "compute_capability", lambda device: (12, 0))
    codes = SimpleNamespace(bases=[0, 4096])
    monkeypatch.setattr(fp8_plan, "shared_limit", lambda device: 99 * 1024)
    assert fp8_plan._wide_slots("dequantise", 2, 128, 0, object(), codes) == 0
    assert fp8_plan._wide_slots("dequantise", 8, 128, 0, object(), codes) == 1
    assert fp8_plan._wide_slots("quantise", 2, 128, 0, object(), codes)  # the wide quantiser needs none
    monkeypatch.setattr(fp8_plan, "shared_limit", lambda device: 227 * 1024)
    assert dequantise_pipelined.SHARED_BYTES <= 227 * 1024
    assert fp8_plan._wide_slots("dequantise", 2, 128, 0, object(), codes) == 1


def _load(fp8_name, plain_name, g, si, di, layers=None, mla=False, warps=1, seed=0, fmt="e4m3", dtype="bfloat16",
          special_codes=True):
    rng = np.random.default_rng(seed)
    src_np, src = make_fp8(fp8_name, *g, mla=mla, rng=rng, fmt=fmt, dtype=dtype, special_codes=special_codes)
    dst_np, dst = make_view(plain_name, *g, rng, poison=True, mla=mla, place=("device", "numba"))
    assert copy_plan(src, dst, layers).slots  # the pipelined kernel
    kv.copy(src, dst, si, di, layers, block_quota=1, num_warps_per_block=warps)
    qr.copy(src_np, dst_np, si, di, layers)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def _load_flagging(src_np, src, dst_np, dst, si, di, bad):
    """A load whose items ``bad`` are out of range, indices in GPU memory: it raises IndexOutOfRangeError, and
    every other item is written as the reference writes it."""
    with pytest.raises(kv.IndexOutOfRangeError):
        kv.copy(src, dst, PLACE["device"](si), PLACE["device"](di), block_quota=1, num_warps_per_block=1,
                check=True)
    keep = ~np.isin(np.arange(len(si)), bad)
    qr.copy(src_np, dst_np, si[keep], di[keep])
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_many_items_and_passes_through_one_warps_ring():
    """One warp, 6 items of 2 layers, 20 heads of 64: 320 granules an item and layer, three passes (the last
    part-filled), 36 passes through a ring of two stages."""
    rng = np.random.default_rng(1)
    si, di = rng.choice(8, 6, replace=False), rng.choice(8, 6, replace=False)
    _load("PageFirst", "LayerFirst", (2, 8, 4, 20, 64), si, di)
    _load("LayerFirst", "PageHead", (2, 8, 4, 20, 64), si, di, seed=2)


def test_a_window_of_layers_and_more_warps_than_items():
    rng = np.random.default_rng(3)
    si, di = rng.choice(8, 3, replace=False), rng.choice(8, 3, replace=False)
    _load("PageHead", "PageFirst", (3, 8, 4, 2, 16), si, di, layers=range(1, 3), warps=4)


def test_heads_of_8_and_of_1024():
    _load("PageFirst", "LayerFirst", (1, 4, 2, 3, 8), np.array([3, 0, 2]), np.array([1, 2, 3]))
    _load("LayerFirst", "PageFirst", (1, 4, 2, 1, 1024), np.array([1, 3]), np.array([0, 2]), mla=True)


def test_out_of_range_items_are_skipped_and_flagged(device_path):
    """Items 2 and 5 out of range (source, then destination): skipped, flagged, and the walk goes on to the
    items after them, in the same warp."""
    g = (1, 8, 4, 4, 32)
    rng = np.random.default_rng(4)
    src_np, src = make_fp8("PageFirst", *g, rng=rng)
    dst_np, dst = make_view("LayerFirst", *g, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = np.arange(7, dtype=np.int64), np.arange(7, dtype=np.int64)[::-1].copy()
    si[2], di[5] = 8 + 3, -1
    _load_flagging(src_np, src, dst_np, dst, si, di, (2, 5))


def test_more_than_32_items_a_warp(device_path):
    """One warp walks 70 items, one pass each, through its ring; items 31, 32 and 69 (the last) are out of range
    (past the end, negative, 2**40): skipped and flagged, and the walk goes on after each."""
    g = (1, 80, 4, 1, 8)  # 80 tokens; a token's K and V of a layer are one pass
    rng = np.random.default_rng(5)
    src_np, src = make_fp8("PageFirst", *g, rng=rng)
    dst_np, dst = make_view("LayerFirst", *g, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = rng.permutation(80)[:70], rng.permutation(80)[:70]
    si[31], di[32], si[69] = 80, -3, 1 << 40
    assert copy_plan(src, dst, None).slots  # the pipelined kernel
    _load_flagging(src_np, src, dst_np, dst, si, di, (31, 32, 69))


def test_a_pass_of_many_heads_and_heads_longer_than_a_pass():
    """A pass's scales come one a head, copied by lanes 0.. of the warp: 40 heads of 8 (80 K and V heads, three
    rows of lanes) and of 16 (two rows); heads of 2048 codes span two passes each (one scale for both)."""
    _load("PageFirst", "LayerFirst", (1, 4, 2, 40, 8), np.array([3, 0, 2]), np.array([1, 2, 3]))
    _load("LayerFirst", "PageHead", (2, 4, 2, 40, 16), np.array([1, 3]), np.array([0, 2]), seed=1)
    _load("PageFirst", "LayerFirst", (1, 4, 2, 1, 2048), np.array([2, 1]), np.array([3, 0]), seed=2)
    _load("LayerFirst", "PageFirst", (1, 4, 2, 1, 2048), np.array([1]), np.array([2]), mla=True, seed=3)


# Whole passes (``dequantise_pipelined.takes_whole``): one kind's granules of a token fill whole passes of 128, so
# the kernel keeps no per-granule state. Every FP8 layout as the source, the plain layouts in turn as the
# destination; then the head sizes whose lanes map to heads differently (a row of lanes two heads, one head,
# 32 heads) and two passes a kind.
WHOLE_PAIRS = [(q, PLAIN_LAYOUTS[i % len(PLAIN_LAYOUTS)]) for i, q in enumerate(FP8_LAYOUTS)]


@pytest.mark.parametrize("fp8_name,plain_name", WHOLE_PAIRS, ids=[f"{q}-{p}" for q, p in WHOLE_PAIRS])
def test_whole_passes_every_fp8_layout(fp8_name, plain_name):
    assert dequantise_pipelined.takes_whole(8, 128)
    _load(fp8_name, plain_name, (1, 4, 2, 8, 128), np.array([3, 0]), np.array([1, 2]))


@pytest.mark.parametrize("heads,head_dim", [(16, 64), (4, 256), (128, 8), (32, 32), (16, 128)])
def test_whole_passes_of_each_head_size(heads, head_dim):
    assert dequantise_pipelined.takes_whole(heads, head_dim)
    _load("PageFirst", "LayerFirst", (2, 4, 2, heads, head_dim), np.array([2, 0, 3]), np.array([1, 3, 0]),
          layers=range(0, 2))


@pytest.mark.parametrize("heads,head_dim,fmt,dtype", [(8, 128, "e4m3", "bfloat16"), (16, 64, "e5m2", "float16"),
                                                      (4, 256, "e4m3", "float16"), (32, 32, "e5m2", "bfloat16"),
                                                      (128, 8, "e4m3", "bfloat16")])
def test_whole_passes_of_plain_codes(heads, head_dim, fmt, dtype):
    """No NaN code (nor e5m2 infinity) and finite scales: a lane converts its pass with the packed conversions
    alone (one code in 128 is special in the random cases above, so nearly every lane there takes the exact
    element functions)."""
    _load("PageFirst", "LayerFirst", (2, 4, 2, heads, head_dim), np.array([2, 0, 3]), np.array([1, 3, 0]),
          fmt=fmt, dtype=dtype, special_codes=False, seed=7)


@pytest.mark.parametrize("special_codes", [False, True])
def test_whole_passes_8_bytes_past_16(special_codes):
    """Codes and destination 8 bytes past a 16-byte boundary: the lanes store 8 bytes at a time where whole
    passes otherwise store 16, and write what the reference writes."""
    L, T, P, H, D = 1, 4, 2, 8, 128
    rng = np.random.default_rng(8)
    src_np, placed = make_fp8("PageFirst", L, T, P, H, D, rng=rng, special_codes=special_codes)
    src = kv.Fp8View(kv.PageFirst(*[eight_past_sixteen(np.asarray(c)) for c in (src_np.codes.k, src_np.codes.v)]),
                     placed.scales, "e4m3", dtype="bfloat16")
    poison = np.full((L, T, H, D), 0xA5A5, np.uint16)
    dst_np = kv.LayerFirst(poison.copy(), poison.copy())
    dst = kv.LayerFirst(eight_past_sixteen(poison), eight_past_sixteen(poison))
    si, di = np.array([3, 0, 2]), np.array([1, 2, 0])
    assert copy_plan(src, dst, None).slots  # the pipelined kernel
    kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=1)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_which_copies_go_in_whole_passes():
    assert [dequantise_pipelined.takes_whole(h, d) for h, d in ((8, 128), (16, 64), (4, 256), (128, 8))] == [True] * 4
    # heads longer than 32 granules, a kind short of a pass, a kind ending part-way through one, a head it does
    # not take
    pipelined = dequantise_pipelined
    assert [pipelined.takes_whole(h, d) for h, d in ((1, 1024), (2, 512), (2, 128), (12, 128), (16, 48))] == [False] * 5
    assert pipelined.shared_bytes(8, 128) < pipelined.shared_bytes(2, 128) == pipelined.SHARED_BYTES


def test_whole_passes_with_non_finite_scales_and_out_of_range_items(device_path):
    """A head scaled by infinity, one by NaN (the exact element functions), NaN codes among the rest, and items 1
    and 4 out of range (source past the end, destination negative): skipped and flagged, the walk goes on."""
    g = (1, 8, 4, 8, 128)
    rng = np.random.default_rng(6)
    src_np, src = make_fp8("PageFirst", *g, rng=rng)
    for view in (src_np, src):
        for which, value in (("k", np.inf), ("v", np.nan)):
            buffer = view.scales.buffers(which)[0]
            if hasattr(buffer, "copy_to_host"):  # a GPU array's bytes are not NumPy's
                values = buffer.copy_to_host()
                values[2, 0, 5] = value  # token 2, layer 0, head 5
                buffer.copy_to_device(values)
            else:
                buffer[2, 0, 5] = value
    dst_np, dst = make_view("LayerFirst", *g, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = np.array([2, 9, 0, 5, 7, 1]), np.array([6, 0, 3, 1, -2, 4])
    _load_flagging(src_np, src, dst_np, dst, si, di, (1, 4))
