"""Prepared transfers and the plan cache never write where they must not.

One table per way a plan could go wrong: raw tables re-read with checks on, a prepared transfer owning
its bound lists, bound memory that moves, and the plain-call cache found by value but never past a
changed writable flag or extent. Every case poisons the
destination and a guard region around it and checks, byte by byte, that nothing outside the
intended items changed.
"""
import gc
import weakref

import numpy as np
import pytest

import kvnumba as kv
from tests.helpers.cases import POISON
from kvnumba.api.transfer import plain
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import device, to_numpy

pytestmark = pytest.mark.needs_target

ITEM = 8  # bytes per item: one int64 word, so the tests can read tokens back as numbers
LAYERS = 2


def _guarded(rows, guard=4):
    """A poisoned ``[guard + rows + guard, ITEM]`` byte array and the ``rows`` in its middle."""
    backing = np.full((guard + rows + guard, ITEM), POISON, np.uint8)
    return backing, backing[guard:guard + rows]


def _source(rows, seed=0):
    return np.random.default_rng(seed).integers(0, 200, (rows, ITEM), dtype=np.uint8)


# --- check=True (and KVNUMBA_CHECK=1) reads raw tables again on a prepared transfer -------

GUARD = 4  # poisoned rows around each small layer


def _raw_table_case():
    """Layers a raw table points to, and layers of 4 tokens (inside poisoned guard rows) it will point to
    after prepare."""
    big = [device(np.full((16, ITEM), POISON, np.uint8)) for _ in range(LAYERS)]
    backings = [device(_guarded(4, GUARD)[0]) for _ in range(LAYERS)]
    small = [b[GUARD:GUARD + 4] for b in backings]
    kv.layer_table(big)  # registers every layer's size, as SGLang's pools are registered
    kv.layer_table(small)
    src = [device(_source(16, seed=i)) for i in range(LAYERS)]
    table = np.array([to_address(b) for b in big], np.uint64)
    return src, big, small, backings, table


def to_address(array):
    from kvnumba.arrays import array_info

    return array_info(array, "layer").ptr


@pytest.mark.parametrize("how", ["check=True", "bound check=True", "KVNUMBA_CHECK"])
def test_prepared_check_reads_a_changed_raw_table_again(how, request):
    if how == "KVNUMBA_CHECK":
        request.getfixturevalue("always_check")
    src, big, small, backings, table = _raw_table_case()
    dst_table = device(table)
    options = {"check": True} if how == "bound check=True" else {}
    load = kv.prepare(kv.transfer_kv_all_layer_mla, src_layers=kv.layer_table(src), dst_layers=dst_table,
                      item_size=ITEM, num_layers=LAYERS, **options)
    call_options = {"check": True} if how == "check=True" else {}
    idx = device(np.array([1, 10], np.int64))
    load(idx, idx, 1, 1, **call_options)  # in range of the big layers: copied
    for layer in range(LAYERS):
        got = to_numpy(big[layer])
        np.testing.assert_array_equal(got[[1, 10]], to_numpy(src[layer])[[1, 10]])
    # The table now points to 4-token layers: token 10 is out of range for them, and must be refused.
    moved = np.array([to_address(s) for s in small], np.uint64)
    _overwrite(dst_table, moved)
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[1\] = 10 is out of range"):
        load(idx, idx, 1, 1, **call_options)
        kv.check_errors()
    # Indices the host reads (the simulator's) are refused before the launch; indices in GPU memory are
    # bounded by the kernel, which copies the in-range item (token 1) and skips token 10.
    written = {GUARD + 1} if not SIMULATOR else set()
    for layer in range(LAYERS):
        rows = to_numpy(backings[layer])
        for row in range(len(rows)):
            if row in written:
                np.testing.assert_array_equal(rows[row], to_numpy(src[layer])[1])
            else:
                assert (rows[row] == POISON).all(), f"layer {layer} row {row} was written"
        assert (to_numpy(big[layer])[[0, 2, 3, 4, 5]] == POISON).all()


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU, unknown addresses are asked of the driver")
def test_prepared_check_refuses_an_unknown_address_in_a_changed_raw_table():
    src, big, small, backings, table = _raw_table_case()
    dst_table = device(table)
    load = kv.prepare(kv.transfer_kv_all_layer_mla, src_layers=kv.layer_table(src), dst_layers=dst_table,
                      item_size=ITEM, num_layers=LAYERS)
    stranger = np.full((16, ITEM), POISON, np.uint8)  # never given to kv.layer_table
    _overwrite(dst_table, np.array([to_address(stranger)] * LAYERS, np.uint64))
    idx = device(np.array([1], np.int64))
    with pytest.raises(kv.BadAddressError, match=r"dst_layers\[0\] = 0x[0-9a-f]+ is not in any layer kvnumba knows"):
        load(idx, idx, 1, 1, check=True)
    assert (stranger == POISON).all()


def _overwrite(table, values):
    if isinstance(table, np.ndarray):
        table[:] = values
    else:
        table.copy_to_device(values)


# --- a prepared transfer owns the arrays of a bound list ------------------------------------

@pytest.mark.parametrize("op", ["transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf"])
def test_replacing_an_element_of_a_bound_list_changes_nothing(op):
    rows, page = 8, 4
    src = _source(rows)
    if op == "transfer_kv_direct":
        dst_list = [device(np.full((rows, ITEM), POISON, np.uint8)) for _ in range(2)]
        load = kv.prepare(kv.transfer_kv_direct, src_layers=[device(src), device(src)], dst_layers=dst_list,
                          page_size=page)
    else:
        pf = device(src.reshape(2, 1, page, ITEM))
        dst_list = [device(np.full((rows, ITEM), POISON, np.uint8)) for _ in range(2)]
        load = kv.prepare(kv.transfer_kv_per_layer_direct_pf_lf, src_ptrs=[pf, pf], dst_ptrs=dst_list, layer_id=0,
                          page_size=page)
    first = weakref.ref(dst_list[0])
    replacement = device(np.full((rows, ITEM), POISON, np.uint8))
    dst_list[0] = replacement  # the caller's list changes; the transfer's does not
    gc.collect()
    assert first() is not None  # the transfer keeps the array it was prepared with alive
    idx = np.arange(page, dtype=np.int64)
    load(idx, idx)
    np.testing.assert_array_equal(to_numpy(first())[:page], src[:page])  # written where prepared
    assert (to_numpy(replacement) == POISON).all()  # the new element is not


# --- bound memory that moves is refused, never followed -------------------------------------

@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays stand for device memory on the simulator only")
@pytest.mark.parametrize("new_rows", [4, 32])  # shrunk (a write would land past its end) or grown (moved)
@pytest.mark.parametrize("which", ["dst", "src"])
def test_a_bound_array_resized_in_place_is_refused(which, new_rows):
    rows = 16
    src, dst = _source(rows), np.full((rows, ITEM), POISON, np.uint8)
    load = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=ITEM)
    idx = np.array([1, 12], np.int64)
    load(idx, idx, 1, 1)
    resized = dst if which == "dst" else src
    resized.resize((new_rows, ITEM), refcheck=False)  # new memory; the old block is freed
    dst[...] = POISON
    with pytest.raises(kv.BufferMovedError, match=rf"^{which} moved since kv.prepare.*nothing was written"):
        load(idx, idx, 1, 1)
    assert (dst == POISON).all()


def test_a_bound_array_that_did_not_move_is_fine_after_a_failed_check():
    rows = 16
    src, dst = _source(rows), np.full((rows, ITEM), POISON, np.uint8)
    load = kv.prepare(kv.transfer_kv_per_layer_mla, src=device(src), dst=device(dst), item_size=ITEM)
    idx = device(np.array([3], np.int64))
    load(idx, idx, 1, 1)
    np.testing.assert_array_equal(to_numpy(load.bound["dst"])[3], src[3])


# --- the plain-call cache, found by value, never past a changed flag or extent --------------

@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays stand for device memory on the simulator only")
@pytest.mark.parametrize("change", ["read-only", "resized smaller", "resized larger", "reshaped"])
def test_plain_calls_see_what_changed_in_place(change):
    rows = 16
    src = _source(rows)
    backing, dst = _guarded(rows)
    dst = dst.copy()  # its own memory, so that NumPy can resize it
    idx = np.array([1, 2], np.int64)
    kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, 1, 1)  # a plan cached for this dst
    dst[...] = POISON
    if change == "read-only":
        dst.flags.writeable = False
        with pytest.raises(ValueError, match=r"dst is a read-only NumPy array; a destination must be writable"):
            kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, 1, 1)
        assert (dst == POISON).all()
        return
    if change == "reshaped":  # the same bytes: the same plan, the same bounds
        dst.shape = (rows // 2, 2 * ITEM)
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, 1, 1)
        np.testing.assert_array_equal(dst.reshape(rows, ITEM)[[1, 2]], src[[1, 2]])
        return
    new_rows = 4 if change == "resized smaller" else 64
    dst.resize((new_rows, ITEM), refcheck=False)
    dst[...] = POISON
    far = np.array([1, new_rows], np.int64)
    with pytest.raises(kv.IndexOutOfRangeError, match=rf"dst_indices\[1\] = {new_rows} is out of range.*\[0, {new_rows}\)"):
        kv.transfer_kv_per_layer_mla(src, dst, idx if new_rows > rows else far, far, ITEM, 1, 1)
    assert (dst == POISON).all()


def test_a_fresh_view_of_the_same_bytes_reuses_the_plan():
    """SGLang passes ``pool[layer]`` on every call: a new object over the same bytes hits."""
    layers, rows = 3, 8
    pool = device(np.stack([_source(rows, seed=i) for i in range(layers)]))
    dst = device(np.full((rows, ITEM), POISON, np.uint8))
    cache = plain("transfer_kv_per_layer_mla")._cache
    idx = device(np.array([0, 5], np.int64))
    for layer in range(layers):
        kv.transfer_kv_per_layer_mla(pool[layer], dst, idx, idx, ITEM, 1, 1)
    misses = cache.misses
    for layer in range(layers):
        kv.transfer_kv_per_layer_mla(pool[layer], dst, idx, idx, ITEM, 1, 1)  # fresh views: all hits
        np.testing.assert_array_equal(to_numpy(dst)[[0, 5]], to_numpy(pool[layer])[[0, 5]])
    assert cache.misses == misses


def test_bound_layer_tables_stay_the_callers_objects():
    """A table from kv.layer_table carries its layers' sizes: the transfer keeps that very object."""
    layers = [device(np.zeros((8, ITEM), np.uint8)) for _ in range(LAYERS)]
    table = kv.layer_table(layers)
    load = kv.prepare(kv.transfer_kv_all_layer_mla, src_layers=table, dst_layers=kv.layer_table(
        [device(np.zeros((8, ITEM), np.uint8)) for _ in range(LAYERS)]), item_size=ITEM, num_layers=LAYERS)
    assert load.bound["src_layers"] is table
    assert load._plan.raw_tables is False


def test_a_known_geometry_at_new_addresses_is_rebound_and_checked():
    """A miss on buffers of a geometry seen before reuses its checks (KernelPlan.rebind) and does again
    what depends on addresses: the bytes land right, a misaligned buffer is refused."""
    from kvnumba.plan import kernel_plan

    rebinds = []
    layers, rows = 4, 8
    pool = np.stack([_source(rows, seed=i) for i in range(layers)])
    dst = np.full((layers, rows, ITEM), POISON, np.uint8)
    idx = np.array([0, 6], np.int64)
    # Every layer's buffers stay alive, so no two calls can see the same addresses (a GPU allocator reuses
    # freed memory: a call on reused addresses is a plan-cache hit, not a rebind).
    placed = [(device(pool[layer]), device(dst[layer]), device(idx), device(idx)) for layer in range(layers)]
    with kernel_plan.watching(lambda plan: plan.rebound and rebinds.append(1)):
        for src, dst_layer, src_idx, dst_idx in placed:
            kv.transfer_kv_per_layer_mla(src, dst_layer, src_idx, dst_idx, ITEM, 1, 1)
    assert len(rebinds) >= layers - 1  # the first builds the geometry; the others are rebound
    backing = np.zeros(rows * ITEM + 8, np.uint8)
    odd = backing[1:1 + rows * ITEM].reshape(rows, ITEM)  # the same geometry, one byte off
    with pytest.raises(ValueError, match=r"src must start at an 8-byte aligned address"):
        kv.transfer_kv_per_layer_mla(odd, device(dst[0]), device(idx), device(idx), ITEM, 1, 1)


def test_rebound_plans_copy_exactly_what_full_plans_copy():
    """Per-layer loads over many layers of one pool: rebound plans against the NumPy reference."""
    from kvnumba import reference

    layers, rows = 6, 16
    rng = np.random.default_rng(5)
    host_k, host_v = (rng.integers(0, 255, (layers, rows, ITEM), dtype=np.uint8) for _ in range(2))
    dev_k, dev_v = (np.full((layers, rows, ITEM), POISON, np.uint8) for _ in range(2))
    gk, gv = device(dev_k), device(dev_v)
    hk, hv = device(host_k), device(host_v)
    si, di = rng.permutation(rows)[:5].astype(np.int64), rng.permutation(rows)[:5].astype(np.int64)
    for layer in range(layers):
        kv.transfer_kv_per_layer(hk[layer], gk[layer], hv[layer], gv[layer], device(si), device(di), ITEM, 1, 1)
        reference.transfer_kv_per_layer(host_k[layer], dev_k[layer], host_v[layer], dev_v[layer], si, di, ITEM)
    np.testing.assert_array_equal(to_numpy(gk), dev_k)
    np.testing.assert_array_equal(to_numpy(gv), dev_v)


# --- prepared kv.copy: views are checked on every call, and at prepare ------------------------------

def test_prepared_copy_refuses_a_view_whose_buffer_changed_in_place():
    torch = pytest.importorskip("torch")
    from tests.helpers.placement import TORCH_PLACE

    layers, rows = 2, 8
    src = kv.LayerFirst([TORCH_PLACE["device"](_source(rows, seed=i)) for i in range(layers)])
    dst_buffers = [TORCH_PLACE["device"](np.full((rows, ITEM), POISON, np.uint8)) for _ in range(layers)]
    dst = kv.LayerFirst(dst_buffers)
    idx = torch.arange(3) if SIMULATOR else torch.arange(3, device="cuda")
    load = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=1, block_quota=1, num_warps_per_block=1)
    load(idx, idx)
    assert (to_numpy(dst_buffers[1])[:3] == to_numpy(src.k[1])[:3]).all()
    dst_buffers[1].resize_(2, ITEM)  # fewer bytes, same object: the view's record no longer holds
    with pytest.raises(ValueError, match=r"dst_view .*changed in place since it was made"):
        load(idx, idx)


def test_prepared_copy_without_layers_is_checked_at_prepare():
    src = kv.LayerFirst(device(np.zeros((2, 8, ITEM), np.uint8)))
    with pytest.raises(TypeError, match=r"dst_view must be a kvnumba cache view"):
        kv.prepare(kv.copy, src_view=src, dst_view=np.zeros(4))
    with pytest.raises(TypeError, match=r"stream must be a CUDA stream"):
        kv.prepare(kv.copy, src_view=src, dst_view=src, stream="junk")


def test_a_cached_copy_plan_does_not_keep_its_views_alive():
    src = kv.LayerFirst(device(np.zeros((2, 8, ITEM), np.uint8)))
    dst = kv.LayerFirst(device(np.zeros((2, 8, ITEM), np.uint8)))
    idx = device(np.arange(2, dtype=np.int64))
    kv.copy(src, dst, idx, idx, block_quota=1, num_warps_per_block=1)
    gone = weakref.ref(dst)
    del dst
    gc.collect()
    assert gone() is None
