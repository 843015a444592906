"""Staged FP8 loads (``kernels.dequantise_staged``): ``kv.copy(fp8_view, plain_view, ..., layer)`` from pinned host
memory through the bulk-copy ring, dequantised from shared memory, byte for byte against
``kvnumba.quant_reference.copy`` with the destination poisoned. ``KVNUMBA_LOAD_PATH=staged`` forces the
path (the simulator's TMA twin; on a GPU, sm_90+: the real kernel); ``kernel_plan.watching`` asserts
it was chosen. Launches are small: the simulator runs a Python thread per CUDA thread."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.kernels import dequantise_staged, staged
from kvnumba.plan import fp8_staged_plan, kernel_plan
from kvnumba.plan.fp8_plan import Fp8Plan
from tests.fp8.cases import copy_plan, make_fp8, make_view, view_bytes
from tests.helpers.placement import device

pytestmark = pytest.mark.needs_target

T = 64  # tokens
# A small ring: pieces of a few tokens, two buffers behind eight posts, so buffers and slots come round
# many times in one call; every block on the ring (no register fallback).
RING = staged.StagedShape(stages=2, stage_bytes=1024, slots=8, min_bulk_bytes=64, direct_batch=8, fallback_runs=0)


@pytest.fixture
def choices(monkeypatch, fresh_plans):
    """Forces the staged path; records whether each FP8 plan made took it."""
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
    chosen = []
    with kernel_plan.watching(lambda plan: isinstance(plan, Fp8Plan) and chosen.append(plan.staged is not None)):
        yield chosen


def _indices(pattern, page):
    rng = np.random.default_rng(11)
    if pattern == "runs":
        src = np.arange(3, 3 + 30)
    elif pattern == "mixed":
        src = np.concatenate([np.arange(s, s + n) for s, n in ((0, 1), (4, 2), (9, 3), (14, 9), (30, 5), (40, 11))])
    elif pattern == "pages":
        src = (rng.permutation(T // page)[:3, None] * page + np.arange(page)).reshape(-1)
    else:
        src = rng.choice(T, 20, replace=False)
    dst = rng.permutation(T)[:len(src)]
    return src.astype(np.int64), dst.astype(np.int64)


def load_case(fp8_name, plain_name, pattern="mixed", *, H=2, D=16, P=8, mla=False, fmt="e4m3", dtype="bfloat16",
              layer=1, warps=3, quota=1, seed=0):
    rng = np.random.default_rng(seed)
    g = (2, T, P, 1 if mla else H, D)
    src_np, src = make_fp8(fp8_name, *g, mla=mla, place="host", fmt=fmt, dtype=dtype, rng=rng)
    dst_np, dst = make_view(plain_name, *g, rng, poison=True, mla=mla, place=("device", "numba"))
    si, di = _indices(pattern, P)
    kv.copy(src, dst, device(si), device(di), layer, block_quota=quota, num_warps_per_block=warps)
    qr.copy(src_np, dst_np, si, di, layer)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"{fp8_name} -> {plain_name}, {pattern}")


SOURCES = ["PageFirst", "PageHead", "LayerFirst", "LayerFirstList"]


@pytest.mark.parametrize("pattern", ["runs", "mixed", "pages", "random"])
@pytest.mark.parametrize("fp8_name", SOURCES)
def test_staged_dequantising_load(choices, staged_ring, fp8_name, pattern):
    staged_ring(RING)
    load_case(fp8_name, "LayerFirst", pattern)
    assert choices == [True]


@pytest.mark.parametrize("plain_name", ["LayerFirstList", "PageFirst", "VllmFlashAttn", "FlashInferHND"])
def test_any_destination_layout(choices, staged_ring, plain_name):
    staged_ring(RING)
    load_case("PageFirst", plain_name, "mixed", seed=1)
    assert choices == [True]


# The random codes hold e5m2's infinities and some scales are 0: the simulator's float32 product inf * 0 is
# NaN, as on the GPU, but NumPy warns (the kernel then writes the canonical NaN, as the reference does).
@pytest.mark.filterwarnings("ignore:.*invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt,dtype", [("e5m2", "float16"), ("e4m3", "float16"), ("e5m2", "bfloat16")])
def test_formats_and_dtypes(choices, staged_ring, fmt, dtype):
    staged_ring(RING)
    load_case("PageHead", "LayerFirst", "runs", fmt=fmt, dtype=dtype, seed=2)
    assert choices == [True]


@pytest.mark.parametrize("fp8_name", ["PageFirst", "LayerFirstList"])
def test_mla_and_wide_heads(choices, staged_ring, fp8_name):
    """MLA (one head of 64), then heads of 32 codes: more chunks a token than lanes, more scales than a
    lane's four loads (five heads, three consumer warps sharing a piece)."""
    staged_ring(RING._replace(stage_bytes=4096))
    load_case(fp8_name, "LayerFirst", "runs", H=1, D=64, mla=True, seed=3)
    load_case(fp8_name, "LayerFirst", "mixed", H=5, D=32, warps=4, seed=4)
    assert choices == [True, True]


def test_tuned_ring_and_register_blocks(choices):
    """The tuned ring (fallback on): random indices make a block of few runs, copied by the register loop."""
    load_case("PageFirst", "LayerFirst", "random", warps=2)
    load_case("PageFirst", "LayerFirst", "pages", P=16, H=4, D=64, warps=2, seed=5)
    assert choices == [True, True]


def test_blocks_of_at_most_the_kernels_warps(choices, staged_ring, monkeypatch):
    """A call that asks for more warps a block than the staged kernel's ``WARPS`` (compiled for the registers of
    that many) launches blocks of ``WARPS``, more items a warp, and copies every item; the register kernel's
    calls keep the warps they ask for."""
    from kvnumba.plan import per_call

    launched = []
    real = per_call.launch_shape
    monkeypatch.setattr(per_call, "launch_shape",
                        lambda count, quota, warps: launched.append(warps) or real(count, quota, warps))
    monkeypatch.setattr(dequantise_staged, "WARPS", 2)  # a small block for the simulator
    load_case("PageFirst", "LayerFirst", "mixed", warps=4, seed=6)
    load_case("LayerFirst", "PageFirst", "runs", warps=1, seed=7)  # one warp a block: the register kernel
    assert choices == [True, True] and launched == [2, 1]
    assert dequantise_staged.REGISTERS == 128  # the real kernel's 16 warps of 128 registers fill the block's 65536


def test_out_of_range_items_are_skipped_and_reported(choices, staged_ring, device_path):
    """An out-of-range token inside a run: skipped and flagged, every other item dequantised."""
    staged_ring(RING)
    rng = np.random.default_rng(6)
    g = (2, T, 8, 2, 16)
    src_np, src = make_fp8("PageFirst", *g, place="host", rng=rng)
    dst_np, dst = make_view("LayerFirst", *g, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = np.arange(10, 40), np.arange(30)
    si[12] = T + 5
    with pytest.raises(kv.IndexOutOfRangeError):
        kv.copy(src, dst, device(si), device(di), 1, block_quota=1, num_warps_per_block=3, check=True)
    keep = np.arange(30) != 12
    qr.copy(src_np, dst_np, si[keep], di[keep], 1)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
    assert choices == [True]


@pytest.mark.parametrize("case", ["D=8", "register setting", "two layers", "quantise"])
def test_what_stays_on_the_register_kernel(choices, monkeypatch, case):
    """Heads of codes not a multiple of 16, the register setting, windows of more than one layer and
    quantising copies take the register FP8 kernel (and are still exact)."""
    rng = np.random.default_rng(7)
    D = 8 if case == "D=8" else 16
    if case == "register setting":
        monkeypatch.setenv("KVNUMBA_LOAD_PATH", "register")
    g = (2, 16, 4, 2, D)
    src_np, src = make_fp8("PageFirst", *g, place="host", rng=rng)
    dst_np, dst = make_view("LayerFirst", *g, rng, poison=True, mla=False, place=("device", "numba"))
    idx = np.arange(8, dtype=np.int64)
    layers = None if case == "two layers" else 1
    if case == "quantise":
        kv.copy(dst, src, device(idx), device(idx), layers, block_quota=1, num_warps_per_block=2)
        assert choices == [False]
        return
    kv.copy(src, dst, device(idx), device(idx), layers, block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, idx, idx, layers)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
    assert choices == [False]


def test_auto_stages_pinned_host_loads(monkeypatch, fresh_plans):
    """``auto`` (a GPU of compute capability 9.0 pictured here) stages one-layer pinned-host -> GPU loads: heads
    of 8 * 2**k, which the pipelined kernel would take otherwise (slower at bq=2 on an H200), and other heads."""
    from kvnumba.arrays import HOST
    from kvnumba.plan import tensor_maps

    monkeypatch.setattr(fp8_staged_plan, "SIMULATOR", False)
    monkeypatch.setattr(tensor_maps, "compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(tensor_maps, "shared_limit", lambda device: 227 * 1024)  # an H200's block
    real = fp8_staged_plan.auto_stages  # the simulator's "pinned" arrays say device 0: pictured as host ones
    monkeypatch.setattr(fp8_staged_plan, "auto_stages", lambda src, dst, device: real(HOST, dst, device))
    slots = {}
    for head_dim in (16, 48):
        _, src = make_fp8("PageFirst", 2, 16, 4, 1, head_dim, place="host", rng=np.random.default_rng(8))
        _, dst = make_view("LayerFirst", 2, 16, 4, 1, head_dim, np.random.default_rng(8), poison=True, mla=False,
                           place=("device", "numba"))
        plan = copy_plan(src, dst, 1)
        slots[head_dim] = plan.slots
        assert plan.staged is not None, head_dim
    assert slots[16] > 0 and slots[48] == 0  # the pipelined kernel takes heads of 16, not of 48
    assert real(HOST, 0, 0)
    assert not real(0, 0, 0)  # GPU to GPU
    assert not real(HOST, HOST, 0)  # host to host
    monkeypatch.setattr(tensor_maps, "compute_capability", lambda device: (8, 9))
    assert not real(HOST, 0, 0)


def test_auto_does_not_stage_where_the_ring_does_not_fit(monkeypatch, fresh_plans):
    """``auto`` binds the staged kernel only where a block may ask for the ring's shared memory: on an H200
    (227 KiB), not on sm_120 (99 KiB), where the launch would fail."""
    from kvnumba.plan import tensor_maps

    _, src = make_fp8("PageFirst", 2, 16, 4, 1, 48, place="host", rng=np.random.default_rng(8))
    _, dst = make_view("LayerFirst", 2, 16, 4, 1, 48, np.random.default_rng(8), poison=True, mla=False,
                       place=("device", "numba"))
    plan = copy_plan(src, dst, 1)
    monkeypatch.setattr(fp8_staged_plan, "auto_stages", lambda *args: True)  # a pinned-host -> GPU load on sm_90+
    monkeypatch.setattr(tensor_maps, "shared_limit", lambda device: 227 * 1024)
    assert fp8_staged_plan.dequantise_staged.SHAPE.shared_bytes <= 227 * 1024
    assert fp8_staged_plan.bind_staged(plan, src, dst) is not None
    monkeypatch.setattr(tensor_maps, "shared_limit", lambda device: 99 * 1024)
    assert fp8_staged_plan.bind_staged(plan, src, dst) is None


def test_stage_holds_codes_and_scales():
    for item, heads, mla in ((2048, 16, False), (576, 1, True), (32, 2, False)):
        longest, _ = dequantise_staged.run_limits(item, heads, mla, dequantise_staged.SHAPE)
        assert staged.piece_bytes(1 << longest, item, mla, 4 * heads) <= dequantise_staged.SHAPE.stage_bytes
    # V's codes from a 128-byte boundary: one token of 560 codes a buffer and 4 scales fits 1280 bytes, not 1200
    assert dequantise_staged.run_limits(560, 1, False, RING._replace(stage_bytes=1280)) == (0, 1)
    assert dequantise_staged.run_limits(560, 1, False, RING._replace(stage_bytes=1152)) is None
    assert dequantise_staged.SHAPE.shared_bytes <= 227 * 1024
    # the ring's stage holds the longest piece (32 tokens) of 8 heads of 128 codes with their scales
    assert dequantise_staged.run_limits(8 * 128, 8, False, dequantise_staged.SHAPE)[0] == 5


# Heads of 8: a token's scales of one layer are 32 bytes, a row the bulk unit can bring. Pieces of 4 or 8
# tokens (512-byte codes per buffer at least): each kind's scales are then a multiple of 128 bytes.
RING_BOXES = staged.StagedShape(stages=2, stage_bytes=4096, slots=8, min_bulk_bytes=512, direct_batch=8,
                                fallback_runs=0)


@pytest.fixture
def found(monkeypatch, fresh_plans):
    """Forces the staged path; records each FP8 plan's ``StagedFp8`` (None: the register kernel)."""
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
    seen = []
    with kernel_plan.watching(lambda plan: isinstance(plan, Fp8Plan) and seen.append(plan.staged)):
        yield seen


@pytest.mark.parametrize("pattern", ["runs", "pages", "mixed"])
@pytest.mark.parametrize("fp8_name", ["PageFirst", "LayerFirst", "LayerFirstList"])
def test_scales_come_in_boxes(found, staged_ring, fp8_name, pattern):
    """Heads of a multiple of 4: the bulk unit brings a piece's scales (a box a kind) with its codes, and the
    load writes what the reference writes."""
    staged_ring(RING_BOXES)
    load_case(fp8_name, "LayerFirst", pattern, H=8, D=16, seed=5)
    assert [f is not None and f.scale_maps is not None for f in found] == [True]


def test_scales_by_the_loaders_lanes_where_boxes_cannot(found, staged_ring):
    """A page-head source (a head's scale alone, 4 bytes, between other heads'), heads of 2 (8-byte rows) and
    ``scale_boxes=False``: the loader's lanes copy the scales, and the loads write what the reference writes."""
    from kvnumba import config

    staged_ring(RING_BOXES)
    load_case("PageHead", "LayerFirst", "runs", H=8, D=16, seed=6)
    load_case("PageFirst", "LayerFirst", "runs", H=2, D=64, seed=6)
    with config.override(scale_boxes=False):
        load_case("PageFirst", "LayerFirst", "runs", H=8, D=16, seed=6)
    assert [f is not None for f in found] == [True] * 3
    assert [f.scale_maps for f in found] == [None] * 3
