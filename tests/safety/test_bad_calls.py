"""Bad calls: no bad input crashes the process, corrupts memory or kills the CUDA context.

A table of bad calls for every entry point (each breaks one rule), each asserting the exception
type, the message, and that no destination byte changed; the kernels' bounds guard for indices in
GPU memory (skips, flag, ``check=True``, deferred errors, ``check_errors``); the token limits
against the layouts' own arithmetic. The same tests run on the simulator and on a GPU.
"""
import random

import numpy as np
import pytest

import kvnumba
from kvnumba.checks import bounds, guard
from kvnumba.driver.target import SIMULATOR
from kvnumba.errors import IndexOutOfRangeError, PageableMemoryError
from tests.helpers.placement import device, host, to_numpy
from tests.helpers.safety_cases import OPS, build

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset

PER_LAYER_DIM = [op for op in OPS if op.endswith("pf_lf") or op.endswith("ph_lf")]  # src_layout_dim + layer_id
ALL_LAYER_DIM = [op for op in OPS if op.endswith("lf_pf") or op.endswith("lf_ph")]  # dst_layout_dim
HEADED = [op for op in OPS if "ph" in op]
TABLES = [op for op in OPS if "all_layer" in op]
HIGH = np.array([0, 1, 2, 7], np.int64)  # host indices reaching the last token slot of a pool of 8


@pytest.fixture(autouse=True)
def clean_flag():
    guard.clear()
    yield
    guard.clear()


def _names(op):
    mla = "mla" in op
    src_tbl, dst_tbl = "all_layer" in op, op.endswith("all_layer") or op.endswith("all_layer_mla")
    s, d = ("_layers" if src_tbl else ""), ("_layers" if dst_tbl else "")
    return (f"src{s}", f"dst{d}") if mla else (f"src_k{s}", f"dst_k{d}")


def _misaligned(call, name):
    """A buffer of the same bytes starting 4 bytes into an allocation."""
    raw = np.zeros(to_numpy(call.kwargs[name]).nbytes + 8, np.uint8)
    return device(raw)[4:-4]


def _misaligned_indices(n):
    """int64 indices 4 bytes into an allocation (NumPy allows such a view; the kernel's loads do not)."""
    raw = np.zeros(8 * n + 8, np.uint8)
    return np.frombuffer(raw.data, dtype=np.int64, count=n, offset=4)


def _rows(op):
    """(id, override(call) -> dict, error type, message regex) for op."""
    src, dst = _names(op)
    n = 4
    rows = [
        ("item_size_not_multiple_of_8", lambda c: dict(item_size=12), ValueError,
         r"item_size must be a multiple of 8 bytes, got 12"),
        ("item_size_zero", lambda c: dict(item_size=0), ValueError, r"item_size must be >= 1, got 0"),
        ("item_size_float", lambda c: dict(item_size=16.0), TypeError, r"item_size must be an integer, got float"),
        ("indices_int32", lambda c: dict(src_indices=np.arange(n, dtype=np.int32)), TypeError,
         r"src_indices must hold int64 token indices, got dtype int32"),
        ("indices_2d", lambda c: dict(dst_indices=device(np.zeros((1, n), np.int64))), ValueError,
         r"dst_indices must be one-dimensional"),
        ("indices_lengths", lambda c: dict(dst_indices=device(np.arange(n + 1, dtype=np.int64))), ValueError,
         r"same length, got 4 and 5"),
        ("indices_list", lambda c: dict(src_indices=[0, 1, 2, 3]), TypeError, r"src_indices must be an array"),
        ("buffer_not_array", lambda c: {src: [1, 2, 3]}, TypeError, rf"{src} must be an array"),
        ("block_quota_zero", lambda c: dict(block_quota=0), ValueError, r"block_quota must be >= 1, got 0"),
        ("warps_too_many", lambda c: dict(num_warps_per_block=33), ValueError,
         r"num_warps_per_block must be <= 32, got 33"),
        ("warps_bool", lambda c: dict(num_warps_per_block=True), TypeError,
         r"num_warps_per_block must be an integer, got bool"),
        ("src_index_past_end", lambda c: dict(src_indices=np.array([0, 1, 8, 2], np.int64)), IndexOutOfRangeError,
         r"src_indices\[2\] = 8 is out of range for .*valid tokens are \[0, 8\)"),
        ("dst_index_negative", lambda c: dict(dst_indices=np.array([0, -3, 1, 2], np.int64)), IndexOutOfRangeError,
         r"dst_indices\[1\] = -3 is out of range"),
        ("dst_index_huge", lambda c: dict(dst_indices=np.array([2**62, 0, 1, 2], np.int64)), IndexOutOfRangeError,
         r"dst_indices\[0\] = 4611686018427387904 is out of range"),
        ("stream_bad", lambda c: dict(stream="fast"), TypeError, r"stream must be a CUDA stream"),
        # Index arrays the kernel would misread: swapped bytes, or 8-byte loads off their boundary.
        ("indices_big_endian", lambda c: dict(src_indices=np.arange(n, dtype=">i8")), TypeError,
         r"src_indices must hold int64 token indices, got dtype >int64 \(non-native byte order"),
        ("indices_misaligned", lambda c: dict(dst_indices=_misaligned_indices(n)), ValueError,
         r"dst_indices must start at an 8-byte aligned address"),
        # A strided view: checked by its values, it would be read by the kernel as the memory behind it.
        ("indices_strided", lambda c: dict(src_indices=np.arange(2 * n, dtype=np.int64)[::2]), ValueError,
         r"src_indices must be C-contiguous"),
        ("indices_float", lambda c: dict(dst_indices=np.arange(n, dtype=np.float64)), TypeError,
         r"dst_indices must hold int64 token indices, got dtype float64"),
    ]
    if "mla" not in op:
        rows.append(("v_missing", lambda c: {src.replace("_k", "_v"): None}, TypeError,
                     rf"{src.replace('_k', '_v')} must be an array"))
    if op.endswith("per_layer") or op.endswith("mla") and "all" not in op:
        rows.append(("misaligned_buffer", lambda c: {dst: _misaligned(c, dst)}, ValueError,
                     rf"{dst} must start at an 8-byte aligned address"))
        rows.append(("dst_too_small", lambda c: {dst: device(np.zeros(7 * 16, np.uint8)), "dst_indices": HIGH},
                     IndexOutOfRangeError, rf"out of range for {dst}.*valid tokens are \[0, 7\)"))
    if op in PER_LAYER_DIM:
        rows += [
            ("layer_id_negative", lambda c: dict(layer_id=-1), ValueError, r"layer_id must be >= 0, got -1"),
            ("layer_id_past_layout_dim", lambda c: dict(layer_id=2), ValueError,
             r"layer_id=2 is out of range for src_layout_dim=32: .* layer_id must be < 2"),
            ("layout_dim_not_multiple", lambda c: dict(src_layout_dim=36), ValueError,
             r"src_layout_dim must be a multiple of (8|16) bytes"),
            ("layout_dim_negative", lambda c: dict(src_layout_dim=-32), ValueError, r"src_layout_dim must be >= 0"),
            ("src_too_small_for_layer", lambda c: dict(layer_id=0, src_layout_dim=64, src_indices=HIGH),
             IndexOutOfRangeError,
             r"src_indices\[3\] = 7 is out of range for src(_k/src_v)? \(page-(first|head), 256 bytes"),
        ]
    if op in ALL_LAYER_DIM:
        rows += [
            ("layout_dim_too_small", lambda c: dict(dst_layout_dim=16), ValueError,
             r"dst_layout_dim must be >= num_layers \* item_size = 2 \* 16 = 32"),
            ("layout_dim_not_multiple", lambda c: dict(dst_layout_dim=44), ValueError,
             r"dst_layout_dim must be a multiple of (8|16) bytes"),
            ("dst_too_small_for_dim", lambda c: dict(dst_layout_dim=64, dst_indices=HIGH), IndexOutOfRangeError,
             r"dst_indices\[3\] = 7 is out of range for dst"),
        ]
    if op in HEADED:
        rows += [
            ("head_bytes_not_multiple_of_8", lambda c: dict(head_num=4), ValueError,
             r"item_size / head_num must be a multiple of 8 bytes, got 16 / 4 = 4"),
            ("page_size_zero", lambda c: dict(page_size=0), ValueError, r"page_size must be >= 1, got 0"),
            ("head_num_zero", lambda c: dict(head_num=0), ValueError, r"head_num must be >= 1, got 0"),
        ]
    if op in TABLES:
        table = src
        rows += [
            ("num_layers_mismatch", lambda c: dict(num_layers=3, **({"dst_layout_dim": 48} if op in ALL_LAYER_DIM
                                                                   else {})), ValueError,
             rf"{table} must hold num_layers=3 addresses, got shape \(2,\)"),
            ("num_layers_zero", lambda c: dict(num_layers=0), ValueError, r"num_layers must be >= 1, got 0"),
            ("table_dtype", lambda c: {table: device(np.zeros(2, np.float64))}, TypeError,
             rf"{table} must be a uint64 table of layer addresses, got dtype float64"),
            ("table_layers_too_small", lambda c: {table: kvnumba.layer_table(
                [device(np.zeros((4, 16), np.uint8)) for _ in range(2)]), "src_indices": HIGH}, IndexOutOfRangeError,
             rf"src_indices\[3\] = 7 is out of range for {table}.*valid tokens are \[0, 4\)"),
        ]
    return rows


TABLE = [pytest.param(op, *row[1:], id=f"{op}-{row[0]}") for op in OPS for row in _rows(op)]


@pytest.mark.parametrize("op,override,error,match", TABLE)
def test_bad_call_raises_and_writes_nothing(op, override, error, match):
    call = build(op, idx_place="host")
    with pytest.raises(error, match=match):
        call.run(**override(call))
    assert call.untouched(), "a rejected call wrote to a destination"
    call.run()  # the same call, valid: still works (the context is fine)
    call.run_reference()
    assert call.matches_reference()


@pytest.mark.parametrize("op", OPS)
def test_check_keyword_on_valid_call(op):
    call = build(op)
    call.run(check=True)
    call.run_reference()
    assert call.matches_reference()


@pytest.mark.skipif(not SIMULATOR, reason="a read-only NumPy destination is a simulator case (GPU dsts are device)")
def test_read_only_destination():
    call = build("transfer_kv_per_layer_mla")
    dst = np.full(to_numpy(call.kwargs["dst"]).shape, 0xA5, np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="dst is a read-only NumPy array"):
        call.run(dst=dst)


# --- the kernel's guard (indices in GPU memory) ----------------------------------------------------


def _with_bad(call, side, bad_value, position=1):
    """The call's indices with one entry on ``side`` replaced; the reference gets the valid subset."""
    si = call.ref_kwargs["src_indices"].copy()
    di = call.ref_kwargs["dst_indices"].copy()
    (si if side == "src" else di)[position] = bad_value
    keep = np.ones(len(si), bool)
    keep[position] = False
    call.ref_kwargs.update(src_indices=si[keep], dst_indices=di[keep])
    return dict(src_indices=device(si), dst_indices=device(di))


@pytest.mark.parametrize("side", ["src", "dst"])
@pytest.mark.parametrize("op", OPS)
def test_kernel_skips_out_of_range_and_check_raises(op, side, device_path):
    call = build(op, count=4, pool=8)
    bad = call.case.pool  # the first token past every (dense) buffer: without the guard, a write outside it
    override = _with_bad(call, side, bad)
    with pytest.raises(IndexOutOfRangeError, match=rf"{side}_indices\[1\] = {bad} is out of range.*"
                                                   r"skipped the out-of-range items and copied the others"):
        call.run(**override, check=True)
    call.run_reference()
    assert call.matches_reference(), "the valid items must be copied, the skipped one left alone"
    assert not guard.flag_set()
    call.run()  # the flag was reset: the next call runs


@pytest.mark.parametrize("op", ["transfer_kv_per_layer", "transfer_kv_all_layer_lf_ph"])
def test_deferred_error_raised_by_next_call(op, device_path):
    call = build(op)
    override = _with_bad(call, "dst", -1)
    call.run(**override)  # no check: returns; the kernel flags
    call.run_reference()
    assert call.matches_reference()
    with pytest.raises(IndexOutOfRangeError, match="an earlier kvnumba transfer skipped items"):
        call.run(**override)  # the next call reports it and does nothing
    kvnumba.check_errors()  # cleared by raising
    call.run()  # and the one after runs


def test_check_errors_raises_once(device_path):
    call = build("transfer_kv_per_layer_mla")
    call.run(**_with_bad(call, "src", 10**9))
    with pytest.raises(IndexOutOfRangeError, match="skipped items whose token indices"):
        kvnumba.check_errors()
    kvnumba.check_errors()


def test_env_check_acts_like_check_true(device_path, always_check):
    call = build("transfer_kv_per_layer_pf_lf")
    with pytest.raises(IndexOutOfRangeError, match=r"src_indices\[1\] = 8 is out of range"):
        call.run(**_with_bad(call, "src", 8))


def test_direct_entry_points_check_flag_first(device_path):
    call = build("transfer_kv_per_layer")
    call.run(**_with_bad(call, "dst", 99))
    lf = [device(np.zeros((8, 4), np.uint8))] * 2
    idx = device(np.arange(2, dtype=np.int64))
    with pytest.raises(IndexOutOfRangeError, match="an earlier kvnumba transfer"):
        kvnumba.transfer_kv_direct(lf, lf, idx, idx, 1)


def test_kernel_guard_skips_and_flags(device_path):
    """Items whose token is at or past a buffer's limit are skipped and flagged; the others copied."""
    src = device(np.arange(6 * 8, dtype=np.uint8).reshape(6, 8))  # 6 token slots: token 6 is past the end
    dst = device(np.zeros((8, 8), np.uint8))
    si, di = device(np.array([0, 5, 6], np.int64)), device(np.array([1, 2, 3], np.int64))
    kvnumba.transfer_kv_per_layer_mla(src, dst, si, di, 8, 1, 1)
    got = to_numpy(dst)
    want = np.zeros((8, 8), np.uint8)
    want[1], want[2] = np.arange(8), np.arange(40, 48)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexOutOfRangeError):
        kvnumba.check_errors()


# --- layer tables ---------------------------------------------------------------------------------


def test_layer_table_records_layer_sizes():
    layers = [device(np.zeros((4, 16), np.uint8)), device(np.zeros((6, 16), np.uint8))]
    table = kvnumba.layer_table(layers)
    assert tuple(table.layer_nbytes) == (64, 96)


@pytest.mark.parametrize("move", ["copy", "slice", "to_device"])
def test_moved_table_keeps_its_bounds(move):
    """A table copied, sliced or moved away from kv.layer_table's result still bounds its layers."""
    call = build("transfer_kv_all_layer_mla")
    table = call.kwargs["src_layers"]
    addresses = to_numpy(table).view(np.uint64).copy()
    moved = {"copy": lambda: device(addresses), "slice": lambda: device(np.concatenate([addresses, addresses])[:2]),
             "to_device": lambda: device(addresses.copy())}[move]()
    assert getattr(moved, "layer_nbytes", None) is None  # a plain array: the recorded sizes did not travel
    call.run(src_layers=moved)
    call.run_reference()
    assert call.matches_reference()
    with pytest.raises(IndexOutOfRangeError, match=r"src_indices\[0\] = 8 is out of range for src_layers "
                                                   r"\(layer-first layers of 128 bytes"):
        call.run(src_layers=moved, src_indices=np.array([8, 0, 1, 2], np.int64))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator has no driver to ask about an address")
def test_unknown_raw_table_on_simulator():
    """Addresses nobody registered: unbounded with checks off, refused with checks on."""
    call = build("transfer_kv_all_layer_mla")
    rng = np.random.default_rng(3)
    layers = [rng.integers(0, 256, (8, 16), dtype=np.uint8) for _ in range(2)]  # never given to kv.layer_table
    raw = np.array([a.ctypes.data for a in layers], np.uint64)
    call.run(src_layers=raw)  # checks off: copies from the addresses as given
    call.run_reference(src_layers=layers)
    assert call.matches_reference() and not call.untouched()
    with pytest.raises(kvnumba.BadAddressError, match=r"src_layers\[0\] = 0x[0-9a-f]+ is not in any layer kvnumba"):
        call.run(src_layers=raw, check=True)
    garbage = np.array([0x1000, 0x2000], np.uint64)
    with pytest.raises(kvnumba.BadAddressError, match="is not in any layer kvnumba knows"):
        call.run(src_layers=garbage, check=True)


def test_raw_table_misaligned_address_rejected_with_check():
    call = build("transfer_kv_all_layer_mla")
    addresses = to_numpy(call.kwargs["src_layers"]).view(np.uint64).copy()
    addresses[1] += 4
    with pytest.raises(ValueError, match=r"src_layers\[1\] = 0x[0-9a-f]+ is not 8-byte aligned"):
        call.run(src_layers=device(addresses), check=True)
    assert call.untouched()


# --- pinned host memory -----------------------------------------------------------------------------


@pytest.mark.gpu  # pageable memory is only a problem on a GPU
def test_pageable_numpy_rejected():
    call = build("transfer_kv_per_layer")
    with pytest.raises(PageableMemoryError, match=r"src_k is a NumPy array in pageable host memory.*pinned_array"):
        call.run(src_k=np.zeros((8, 8), np.float16))
    assert call.untouched()
    call.run(src_k=host(np.zeros((8, 8), np.float16)))  # pinned: fine


def test_pinned_check_is_a_no_op_for_device_and_simulator():
    from kvnumba.checks import pinned
    from kvnumba.arrays import array_info

    pinned.require("x", array_info(device(np.zeros(8)), "x"))
    if SIMULATOR:
        pinned.require("x", array_info(np.zeros(8), "x"))


# --- token limits against the layouts' own arithmetic ------------------------------------------------


@pytest.mark.parametrize("layout", ["lf", "lf_tbl", "pf", "ph"])
def test_token_limit_matches_brute_force(layout):
    rng = random.Random(layout)
    for _ in range(600):
        heads = rng.choice([1, 2, 4]) if layout in ("ph", "lf") else 1
        item = 8 * heads * rng.randint(1, 4)
        first, num = rng.randint(0, 3), rng.randint(1, 3)
        page = rng.choice([1, 2, 4, 8])
        dim = 0 if layout == "lf_tbl" else rng.choice([0, (first + num) * item, (first + num + 2) * item,
                                                      8 * heads * rng.randint(1, 20)])
        nbytes = rng.randint(0, 3000)
        kw = dict(item_size=item, layout_dim=dim, first_layer=first, num_layers=num, page_size=page, heads=heads)
        limit = bounds.token_limit(layout, nbytes, **kw)
        ends = [bounds.item_end(layout, t, **kw) for t in range(400)]
        inside = [e <= nbytes for e in ends]
        if all(inside):
            assert limit >= 400
            continue
        first_out = inside.index(False)
        assert not any(inside[first_out:]), "item ends must grow with the token"
        assert limit == first_out, (layout, kw, nbytes)


# --- the copy-engine entry points ---------------------------------------------------------------------

def _direct_call(op):
    """A valid call of a copy-engine entry point: 2 layers of [16 tokens, 8 bytes], pages of 4."""
    lf = [device(np.full((16, 8), 0xA5, np.uint8)) for _ in range(4)]  # K layers then V layers
    pf = [host(np.full((4, 2, 4, 8), 0xA5, np.uint8)) for _ in range(2)]
    idx = np.arange(8, dtype=np.int64)
    if op == "transfer_kv_direct":
        return dict(src_layers=[device(np.ones((16, 8), np.uint8))] * 2, dst_layers=lf[:2], src_indices=idx,
                    dst_indices=idx, page_size=4), lf[:2]
    if op == "transfer_kv_per_layer_direct_pf_lf":
        src = [host(np.ones((4, 2, 4, 8), np.uint8)) for _ in range(2)]
        return dict(src_ptrs=src, dst_ptrs=[lf[0], lf[1]], src_indices=idx, dst_indices=idx, layer_id=1,
                    page_size=4), lf[:2]
    return dict(src_ptrs=[device(np.ones((16, 8), np.uint8))] * 4, dst_ptrs=pf, src_indices=idx, dst_indices=idx,
                page_size=4), pf


DIRECT = ["transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf"]
DIRECT_ROWS = [
    (op, *row) for op in DIRECT for row in [
        ("page_size_zero", dict(page_size=0), ValueError, r"page_size must be >= 1, got 0"),
        ("page_size_not_dividing", dict(src_indices=np.arange(6, dtype=np.int64),
                                        dst_indices=np.arange(6, dtype=np.int64)), ValueError,
         r"the number of indices \(6\) must be a multiple of page_size \(4\)"),
        ("indices_int32", dict(src_indices=np.arange(8, dtype=np.int32)), TypeError, r"src_indices must hold int64"),
        ("indices_lengths", dict(dst_indices=np.arange(4, dtype=np.int64)), ValueError, r"same length, got 8 and 4"),
        ("index_negative", dict(src_indices=np.arange(-4, 4, dtype=np.int64)), IndexOutOfRangeError,
         r"src_indices\[0\] = -4 is out of range"),
        ("index_past_end", dict(dst_indices=np.arange(12, 20, dtype=np.int64)), IndexOutOfRangeError,
         r"dst_indices\[4\] = 16 is out of range|dst_indices\[0\] = 12 is out of range"),
        ("stream_bad", dict(stream="fast"), TypeError, r"stream must be a CUDA stream"),
        ("indices_big_endian", dict(src_indices=np.arange(8, dtype=">i8")), TypeError, r"non-native byte order"),
        ("indices_misaligned", dict(src_indices=_misaligned_indices(8)), ValueError,
         r"src_indices must start at an 8-byte aligned address"),
        ("indices_strided", dict(src_indices=np.arange(16, dtype=np.int64)[::2]), ValueError,
         r"src_indices must be C-contiguous"),
    ]
] + [
    ("transfer_kv_direct", "lists_differ", lambda: dict(src_layers=[device(np.ones((16, 8), np.uint8))]), ValueError,
     r"same number of layers, got 1 and 2"),
    ("transfer_kv_direct", "not_a_list", lambda: dict(src_layers=device(np.ones((2, 16, 8), np.uint8))), TypeError,
     r"src_layers must be a list of arrays"),
    ("transfer_kv_per_layer_direct_pf_lf", "layer_id_none", dict(layer_id=None), TypeError,
     r"layer_id must be an integer, got NoneType"),
    ("transfer_kv_per_layer_direct_pf_lf", "layer_id_negative", dict(layer_id=-1), ValueError,
     r"layer_id must be >= 0, got -1"),
    ("transfer_kv_per_layer_direct_pf_lf", "layer_id_float", dict(layer_id=1.0), TypeError,
     r"layer_id must be an integer, got float"),
    ("transfer_kv_direct", "page_size_none", dict(page_size=None), TypeError, r"page_size must be an integer"),
    ("transfer_kv_per_layer_direct_pf_lf", "layer_id_past_end", dict(layer_id=2), ValueError,
     r"layer_id=2 \+ 1 layers in dst_ptrs exceed the 2 layers of src_ptrs"),
    ("transfer_kv_per_layer_direct_pf_lf", "zero_layers",
     lambda: dict(src_ptrs=[host(np.ones((4, 0, 4, 8), np.uint8))] * 2), ValueError,
     r"src_ptrs\[0\] must have at least one page, layer and slot, got shape \(4, 0, 4, 8\)"),
    ("transfer_kv_per_layer_direct_pf_lf", "kv_count_odd", lambda: dict(dst_ptrs=[device(np.zeros((16, 8), np.uint8))] * 3),
     ValueError, r"dst_ptrs must hold K layers then V layers \(an even count\), got 3"),
    ("transfer_kv_all_layer_direct_lf_pf", "three_page_buffers",
     lambda: dict(dst_ptrs=[host(np.zeros((4, 2, 4, 8), np.uint8))] * 3), ValueError, r"dst_ptrs must hold 2 page-first buffers \(K, V\) or 1 \(MLA\), got 3"),
    ("transfer_kv_all_layer_direct_lf_pf", "too_many_layers", lambda: dict(src_ptrs=[device(np.ones((16, 8), np.uint8))] * 6),
     ValueError, r"3 layers in src_ptrs exceed the 2 layers of dst_ptrs"),
]


@pytest.mark.parametrize("op,label,override,error,match", DIRECT_ROWS, ids=[f"{r[0]}-{r[1]}" for r in DIRECT_ROWS])
def test_direct_bad_call_raises_and_writes_nothing(op, label, override, error, match):
    kwargs, dsts = _direct_call(op)
    if callable(override):  # arrays are made when the test runs, not when it is collected
        override = override()
    with pytest.raises(error, match=match):
        getattr(kvnumba, op)(**{**kwargs, **override})
    assert all((to_numpy(d) == 0xA5).all() for d in dsts)
    getattr(kvnumba, op)(**kwargs, check=True)  # valid: still works
    assert not any((to_numpy(d) == 0xA5).all() for d in dsts)


# --- duplicate destination indices -------------------------------------------------------------------

@pytest.mark.parametrize("op", ["transfer_kv_per_layer_mla", "transfer_kv_per_layer_pf_lf", "transfer_kv_all_layer"])
def test_duplicate_destination_indices_land_one_writer_per_word(op):
    """Two items writing one slot race (as in the seed: nothing orders them), so each 8-byte word of
    that slot holds the word of one of its writers; every other slot is exact. A launcher change once
    looked like it "wrote wrong bytes" on the GPU: it was this race in a property-test case."""
    call = build(op, count=3, pool=8, idx_place="host", block_quota=2, num_warps_per_block=2)
    si, di = np.array([0, 1, 3], np.int64), np.array([2, 2, 5], np.int64)
    call.run(src_indices=si, dst_indices=di)
    first = {k: (v.copy() if isinstance(v, np.ndarray) else [b.copy() for b in v]) for k, v in call.ref_kwargs.items()
             if k.startswith("dst")}
    call.run_reference(src_indices=si[[0, 2]], dst_indices=di[[0, 2]])
    want_a = [b.copy() for b in call.ref_dsts]
    for name, value in first.items():  # back to the poisoned destinations for the second writer
        if isinstance(value, np.ndarray):
            call.ref_kwargs[name][...] = value
        else:
            for dst, saved in zip(call.ref_kwargs[name], value):
                dst[...] = saved
    call.run_reference(src_indices=si[[1, 2]], dst_indices=di[[1, 2]])
    want_b = call.ref_dsts
    for got, a, b in zip(call.dst_bytes(), want_a, want_b):
        got, a, b = (x.view(np.uint8).reshape(-1).view(np.uint64) for x in (got, a, b))
        assert ((got == a) | (got == b)).all()
