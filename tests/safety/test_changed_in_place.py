"""What a plan or a prepared transfer recorded, changed in place afterwards: never followed past a check.

One table per class, each over every entry point (and ``kv.copy``) it applies to, plain and prepared:

- a table made by ``kv.layer_table``, one of its addresses replaced by a smaller layer's: with checks on
  (``check=True`` at the call or at ``prepare``, or ``KVNUMBA_CHECK``) the table is read again and the
  smaller layer bounds the tokens;
- a destination made read-only (``setflags(write=False)``) after a plan was cached or a transfer
  prepared: refused with the plain call's error, writing nothing.

Every case keeps poisoned guard rows around what it may write and checks them byte by byte.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba.arrays import array_info
from kvnumba.driver.target import SIMULATOR
from kvnumba.plan.spec import SPECS
from tests.helpers.cases import ENTRY_POINTS, POISON
from tests.helpers.placement import device, to_numpy
from tests.helpers.safety_cases import build
from tests.helpers.view_cases import LAYOUTS, make_view

pytestmark = pytest.mark.needs_target

ITEM = 16  # bytes per item
GUARD = 3  # poisoned rows around a small layer
LAUNCH = dict(block_quota=1, num_warps_per_block=1)


# --- a kv.layer_table table changed in place, with checks on ----------------------------------------

# (entry point, the table argument whose layer 1 is replaced): every table of every entry point
TABLE_CASES = [(op, name) for op in ENTRY_POINTS for name, layout in
               zip(("src", "dst"), ENTRY_POINTS[op][:2]) if layout == "lf_tbl"]
# How checks are on: (at the call, at prepare) options, and KVNUMBA_CHECK; prepared or plain
CHECKS = {
    "plain check=True": ("plain", {"check": True}, {}, False),
    "plain KVNUMBA_CHECK": ("plain", {}, {}, True),
    "prepared check=True": ("prepared", {"check": True}, {}, False),
    "prepared, check=True at prepare": ("prepared", {}, {"check": True}, False),
    "prepared KVNUMBA_CHECK": ("prepared", {}, {}, True),
}


def _small_layer(dtype):
    """A one-item layer inside poisoned guard rows, known to kvnumba (``kv.layer_table`` recorded it)."""
    backing = device(np.full((GUARD + 1 + GUARD, ITEM), POISON, np.uint8).view(dtype))
    small = backing[GUARD:GUARD + 1]
    kv.layer_table([small])
    return backing, small


def _replace(table, layer, address):
    """Write ``address`` into ``table[layer]`` in place (a device table through a host copy)."""
    if isinstance(table, np.ndarray):
        table[layer] = address
    else:
        host = table.copy_to_host()
        host[layer] = address
        table.copy_to_device(host)


def _table_argument(call, side):
    return next(name for name in call.kwargs if name.startswith(side) and name.endswith("layers"))


CALL_ARGUMENTS = ("src_indices", "dst_indices", "layer_id", "block_quota", "num_warps_per_block")


def _prepared(op, kwargs, options):
    """``op`` prepared with everything but the call's arguments bound (so called through its fast path)."""
    return kv.prepare(op, **{k: v for k, v in kwargs.items() if k not in CALL_ARGUMENTS}, **options)


@pytest.mark.parametrize("how", list(CHECKS))
@pytest.mark.parametrize("op,side", TABLE_CASES, ids=[f"{op}-{side}" for op, side in TABLE_CASES])
def test_a_layer_table_changed_in_place_is_read_again_with_checks_on(op, side, how):
    kind, call_options, prepare_options, env = CHECKS[how]
    call = build(op, item_size=ITEM, num_layers=2, pool=8, count=4, seed=3, **LAUNCH)
    indices = dict(src_indices=call.kwargs["src_indices"], dst_indices=call.kwargs["dst_indices"], **LAUNCH)
    run = (lambda **o: call.run(**o)) if kind == "plain" else _prepared(op, call.kwargs, prepare_options)
    run(**indices) if kind == "prepared" else run()  # a plan made (cached, or prepared) from the table as built
    before = call.dst_bytes()
    table = call.kwargs[_table_argument(call, side)]
    backing, small = _small_layer(call.dsts[0].dtype)
    _replace(table, 1, array_info(small, "small").ptr)  # layer 1 is now one token long
    with config.override(check=env):
        with pytest.raises(kv.IndexOutOfRangeError, match=rf"{side}_indices\[\d\] = [1-7] is out of range"):
            run(**call_options) if kind == "plain" else run(**indices, **call_options)
    rows = to_numpy(backing).view(np.uint8)
    guards = np.r_[0:GUARD, GUARD + 1:len(rows)]
    assert (rows[guards] == POISON).all(), "written past the smaller layer"
    if SIMULATOR:  # host-readable indices: refused before the launch, nothing written at all
        assert all(np.array_equal(a, b) for a, b in zip(call.dst_bytes(), before))
        assert (rows == POISON).all()


@pytest.mark.parametrize("how", list(CHECKS))
@pytest.mark.parametrize("side", ["src", "dst"])
def test_a_layer_table_view_changed_in_place_is_read_again_with_checks_on(side, how):
    """kv.copy between a kv.LayerTable view (over kv.layer_table tables) and a layer-first view."""
    kind, call_options, prepare_options, env = CHECKS[how]
    rng = np.random.default_rng(4)
    layers = 2
    fill = (lambda: rng.integers(0, 255, (8, ITEM), dtype=np.uint8)) if side == "src" else \
        (lambda: np.full((8, ITEM), POISON, np.uint8))
    table_layers = [[device(fill()) for _ in range(layers)] for _ in "kv"]
    tables = kv.LayerTable(*[kv.layer_table(ls) for ls in table_layers], tokens=8, item_size=ITEM)
    other_fill = (lambda: np.full((8, ITEM), POISON, np.uint8)) if side == "src" else \
        (lambda: rng.integers(0, 255, (8, ITEM), dtype=np.uint8))
    plain_layers = [[device(other_fill()) for _ in range(layers)] for _ in "kv"]
    lf = kv.LayerFirst(*plain_layers)
    src, dst = (tables, lf) if side == "src" else (lf, tables)
    idx = device(np.array([0, 5, 2], np.int64))
    if kind == "plain":
        def run(**options):
            kv.copy(src, dst, idx, idx, **LAUNCH, **options)
    else:
        load = kv.prepare(kv.copy, src_view=src, dst_view=dst, **prepare_options)

        def run(**options):
            load(idx, idx, **LAUNCH, **options)
    run()
    dst_arrays = plain_layers if side == "src" else table_layers
    before = [to_numpy(a).copy() for ls in dst_arrays for a in ls]
    backing, small = _small_layer(np.uint8)
    _replace(tables.k, 1, array_info(small, "small").ptr)
    with config.override(check=env):
        with pytest.raises(kv.IndexOutOfRangeError, match=rf"{side}_indices\[1\] = 5 is out of range"):
            run(**call_options)
    rows = to_numpy(backing)
    assert (rows[np.r_[0:GUARD, GUARD + 1:len(rows)]] == POISON).all(), "written past the smaller layer"
    if SIMULATOR:
        assert all(np.array_equal(to_numpy(a), b) for a, b in zip([a for ls in dst_arrays for a in ls], before))
        assert (rows == POISON).all()


# --- a destination made read-only after its plan was cached, or its transfer prepared -------------------
# On a GPU the NumPy destinations are pinned host memory (the only arrays that can turn read-only).

DST_PLACE = "device" if SIMULATOR else "host"


def _refused_as_the_plain_call(first, again, plain, arrays, destination):
    """``first()`` makes the plan (a call, or prepare and a call); ``destination`` is then made read-only,
    and ``again()`` must raise exactly what a plain call on fresh plans raises (``plain()``), while
    ``arrays`` (everything a call may write) keep their bytes."""
    first()
    destination.setflags(write=False)
    before = [_bytes(a) for a in arrays]
    with pytest.raises(ValueError, match="read-only") as got:
        again()
    kv.clear_plan_caches()
    with pytest.raises(ValueError) as want:
        plain()
    assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))
    assert all(np.array_equal(_bytes(a), b) for a, b in zip(arrays, before)), "a refused call wrote"


def _bytes(array):
    return to_numpy(array).view(np.uint8).copy()


def _flagged(value):
    """The NumPy array a test makes read-only: the last array of a destination, or behind a table."""
    value = value[-1] if isinstance(value, (list, tuple)) else value
    layers = getattr(value, "flagged_layers", None)
    array = layers[-1] if layers is not None else value
    return array if isinstance(array, np.ndarray) else array._ary  # the simulator's device arrays wrap one


@pytest.mark.parametrize("how", ["plain", "prepared"])
@pytest.mark.parametrize("op", list(ENTRY_POINTS))
def test_a_kernel_destination_made_read_only_is_refused_as_the_plain_call_refuses_it(op, how):
    call = build(op, item_size=ITEM, num_layers=2, pool=8, count=4, dst_place=DST_PLACE, **LAUNCH)
    destination = _flagged(call.kwargs[[n for n in SPECS[op].buffers if n.startswith("dst")][-1]])
    calls = {"plain": call.run}
    if how == "prepared":
        load = _prepared(op, call.kwargs, {})
        indices = {k: v for k, v in call.kwargs.items() if k in CALL_ARGUMENTS}
        calls["prepared"] = lambda: load(**indices)
    _refused_as_the_plain_call(calls[how], calls[how], call.run, call.dsts, destination)


def _direct_call(op):
    idx = np.arange(8, dtype=np.int64)
    dst = [np.full((16, 8), POISON, np.uint8) for _ in range(2)]
    if op == "transfer_kv_direct":
        args = dict(src_layers=[np.ones((16, 8), np.uint8)] * 2, dst_layers=dst, page_size=4)
    elif op == "transfer_kv_per_layer_direct_pf_lf":
        args = dict(src_ptrs=[np.ones((4, 2, 4, 8), np.uint8)] * 2, dst_ptrs=dst, layer_id=0, page_size=4)
    else:
        dst = [d.reshape(4, 1, 4, 8) for d in dst]
        args = dict(src_ptrs=[np.ones((16, 8), np.uint8)] * 2, dst_ptrs=dst, page_size=4)
    return args, dict(src_indices=idx, dst_indices=idx), dst


@pytest.mark.parametrize("how", ["plain", "prepared"])
@pytest.mark.parametrize("op", ["transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
                                "transfer_kv_all_layer_direct_lf_pf"])
def test_a_copy_engine_destination_made_read_only_is_refused_as_the_plain_call_refuses_it(op, how):
    args, indices, dst = _direct_call(op)

    def plain():
        getattr(kv, op)(**args, **indices)

    load = kv.prepare(op, **args) if how == "prepared" else None
    run = plain if load is None else (lambda: load(**indices))
    _refused_as_the_plain_call(run, run, plain, dst, dst[1])


VIEW_CASES = [(layout, how) for layout in LAYOUTS for how in ("plain", "prepared", "prepared, layers bound")]


@pytest.mark.parametrize("layout,how", VIEW_CASES, ids=[f"{layout}-{how}" for layout, how in VIEW_CASES])
def test_a_view_destination_made_read_only_is_refused_as_the_plain_call_refuses_it(layout, how):
    rng = np.random.default_rng(7)
    place = ("device" if SIMULATOR else "host", "numba")
    _, src = make_view("PageFirst", 2, 8, 2, 2, 4, rng, False, False, place)
    _, dst = make_view(layout, 2, 8, 2, 2, 4, rng, True, False, place)
    idx = device(np.array([1, 6, 3], np.int64))

    def plain():
        kv.copy(src, dst, idx, idx, **LAUNCH)

    bound = {"layers": None} if how == "prepared, layers bound" else {}
    load = kv.prepare(kv.copy, src_view=src, dst_view=dst, **bound) if how != "plain" else None
    run = plain if load is None else (lambda: load(idx, idx, **LAUNCH))
    arrays = [b for which in ("k", "v") for b in dst.buffers(which)]
    _refused_as_the_plain_call(run, run, plain, arrays, _flagged(dst.buffers("v")))
