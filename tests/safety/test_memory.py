"""Memory a transfer must not write or must know: destinations that must not be written, tables whose
layers must be known, and memory a transfer reads to find its way. Each class is a table of cases over
every entry point it applies to; each case asserts the error, its message, and that no destination byte changed.
"""
import threading

import numpy as np
import pytest

import kvnumba as kv
from tests.helpers.cases import POISON
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import device, host, to_numpy
from tests.helpers.safety_cases import OPS, build

pytestmark = pytest.mark.needs_target

DST_TABLES = [op for op in OPS if op in ("transfer_kv_all_layer", "transfer_kv_all_layer_mla")]
SRC_TABLES = [op for op in OPS if "all_layer" in op]


def _read_only_kinds(tmp_path):
    """Read-only host arrays of 16 x 8 bytes, filled with POISON, as users make them."""
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes([POISON]) * 128)
    frozen = np.full((16, 8), POISON, np.uint8)
    frozen.flags.writeable = False
    return {
        "flag": frozen,
        "memmap": np.memmap(path, dtype=np.uint8, mode="r", shape=(16, 8)),
        "frombuffer": np.frombuffer(bytes([POISON]) * 128, dtype=np.uint8).reshape(16, 8),
    }


READ_ONLY = ["flag", "memmap", "frombuffer"]


# --- the copy-engine entry points refuse read-only destinations ---------------------------------

@pytest.mark.skipif(not SIMULATOR, reason="NumPy destinations are device memory only on the simulator")
@pytest.mark.parametrize("kind", READ_ONLY)
@pytest.mark.parametrize("op", ["transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
                                "transfer_kv_all_layer_direct_lf_pf"])
def test_copy_engine_refuses_read_only_destinations(op, kind, tmp_path):
    ro = _read_only_kinds(tmp_path)[kind]
    idx = np.arange(8, dtype=np.int64)
    if op == "transfer_kv_direct":
        call = dict(src_layers=[np.ones((16, 8), np.uint8)] * 2, dst_layers=[np.zeros((16, 8), np.uint8), ro],
                    page_size=4)
        name = r"dst_layers\[1\]"
    elif op == "transfer_kv_per_layer_direct_pf_lf":
        call = dict(src_ptrs=[np.ones((4, 2, 4, 8), np.uint8)] * 2, dst_ptrs=[np.zeros((16, 8), np.uint8), ro],
                    layer_id=0, page_size=4)
        name = r"dst_ptrs\[1\]"
    else:
        pf_ro = ro.reshape(4, 1, 4, 8)
        call = dict(src_ptrs=[np.ones((16, 8), np.uint8)] * 2, dst_ptrs=[np.zeros((4, 1, 4, 8), np.uint8), pf_ro],
                    page_size=4)
        name = r"dst_ptrs\[1\]"
    with pytest.raises(ValueError, match=rf"{name} is a read-only .*a destination must be writable"):
        getattr(kv, op)(src_indices=idx, dst_indices=idx, **call)
    assert (np.asarray(ro) == POISON).all()


# --- kernel entry points: the same for every destination kind --------------------------------

@pytest.mark.skipif(not SIMULATOR, reason="NumPy destinations are device memory only on the simulator")
@pytest.mark.parametrize("kind", READ_ONLY)
@pytest.mark.parametrize("op", ["transfer_kv_per_layer_mla", "transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf"])
def test_kernels_refuse_read_only_destinations(op, kind, tmp_path):
    ro = _read_only_kinds(tmp_path)[kind]
    call = build(op, item_size=16, pool=8)
    name = "dst" if "mla" in op else "dst_k"
    with pytest.raises(ValueError, match=rf"{name} is a read-only .*a destination must be writable"):
        call.run(**{name: ro})
    assert (np.asarray(ro) == POISON).all() and call.untouched()


# --- layer tables: the layers a destination table points to must be writable; the table need not be

@pytest.mark.skipif(not SIMULATOR, reason="read-only host layers are a simulator case (GPU layers are device memory)")
@pytest.mark.parametrize("kind", READ_ONLY)
@pytest.mark.parametrize("op", DST_TABLES)
def test_destination_table_with_a_read_only_layer_is_refused(op, kind, tmp_path):
    call = build(op, item_size=16, pool=8)
    ro = _read_only_kinds(tmp_path)[kind]
    table_name = "dst_layers" if "mla" in op else "dst_k_layers"
    layers = [np.full((8, 16), POISON, np.uint8), ro.reshape(8, 16)]
    with pytest.raises(ValueError, match=rf"{table_name}\[1\] is a read-only layer; a destination must be writable"):
        call.run(**{table_name: kv.layer_table(layers)})
    assert (np.asarray(ro) == POISON).all() and call.untouched()


@pytest.mark.parametrize("op", DST_TABLES + ["transfer_kv_all_layer_lf_pf"])
def test_read_only_tables_are_fine_they_are_only_read(op):
    call = build(op, item_size=16, pool=8)
    for name, table in list(call.kwargs.items()):
        if name.endswith("layers") and isinstance(table, np.ndarray):
            table.flags.writeable = False
    call.run()
    call.run_reference()
    assert call.matches_reference()


# --- destinations overlapping a layer table or an index array --------------------------------------

@pytest.mark.skipif(not SIMULATOR, reason="builds a table inside a destination's NumPy memory")
@pytest.mark.parametrize("op", ["transfer_kv_all_layer_mla_lf_pf", "transfer_kv_all_layer_lf_pf"])
def test_destination_overlapping_the_source_table_is_refused(op):
    call = build(op, item_size=16, pool=8, num_layers=2)
    table_name = "src_layers" if "mla" in op else "src_k_layers"
    dst_name = "dst" if "mla" in op else "dst_k"
    dst = call.kwargs[dst_name]
    inside = dst.view(np.uint8).reshape(-1)[:16].view(np.uint64)  # a table living in the destination's bytes
    inside[:] = np.asarray(call.kwargs[table_name]).view(np.uint64)
    before = dst.copy()
    with pytest.raises(kv.OverlapError, match=rf"{dst_name} overlaps {table_name}"):
        call.run(**{table_name: inside})
    np.testing.assert_array_equal(dst, before)


@pytest.mark.parametrize("side", ["src_indices", "dst_indices"])
@pytest.mark.parametrize("op", ["transfer_kv_per_layer_mla", "transfer_kv_per_layer", "transfer_kv_all_layer_lf_pf"])
def test_destination_overlapping_an_index_array_is_refused(op, side, device_path):
    call = build(op, item_size=16, pool=8)
    dst_name = "dst" if "mla" in op else "dst_k"
    dst = call.kwargs[dst_name]
    # Indices whose memory is the destination's first bytes (a view of the same allocation).
    if SIMULATOR:
        raw = dst.view(np.uint8).reshape(-1)
        inside = raw[:32].view(np.int64)
        inside[:] = [0, 1, 2, 3]
    else:
        from numba import cuda

        inside = cuda.as_cuda_array(dst).view(np.uint8).reshape(-1)[:32].view(np.int64)
        inside.copy_to_device(np.arange(4, dtype=np.int64))
    before = to_numpy(dst).copy()
    with pytest.raises(kv.OverlapError, match=rf"{dst_name} overlaps {side}"):
        call.run(**{side: inside})
    np.testing.assert_array_equal(to_numpy(dst), before)


# --- threads: simulated launches are serialised; GPU launches are per thread ---------------------

def _in_threads(worker, count):
    """``worker(0)`` .. ``worker(count - 1)``, each in its own thread, all started before any is joined."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_threads_with_different_launch_shapes_copy_the_right_items():
    """Threads calling at once, each with its own launch shape and buffers: every result exact."""
    errors = []

    def worker(seed):
        try:
            for round_ in range(3):
                call = build("transfer_kv_per_layer_mla", item_size=8 * (seed + 1), pool=16, count=8 + seed,
                             seed=seed * 10 + round_, block_quota=1 + seed % 2, num_warps_per_block=1 + seed % 3)
                call.run()
                call.run_reference()
                if not call.matches_reference():
                    errors.append(f"thread {seed} round {round_}: wrong bytes")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {type(error).__name__}: {error}")

    _in_threads(worker, 4)
    assert not errors, errors


def test_threads_share_one_prepared_transfer():
    """One Transfer called from several threads (per-thread parameter blocks) with different indices."""
    src = device(np.arange(64 * 8, dtype=np.uint8).reshape(64, 8))
    dst = device(np.zeros((64, 8), np.uint8))
    copy = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=8, block_quota=1,
                      num_warps_per_block=1)
    errors = []

    def worker(part):
        try:
            for _ in range(5):
                idx = device(np.arange(part * 16, part * 16 + 16, dtype=np.int64))
                copy(idx, idx)
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    _in_threads(worker, 4)
    assert not errors, errors
    np.testing.assert_array_equal(to_numpy(dst), np.arange(64 * 8, dtype=np.uint8).reshape(64, 8))


# --- pinned host memory as the kernel sees it --------------------------------------------------------

def test_pinned_host_destination_through_prepare():
    src = device(np.arange(16 * 8, dtype=np.uint8).reshape(16, 8))
    dst = host(np.full((16, 8), POISON, np.uint8))
    idx = device(np.array([2, 7], np.int64))
    kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=8)(idx, idx, check=True)
    got = to_numpy(dst)
    assert (got[[2, 7]] == to_numpy(src)[[2, 7]]).all() and (np.delete(got, [2, 7], axis=0) == POISON).all()


def test_merged_destination_ranges_find_every_overlap():
    """The fast path's binary search over merged destination ranges agrees with a plain scan."""
    from kvnumba.checks.overlap import merged, overlaps_any

    rng = np.random.default_rng(0)
    for _ in range(300):
        ranges = [("d", int(s), int(s + n)) for s, n in zip(rng.integers(0, 1000, 6), rng.integers(0, 80, 6))]
        starts, ends = merged(ranges)
        for start in range(0, 1100, 7):
            end = start + int(rng.integers(1, 40))
            want = any(s < end and start < e for _, s, e in ranges if e > s)
            assert overlaps_any(starts, ends, start, end) == want, (ranges, start, end)


def test_clearance_raises_as_the_plain_scan_does():
    """``Clearance.check`` (every plan's per-call test of its index arrays) raises exactly where
    ``check_disjoint`` does, with the same message; empty ranges, on either side, overlap nothing."""
    from kvnumba.checks.overlap import Clearance, check_disjoint

    def outcome(check):
        try:
            check()
        except kv.OverlapError as e:
            return str(e)
        return None

    rng = np.random.default_rng(1)
    for _ in range(200):
        ranges = [(f"d{i}", int(s), int(s + n)) for i, (s, n) in
                  enumerate(zip(rng.integers(0, 1000, 8), rng.integers(0, 60, 8)))]
        clearance = Clearance(ranges)
        for start in range(0, 1100, 11):
            end = start + int(rng.integers(0, 40))
            want = outcome(lambda: check_disjoint(ranges, [("idx", start, end)]))
            assert outcome(lambda: clearance.check("idx", start, end)) == want, (ranges, start, end)
