"""On a real GPU with torch tensors, SGLang's calls (prepared transfers take their inlined fast path there):
what a plan or a prepared transfer recorded, changed in place afterwards, is never followed past a check.
tests/safety/test_changed_in_place.py is the table over every entry point (it runs here too, on Numba
arrays); this file takes the torch paths the simulator cannot:

- a ``kv.layer_table`` table of torch layers, one address replaced by a smaller layer's: with checks on,
  prepared (fast path) and plain, the smaller layer bounds the tokens; the guard rows around it stay;
- a pinned NumPy destination made read-only after ``kv.prepare``, called with torch indices: the plain
  call's error, nothing written.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba.checks import guard
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

ITEM, POOL, LAYERS, GUARD, POISON = 64, 64, 2, 4, 0xA5


@pytest.fixture(autouse=True)
def clean_flag():
    guard.clear()
    yield
    torch.cuda.synchronize()
    guard.clear()


def gpu(values):
    return torch.tensor(values, dtype=torch.int64, device="cuda")


HOW = {  # (prepared?, options at prepare, options at the call, KVNUMBA_CHECK)
    "prepared check=True": (True, {}, {"check": True}, False),
    "prepared, check=True at prepare": (True, {"check": True}, {}, False),
    "prepared KVNUMBA_CHECK": (True, {}, {}, True),
    "plain check=True": (False, {}, {"check": True}, False),
    "plain KVNUMBA_CHECK": (False, {}, {}, True),
}


@pytest.mark.parametrize("how", list(HOW))
def test_a_torch_layer_table_changed_in_place_is_bounded_by_its_layers_now(how):
    prepared, at_prepare, at_call, env = HOW[how]
    src = [torch.randint(0, 255, (POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    dst = [torch.full((POOL, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    src_table, dst_table = kv.layer_table(src), kv.layer_table(dst)
    idx = gpu([1, 2, 40])
    args = dict(src_layers=src_table, dst_layers=dst_table, item_size=ITEM, num_layers=LAYERS)
    if prepared:
        load = kv.prepare(kv.transfer_kv_all_layer_mla, **args, **at_prepare)

        def run(**options):
            load(idx, idx, **options)
    else:
        def run(**options):
            kv.transfer_kv_all_layer_mla(src_indices=idx, dst_indices=idx, **args, **options)
    run()  # a plan from the table as built (prepared: through the fast path)
    torch.cuda.synchronize()
    backing = torch.full((GUARD + 2 + GUARD, ITEM), POISON, dtype=torch.uint8, device="cuda")
    small = backing[GUARD:GUARD + 2]
    kv.layer_table([small])  # known to kvnumba: 2 tokens
    dst_table.view(torch.int64)[1] = small.data_ptr()  # in place: layer 1 is now 2 tokens long
    with config.override(check=env):
        with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[1\] = 2 is out of range"):
            run(**at_call)
    torch.cuda.synchronize()
    rows = backing.cpu().numpy()
    assert (rows[:GUARD] == POISON).all() and (rows[GUARD + 2:] == POISON).all(), "written past the smaller layer"
    np.testing.assert_array_equal(rows[GUARD + 1], src[1][1].cpu().numpy())  # token 1 is in range: copied


def test_a_pinned_destination_made_read_only_after_prepare_is_refused_on_the_fast_path():
    from numba import cuda

    src = torch.randint(0, 255, (POOL, ITEM), dtype=torch.uint8, device="cuda")
    host = cuda.pinned_array((POOL, ITEM), np.uint8)
    host[...] = POISON
    idx = gpu([3, 9, 17])
    load = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=host, item_size=ITEM)
    load(idx, idx)
    torch.cuda.synchronize()
    host[...] = POISON
    host.setflags(write=False)
    with pytest.raises(ValueError) as got:
        load(idx, idx)
    kv.clear_plan_caches()
    with pytest.raises(ValueError) as want:
        kv.transfer_kv_per_layer_mla(src, host, idx, idx, ITEM)
    assert str(got.value) == str(want.value) == "dst is a read-only NumPy array; a destination must be writable"
    torch.cuda.synchronize()
    assert (host == POISON).all()


def test_a_pinned_view_made_read_only_after_prepare_is_refused_on_the_fast_path():
    """kv.copy into a LayerFirst of pinned NumPy layers (a host pool), prepared, torch indices."""
    from numba import cuda

    src = kv.LayerFirst([torch.randint(0, 255, (POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)])
    layers = [cuda.pinned_array((POOL, ITEM), np.uint8) for _ in range(LAYERS)]
    for layer in layers:
        layer[...] = POISON
    dst = kv.LayerFirst(layers)
    idx = gpu([0, 5, 33])
    load = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=None)
    load(idx, idx)
    torch.cuda.synchronize()
    for layer in layers:
        layer[...] = POISON
    layers[1].setflags(write=False)
    with pytest.raises(ValueError) as got:
        load(idx, idx)
    with pytest.raises(ValueError) as plain:
        kv.copy(src, dst, idx, idx)  # the plain call, its plan cached: found by the flags too
    assert str(got.value) == str(plain.value) == ("dst_view.k[1] is a read-only NumPy array; a destination must be "
                                                  "writable")
    torch.cuda.synchronize()
    assert all((layer == POISON).all() for layer in layers)
