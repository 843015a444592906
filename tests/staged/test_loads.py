"""The staged (bulk-copy) load kernel: every per-layer load it serves, byte for byte against the
reference, with the index patterns that decide how it moves them (long runs as bulk pieces, short
runs and random indices as direct batches, runs cut at page edges), blocks of few runs copied as the
register kernel copies them, and the fallbacks.

``KVNUMBA_LOAD_PATH=staged`` forces the path, so these run on the simulator (the kernel's Python
twin) and on a GPU (sm_90+: the real TMA kernel). A watch on the plans made (``kernel_plan.watching``)
asserts the staged kernel was really chosen.
"""
import numpy as np
import pytest
from numba import cuda

import kvnumba as kv
from kvnumba import config
from tests.helpers.cases import POISON, Case, run_case
from kvnumba.plan import kernel_plan
from kvnumba.plan import tensor_maps
from kvnumba.kernels import staged
from kvnumba.kernels.layouts import LAYER_FIRST, PAGE_FIRST, PAGE_HEAD
from tests.helpers.placement import device, host, to_numpy

pytestmark = pytest.mark.needs_target

POOL = 64


@pytest.fixture
def staged_choices(monkeypatch, fresh_plans):
    """Forces the staged path; records whether each entry point's plan made took it."""
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
    chosen = []

    def record(plan):
        if plan.spec.name != "copy":
            chosen.append(plan.source_maps is not None)

    with kernel_plan.watching(record):
        yield chosen


def _patterns(page_size):
    rng = np.random.default_rng(7)
    runs = np.arange(3, 3 + 40)  # one long run, not page aligned: bulk pieces 16/16/8 (or page-cut)
    mixed = np.concatenate([np.arange(s, s + n) for s, n in ((0, 1), (4, 2), (9, 3), (14, 9), (30, 5), (40, 17))])
    pages = (rng.permutation(POOL // page_size)[:3, None] * page_size + np.arange(page_size)).reshape(-1)
    return {
        "runs": runs,
        "mixed": mixed,
        "random": rng.choice(POOL, 24, replace=False),
        "pages": pages,
        "one_last_token": np.array([POOL - 1]),
        "runs_to_the_end": np.arange(POOL - 21, POOL),
    }


def _case(op, pattern, item_size, page_size=1, head_num=1, warps=3):
    src = _patterns(page_size)[pattern]
    dst = np.random.default_rng(len(src)).permutation(POOL)[:len(src)]
    return Case(op, item_size=item_size, num_layers=2, page_size=page_size, head_num=head_num, pool=POOL,
                count=len(src), src_place="host", dst_place="device", num_warps_per_block=warps, layer_id=1,
                indices=(src, dst), dtype="int8")


PATTERNS = list(_patterns(16))
# The tuned ring with every block on it: a block of few runs would otherwise copy through registers
# (test_blocks_of_few_runs_copy_through_registers), and the ring's direct batches go untested.
RING = staged.SHAPE._replace(fallback_runs=0)
LOADS = [  # (entry point, item size, page size, heads): sizes where bulk pieces and direct batches both occur
    ("transfer_kv_per_layer", 1024, 1, 1),
    ("transfer_kv_per_layer", 4096, 1, 1),  # an item of two 2 KB map rows
    ("transfer_kv_per_layer_pf_lf", 1024, 1, 1),
    ("transfer_kv_per_layer_ph_lf", 2048, 16, 8),
    ("transfer_kv_per_layer_ph_lf", 512, 4, 2),  # small pages: pieces cut at every page edge
    ("transfer_kv_per_layer_mla", 1152, 1, 1),
    ("transfer_kv_per_layer_mla_pf_lf", 1152, 1, 1),
]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("op,item_size,page_size,heads", LOADS)
def test_staged_load_matches_reference(staged_choices, staged_ring, op, item_size, page_size, heads, pattern):
    staged_ring(RING)
    run_case(_case(op, pattern, item_size, page_size, heads))
    assert staged_choices == [True]


@pytest.mark.parametrize("warps", [2, 5])
def test_staged_load_any_number_of_store_warps(staged_choices, staged_ring, warps):
    staged_ring(RING)
    run_case(_case("transfer_kv_per_layer_pf_lf", "mixed", 1024, warps=warps))
    assert staged_choices == [True]


@pytest.mark.parametrize("pattern", ["mixed", "random", "runs"])
def test_small_rings_and_fewer_store_warps(staged_choices, staged_ring, pattern):
    """Two data buffers behind eight posts, two of four consumer warps writing bulk pieces, direct
    posts of eight items: buffers and slots come round many times in one call."""
    staged_ring(staged.StagedShape(stages=2, stage_bytes=8 * 1024, slots=8, store_warps=2, direct_batch=8,
                                   min_bulk_bytes=2048, fallback_runs=0))
    run_case(_case("transfer_kv_per_layer_pf_lf", pattern, 1024, warps=5))
    assert staged_choices == [True]


@pytest.mark.parametrize("pattern", ["random", "mixed", "pages"])
@pytest.mark.parametrize("op,item_size,page_size,heads", [LOADS[2], LOADS[3], LOADS[6]])
def test_blocks_of_few_runs_copy_through_registers(staged_choices, op, item_size, page_size, heads, pattern):
    """The tuned ring (``fallback_runs`` on): a block whose sample finds few runs posts the register
    mark and every warp, the loader too, copies its register-kernel share; the others use the ring."""
    run_case(_case(op, pattern, item_size, page_size, heads, warps=3))
    assert staged_choices == [True]


def _few_runs(sources, min_run, fallback_runs, *, page=0, limit=POOL, head_major=False):
    """One warp's vote of ``staged.make_few_runs`` over ``sources`` (source token indices)."""
    from kvnumba.arrays import array_info
    from kvnumba.kernels.jit import kernel

    few_runs = staged.make_few_runs(fallback_runs, head_major)

    def vote(indices, n, out, limit, page, min_run):
        lane = cuda.threadIdx.x
        found = few_runs(lane, 0, n, indices, limit, page, min_run)
        if lane == 0:
            out[0] = 1 if found else 0

    indices = device(np.asarray(sources, dtype=np.int64))
    out = device(np.full(1, 7, dtype=np.int64))
    kernel(vote)[1, 32](array_info(indices, "indices").ptr, len(sources), out, limit, page, min_run)
    return bool(to_numpy(out)[0])


@pytest.mark.filterwarnings("ignore:.*Grid size")  # one warp is the point: Numba's occupancy warning
def test_the_sample_tells_few_runs_from_many():
    """32 samples of ``min_run`` items: random sources hold none, pages of 64 nearly all; the threshold
    counts them, and fewer items than ``min_run`` can hold no run."""
    rng = np.random.default_rng(3)
    pages = (rng.permutation(16)[:, None] * 64 + np.arange(64)).reshape(-1)
    random = rng.permutation(1024)[:512]
    assert _few_runs(random, 4, 10, limit=1024)
    assert not _few_runs(pages, 4, 10, limit=1024)
    assert not _few_runs(random, 4, 0, limit=1024)  # 0: never
    assert _few_runs(np.arange(3), 4, 1, limit=1024)  # too few items for one run
    assert _few_runs(pages, 4, 10, limit=100)  # runs past the source's end are no runs
    half = np.concatenate([pages[:256], random[:256]])  # about 16 of 32 samples hold
    assert not _few_runs(half, 4, 10, limit=1024) and _few_runs(half, 4, 24, limit=1024)
    # The bench's shape: a block of 4096 items in 64-token pages (32 places evenly spread would all fall
    # on a page's last token), and 16-token pages (about 13 of 16 places start a 4-token run).
    for page in (64, 16):
        block = (rng.permutation(8192 // page)[:4096 // page, None] * page + np.arange(page)).reshape(-1)
        assert not _few_runs(block, 4, 24, limit=8192)
    # page-head: a run never crosses a page (4-token runs in 4-token pages: only those starting a page
    # hold, about 8 of 32)
    across = np.arange(2, 2 + 512)
    assert not _few_runs(across, 4, 16, limit=1024, page=64, head_major=True)
    assert _few_runs(across, 4, 16, limit=1024, page=4, head_major=True)


@pytest.mark.parametrize("pattern", ["mixed", "pages"])
@pytest.mark.parametrize("op,item_size,page_size,heads", [LOADS[2], LOADS[3], LOADS[6]])
def test_pieces_written_by_the_store_warps(staged_choices, staged_ring, pattern, op, item_size, page_size, heads):
    """With ``bulk_stores=False`` the store warps write each landed piece out through their registers."""
    staged_ring(staged.StagedShape(bulk_stores=False, store_warps=2))
    run_case(_case(op, pattern, item_size, page_size, heads, warps=4))
    assert staged_choices == [True]


@pytest.mark.parametrize("ring", [dict(fallback_runs=33), dict(leave_out="everything"), dict(slots=2)])
def test_a_bad_ring_is_refused(ring):
    with pytest.raises(ValueError, match="bad staged ring"):
        staged.get_staged_kernel(PAGE_FIRST, LAYER_FIRST, False, staged.StagedShape(**ring))


def test_one_warp_per_block_runs_the_register_kernel(staged_choices):
    """A staged block needs a loader and a store warp: one warp per block takes the register kernel."""
    run_case(_case("transfer_kv_per_layer_pf_lf", "runs", 1024, warps=1))
    assert staged_choices == [True]


@pytest.mark.parametrize("item_size", [24, 40])
def test_items_the_bulk_unit_cannot_describe_stay_on_registers(staged_choices, item_size):
    """Rows of the bulk-copy unit are multiples of 16 bytes: other items load through registers."""
    run_case(_case("transfer_kv_per_layer_pf_lf", "runs", item_size))
    assert staged_choices == [False]


def test_register_setting_never_stages(staged_choices, monkeypatch):
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "register")
    run_case(_case("transfer_kv_per_layer_pf_lf", "runs", 1024))
    assert staged_choices == [False]


def test_a_bad_setting_refuses_the_call(monkeypatch, fresh_plans):
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "fast")
    with pytest.raises(ValueError, match="^KVNUMBA_LOAD_PATH must be one of"):
        run_case(_case("transfer_kv_per_layer_pf_lf", "runs", 1024))


@pytest.mark.parametrize("side", ["src", "dst"])
def test_out_of_range_items_are_skipped_and_reported(staged_choices, device_path, side):
    """An out-of-range token inside a run: the run is cut there, the item skipped and flagged, every
    other item copied (check=True raises after the copy, as the register kernel does). On the
    simulator the indices are host memory, checked before any launch: the kernel's guard is tested
    by taking the device path there too."""
    item = 1024
    rng = np.random.default_rng(3)
    src_k = rng.integers(-128, 127, (POOL, 2, item), dtype=np.int8)
    src_v = rng.integers(-128, 127, (POOL, 2, item), dtype=np.int8)
    dst_k = np.full((POOL, item), POISON, np.uint8).view(np.int8)
    dst_v = dst_k.copy()
    src = np.arange(10, 40)
    dst = np.arange(30)
    (src if side == "src" else dst)[12] = POOL + 5  # out of range, in the middle of the run
    gk, gv = device(dst_k), device(dst_v)
    with pytest.raises(kv.IndexOutOfRangeError, match=rf"{side}_indices\[12\]"):
        kv.transfer_kv_per_layer_pf_lf(host(src_k), gk, host(src_v), gv, device(src), device(dst), 1, item, 2 * item,
                                       2, 3, check=True)
    assert staged_choices == [True]
    got_k, got_v = to_numpy(gk), to_numpy(gv)
    for j, token in enumerate(src):
        if j == 12:
            continue
            np.testing.assert_array_equal(got_k[dst[j]], src_k[token, 1])
            np.testing.assert_array_equal(got_v[dst[j]], src_v[token, 1])
    untouched = np.setdiff1d(np.arange(POOL), np.delete(dst, 12))
    assert (got_k[untouched].view(np.uint8) == POISON).all() and (got_v[untouched].view(np.uint8) == POISON).all()


# --- how sources are described to the bulk-copy unit ------------------------------------------------

def test_run_limits_fit_a_stage():
    for item, mla in ((1024, False), (2048, False), (1152, True), (4096, False), (16, False)):
        longest, shortest = staged.run_limits(item, mla)
        assert staged.piece_bytes(1 << longest, item, mla) <= staged.SHAPE.stage_bytes
        assert 1 <= shortest <= 1 << longest
        assert shortest * item >= staged.SHAPE.min_bulk_bytes or shortest == 1 << longest
    # 8 tokens of K and V in 32 KB; 8 KB per operation
    assert staged.run_limits(2048, False, staged.StagedShape(stage_bytes=32 * 1024)) == (3, 4)


def test_a_pieces_v_items_start_128_byte_aligned():
    """A tensor load's shared-memory destination must be 128-byte aligned: V's items start at the next
    boundary after K's, and the padding counts against the stage (or no token fits: the register kernel)."""
    assert [staged.second_offset(n, 48) for n in (1, 2, 8)] == [128, 128, 384]
    assert staged.piece_bytes(2, 48, False) == 128 + 96 and staged.piece_bytes(2, 48, True) == 96
    ring = staged.StagedShape(stage_bytes=1024)
    assert staged.run_limits(400, False, ring) == (0, 1)  # 512 + 400 fit; 2 tokens (896 + 800) do not
    # One token: 640 + 560 bytes, though 2 * 560 would fit: no piece fits
    assert staged.run_limits(560, False, ring._replace(stage_bytes=1152)) is None


def test_page_first_geometry():
    sizes, strides, rows, head_major = tensor_maps.geometry(PAGE_FIRST, 64 * 3 * 2048, 2048, 3 * 2048, 1, 1)
    assert (sizes, strides, rows, head_major) == ((256, 1, 3, 64, 1), (2048, 2048, 3 * 2048, 64 * 3 * 2048), 1, False)


def test_wide_items_split_into_rows_of_at_most_2KB():
    sizes, strides, rows, _ = tensor_maps.geometry(LAYER_FIRST, 10 * 6144, 6144, 0, 1, 1)
    assert rows == 3 and sizes[:2] == (256, 3) and strides[:2] == (2048, 6144)


def test_page_head_geometry():
    # Memory is [pages=4, heads=8, page=16, layers=2, 256 bytes]; the map puts heads before tokens, so a
    # box (every head of a run of tokens) lands token-major.
    item, heads, page, layers = 2048, 8, 16, 2
    nbytes = 4 * heads * page * layers * (item // heads)
    sizes, strides, map_heads, head_major = tensor_maps.geometry(PAGE_HEAD, nbytes, item, layers * item, page, heads)
    assert sizes == (32, 2, 8, 16, 4) and map_heads == 8 and head_major
    assert strides == (256, 16 * 2 * 256, 2 * 256, 8 * 16 * 2 * 256)


@pytest.mark.parametrize("args", [
    (PAGE_FIRST, 64 * 3 * 24, 24, 3 * 24, 1, 1),  # 24-byte items: not 16-byte rows
    (PAGE_FIRST, 64 * 3 * 2048 + 8, 2048, 3 * 2048, 1, 1),  # a partial last token
    (PAGE_HEAD, 4 * 8 * 16 * 2 * 8, 64, 128, 16, 8),  # 8-byte heads
])
def test_geometry_refuses_what_the_unit_cannot_read(args):
    assert tensor_maps.geometry(*args) is None


# --- which kernel a call takes -----------------------------------------------------------------------

class _Launches:
    """Stands in for a plan's bound kernel: counts launches, then launches the real one."""

    def __init__(self, bound):
        self.bound, self.count = bound, 0
        self.blocks = bound.blocks

    def launch(self, *args):
        self.count += 1
        return self.bound.launch(*args)


def test_small_calls_take_the_register_kernel(staged_choices):
    """A plan picks the staged kernel per call: below ``staged_from`` items (512 in auto mode, where
    the ring's set-up costs more than it saves) the register kernel runs; both give the same bytes."""
    item, rng = 1024, np.random.default_rng(5)
    src_k, src_v = (rng.integers(-128, 127, (POOL, 2, item), dtype=np.int8) for _ in "kv")
    dst_k, dst_v = (device(np.zeros((POOL, item), np.int8)) for _ in "kv")
    load = kv.prepare(kv.transfer_kv_per_layer_pf_lf, src_k=host(src_k), dst_k=dst_k, src_v=host(src_v), dst_v=dst_v,
                      item_size=item, src_layout_dim=2 * item, block_quota=2, num_warps_per_block=3)
    plan = load._plan
    assert staged_choices == [True] and plan.staged_from == 1  # forced: every call of two warps or more
    plan.staged_from = 20
    plan.kernel, plan.register_kernel = staged_spy, register_spy = _Launches(plan.kernel), _Launches(plan.register_kernel)
    for count, staged_launches, register_launches in ((19, 0, 1), (20, 1, 1)):
        src, dst = np.arange(count), np.arange(POOL - count, POOL)
        load(device(src), device(dst), 1)
        assert (staged_spy.count, register_spy.count) == (staged_launches, register_launches)
        np.testing.assert_array_equal(to_numpy(dst_k)[dst], src_k[src, 1])
        np.testing.assert_array_equal(to_numpy(dst_v)[dst], src_v[src, 1])


def test_a_bad_setting_refuses_a_view_copy(monkeypatch, fresh_plans):
    """kv.copy builds its plans through the same path: the setting is read and checked there too."""
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "fast")
    src = kv.LayerFirst(host(np.zeros((2, 8, 16), np.uint8)))
    dst = kv.LayerFirst(device(np.zeros((2, 8, 16), np.uint8)))
    idx = device(np.arange(2, dtype=np.int64))
    with pytest.raises(ValueError, match="^KVNUMBA_LOAD_PATH must be one of"):
        kv.copy(src, dst, idx, idx)


def test_map_blocks_of_plans_that_went_away_are_reused(staged_choices):
    """A small map store: plans come and go, their blocks are recycled, and every load stays exact."""
    import gc

    store = tensor_maps.MapStore()
    store.SLAB_BLOCKS, store.RECYCLE_AT = 2, 2
    with config.override(map_store=store):
        rng = np.random.default_rng(3)
        for round_ in range(8):
            src = host(rng.integers(0, 255, (32, 1024), dtype=np.uint8))
            dst = device(np.full((32, 1024), POISON, np.uint8))
            load = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=1024)
            idx = device(np.arange(20, dtype=np.int64))
            load(idx, idx, 1, 3)
            got = to_numpy(dst)
            np.testing.assert_array_equal(got[:20], to_numpy(src)[:20])
            assert (got[20:] == POISON).all()
            del load
            gc.collect()
    assert staged_choices == [True] * 8
    assert len(store._slabs) <= 2  # recycled, not one slab per pair of plans


def test_a_forced_copy_shape_builds_its_own_staged_kernel():
    """The direct items' inner loop is compiled into the staged kernel: another copy shape is another kernel."""
    from kvnumba.kernels.warp_copy import CopyShape

    tuned = staged.get_staged_kernel(PAGE_FIRST, LAYER_FIRST, False)
    with config.override(copy_shape=CopyShape(words=4, wide=False, paired=False)):
        forced = staged.get_staged_kernel(PAGE_FIRST, LAYER_FIRST, False)
    assert forced is not tuned
    assert staged.get_staged_kernel(PAGE_FIRST, LAYER_FIRST, False) is tuned


def test_auto_stages_only_where_the_ring_fits_a_block(monkeypatch):
    """``auto`` takes the staged kernel for a pinned-host -> GPU load on sm_90+ only where a block may ask for
    the ring's shared memory: on an H200 (227 KiB), not on sm_120 (99 KiB), where its launch would fail."""
    from types import SimpleNamespace

    from kvnumba.kernels import layouts, staged
    from kvnumba.plan import staged_plan, tensor_maps

    item, tokens = 2048, 64
    plan = SimpleNamespace(window=1, device=0, item_size=item, head_num=8)
    monkeypatch.setattr(staged_plan, "SIMULATOR", False)
    monkeypatch.setattr(tensor_maps, "compute_capability", lambda device: (12, 0))

    def recipe(limit):
        monkeypatch.setattr(tensor_maps, "shared_limit", lambda device: limit)
        return staged_plan._recipe("auto", staged.SHAPE, plan, layouts.PAGE_FIRST, layouts.LAYER_FIRST, False,
                                   2 * tokens * item, 2 * item, 16, (True, False))

    assert staged.SHAPE.shared_bytes <= 227 * 1024
    assert recipe(227 * 1024) is not None
    assert recipe(99 * 1024) is None


# --- kv.copy: a one-layer load between views takes the staged kernel too ------------------------------

@pytest.fixture
def staged_copies(monkeypatch, fresh_plans):
    """Forces the staged path; records whether each kv.copy plan made took it."""
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
    chosen = []

    def record(plan):
        if plan.spec.name == "copy":
            chosen.append(plan.source_maps is not None)

    with kernel_plan.watching(record):
        yield chosen


def _view_load(src_name, dst_name, pattern, layers, *, mla=False, geometry=(2, POOL, 16, 8, 64), warps=3):
    """kv.copy of ``layers`` (kv.copy's argument) from a pinned-host view to a GPU view, and reference.copy on
    NumPy twins: every destination byte must agree (poisoned where nothing is written)."""
    from kvnumba import reference
    from tests.helpers.view_cases import POISON as VIEW_POISON, assert_same_bytes, make_view, view_bytes

    rng = np.random.default_rng(11)
    src_np, src = make_view(src_name, *geometry, rng, poison=False, mla=mla, place=("host", "numba"))
    dst_np, dst = make_view(dst_name, *geometry, rng, poison=True, mla=mla, place=("device", "numba"))
    si = _patterns(geometry[2])[pattern].astype(np.int64)
    di = rng.permutation(POOL)[:len(si)].astype(np.int64)
    kv.copy(src, dst, device(si), device(di), layers, block_quota=2, num_warps_per_block=warps, route="kernel")
    reference.copy(src_np, dst_np, si, di, layers)
    assert assert_same_bytes(view_bytes(dst), view_bytes(dst_np), VIEW_POISON, f"{src_name} -> {dst_name}") > 0


VIEW_LOADS = [  # (source view, destination view, MLA): the sources a tensor map pictures, into one layer's items
    ("PageFirst", "LayerFirst", False),
    ("PageFirst", "LayerFirstList", False),  # SGLang's host pool into its per-layer device arrays
    ("LayerFirst", "LayerFirstList", False),  # a layer-first map is the copied layer's, not layer 0's
    ("PageHead", "LayerFirst", False),
    ("PageUnified", "LayerFirst", False),  # SGLang's page-unified pool of one head group
    ("PageFirst", "LayerFirstList", True),
]


@pytest.mark.parametrize("pattern", ["runs", "mixed", "random", "pages"])
@pytest.mark.parametrize("src_name,dst_name,mla", VIEW_LOADS, ids=[f"{s}-{d}{'-mla' if m else ''}"
                                                                     for s, d, m in VIEW_LOADS])
def test_a_view_load_of_one_layer_is_staged(staged_copies, staged_ring, src_name, dst_name, mla, pattern):
    staged_ring(RING)
    _view_load(src_name, dst_name, pattern, 1, mla=mla)
    assert staged_copies == [True]


@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("pattern", ["runs", "mixed", "random", "pages"])
def test_a_page_unified_load_of_head_groups_is_staged(staged_copies, staged_ring, groups, pattern):
    """SGLang's page-unified pool of several head groups ``[T/P, G, L, 2, P, H/G, D]``: the map pictures each group
    as a page-head pool's head, so one box brings a token's groups together, as the layer-first item keeps them;
    every head of every token lands where SGLang's definition says, nothing else is written."""
    from kvnumba import reference

    staged_ring(RING)
    rng = np.random.default_rng(groups)
    L, P, H, D = 2, 16, 8, 16  # 256-byte items: a group's chunk is 128 or 64 bytes
    pool_np = rng.integers(0, 2**16, kv.PageUnified.pool_shape(L, POOL, P, (H, D), groups, False), dtype=np.uint16)
    dst_np = [np.full((L, POOL, H, D), 0xA5A5, np.uint16) for _ in range(2)]
    dst = kv.LayerFirst(device(dst_np[0]), device(dst_np[1]))
    si = _patterns(P)[pattern].astype(np.int64)
    di = rng.permutation(POOL)[:len(si)].astype(np.int64)
    kv.copy(kv.PageUnified(host(pool_np)), dst, device(si), device(di), 1, block_quota=2, num_warps_per_block=3,
            route="kernel")
    assert staged_copies == [True]
    reference.copy(kv.PageUnified(pool_np), kv.LayerFirst(*dst_np), si, di, 1)
    per_group = H // groups
    for kind, got in enumerate((to_numpy(dst.k), to_numpy(dst.v))):
        np.testing.assert_array_equal(got, dst_np[kind])
        for token, slot in zip(si[:3], di[:3]):  # SGLang's definition, head by head, beside the reference's
            for head in range(H):
                want = pool_np[token // P, head // per_group, 1, kind, token % P, head % per_group]
                np.testing.assert_array_equal(got[1, slot, head], want)


def test_a_view_load_of_layer_zero_and_of_the_last(staged_copies, staged_ring):
    """Layer-first sources at both ends of the buffer: each map starts at its own layer."""
    staged_ring(RING)
    for layer in (0, 2):
        _view_load("LayerFirst", "LayerFirst", "mixed", layer, geometry=(3, POOL, 16, 8, 64))
    assert staged_copies == [True, True]


@pytest.mark.parametrize("layers", [None, range(0, 2)])
def test_a_view_copy_of_several_layers_stays_on_registers(staged_copies, layers):
    """The staged kernel loads one layer a call: a copy of several layers takes the register kernel."""
    _view_load("PageFirst", "LayerFirst", "runs", layers)
    assert staged_copies == [False]


def test_register_setting_never_stages_a_view_load(staged_copies, monkeypatch):
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "register")
    _view_load("PageFirst", "LayerFirstList", "runs", 1)
    assert staged_copies == [False]
