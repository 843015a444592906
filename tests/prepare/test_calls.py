"""kv.prepare: bind an entry point's arguments once, call it per layer.

Every entry point, prepared with its buffers and sizes bound, moves the same bytes as the
reference; the call forms (positional, keyword, defaults) and their errors; bad bound arguments
raise at prepare time naming the argument; the plan cache behind the plain calls. The same tests
run on the simulator and on a GPU.
"""
import gc
import weakref

import numpy as np
import pytest

import kvnumba as kv
from tests.helpers.cases import POISON
from kvnumba.plan.spec import SPECS
from kvnumba.api.transfer import plain
from tests.helpers.placement import device, host, to_numpy
from tests.helpers.safety_cases import OPS, build

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset

CALL_TIME = ("src_indices", "dst_indices", "layer_id", "block_quota", "num_warps_per_block")


def _split(call):
    """(bound, call-time) arguments of a built call: geometry bound, indices and layer per call."""
    bound = {k: v for k, v in call.kwargs.items() if k not in CALL_TIME}
    per_call = {k: v for k, v in call.kwargs.items() if k in CALL_TIME}
    return bound, per_call


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("form", ["positional", "keyword"])
def test_prepared_kernel_entry_points_match_reference(op, form):
    call = build(op, count=6, pool=8, src_place="host", dst_place="device")
    bound, per_call = _split(call)
    transfer = kv.prepare(getattr(kv, op), **bound)
    if form == "positional":
        transfer(*[per_call[n] for n in SPECS[op].params if n in per_call])
    else:
        transfer(**per_call)
    call.run_reference()
    assert call.matches_reference()


@pytest.mark.parametrize("op", OPS)
def test_prepared_transfer_repeats_over_layers(op):
    """One prepared transfer, called again with other indices (and layers): each call as the plain one."""
    call = build(op, count=4, pool=8, num_layers=2)
    bound, per_call = _split(call)
    transfer = kv.prepare(op, **bound)  # by name works too
    rng = np.random.default_rng(1)
    for _ in range(3):
        si = rng.choice(8, 4, replace=False).astype(np.int64)
        di = rng.choice(8, 4, replace=False).astype(np.int64)
        args = dict(per_call, src_indices=device(si), dst_indices=device(di))
        ref = dict(src_indices=si, dst_indices=di)
        if "layer_id" in per_call:
            args["layer_id"] = ref["layer_id"] = int(rng.integers(2))
        transfer(**args)
        call.run_reference(**ref)
    assert call.matches_reference()


DIRECT = {
    "transfer_kv_direct": lambda: (dict(src_layers=[device(np.arange(128, dtype=np.uint8).reshape(16, 8))] * 2,
                                        dst_layers=[device(np.full((16, 8), POISON, np.uint8)) for _ in range(2)],
                                        page_size=4), "dst_layers"),
    "transfer_kv_per_layer_direct_pf_lf": lambda: (dict(
        src_ptrs=[host(np.arange(256, dtype=np.uint8).reshape(4, 2, 4, 8)) for _ in range(2)],
        dst_ptrs=[device(np.full((16, 8), POISON, np.uint8)) for _ in range(2)], layer_id=1, page_size=4), "dst_ptrs"),
    "transfer_kv_all_layer_direct_lf_pf": lambda: (dict(
        src_ptrs=[device(np.arange(128, dtype=np.uint8).reshape(16, 8)) for _ in range(4)],
        dst_ptrs=[host(np.full((4, 2, 4, 8), POISON, np.uint8)) for _ in range(2)], page_size=4), "dst_ptrs"),
}


@pytest.mark.parametrize("op", list(DIRECT))
def test_prepared_copy_engine_entry_points_match_plain(op):
    idx = np.arange(8, dtype=np.int64)
    plain_args, out = DIRECT[op]()
    getattr(kv, op)(src_indices=idx, dst_indices=idx, **plain_args, check=True)
    want = [to_numpy(d).copy() for d in plain_args[out]]
    prepared_args, out = DIRECT[op]()
    transfer = kv.prepare(getattr(kv, op), **prepared_args)
    transfer(idx, idx, check=True)
    got = [to_numpy(d) for d in prepared_args[out]]
    assert any((w != POISON).any() for w in want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_call_forms_and_defaults():
    call = build("transfer_kv_per_layer_pf_lf", count=4, pool=8)
    bound, per_call = _split(call)
    transfer = kv.prepare(kv.transfer_kv_per_layer_pf_lf, **bound)
    si, di, layer = per_call["src_indices"], per_call["dst_indices"], per_call["layer_id"]
    transfer(si, di, layer)  # launch shape from the defaults
    transfer(si, di, layer, 1)  # block_quota given, num_warps_per_block defaulted
    transfer(si, di, layer_id=layer, num_warps_per_block=2)
    transfer(si, dst_indices=di, layer_id=layer, block_quota=3, stream=None, check=True)
    call.run_reference()
    assert call.matches_reference()


@pytest.mark.parametrize("args,kwargs,match", [
    ((), {}, r"transfer_kv_per_layer_pf_lf.*missing (3 )?required (positional )?arguments?: "
             r"'?src_indices'?, '?dst_indices'?,? (and )?'?layer_id'?"),
    (("a", "b", 1, 2, 3, 4), {}, r"takes (from 3 to )?5 positional arguments .* 6 were given"),
    ((1,), {"src_indices": 1}, r"multiple values for argument 'src_indices'"),
    ((), {"src_k": 1}, r"src_k was bound at prepare time|unexpected keyword argument 'src_k'"),
    ((), {"bogus": 1}, r"unexpected keyword argument 'bogus'"),
])
def test_call_argument_errors(args, kwargs, match):
    call = build("transfer_kv_per_layer_pf_lf")
    bound, _ = _split(call)
    transfer = kv.prepare(kv.transfer_kv_per_layer_pf_lf, **bound)
    with pytest.raises(TypeError, match=match):
        transfer(*args, **kwargs)
    assert call.untouched()


def test_prepare_argument_errors():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'item_bytes'"):
        kv.prepare(kv.transfer_kv_per_layer_mla, item_bytes=16)
    with pytest.raises(TypeError, match=r"entry_point must be one of kvnumba's entry points"):
        kv.prepare(np.copyto, dst=1)
    with pytest.raises(TypeError, match=r"check must be True or False"):
        kv.prepare(kv.transfer_kv_per_layer_mla, check="yes")


# Bad bound arguments raise at prepare time, naming the argument; a prepared transfer then gives
# exactly the plain call's error for a bad call-time argument.
BOUND_ROWS = [
    ("transfer_kv_per_layer", dict(item_size=12), ValueError, r"item_size must be a multiple of 8 bytes, got 12"),
    ("transfer_kv_per_layer_pf_lf", dict(src_layout_dim=36), ValueError, r"src_layout_dim must be a multiple of 8"),
    ("transfer_kv_per_layer_pf_lf", dict(layer_id=2), ValueError, r"layer_id=2 is out of range for src_layout_dim=32"),
    ("transfer_kv_per_layer_ph_lf", dict(head_num=4), ValueError, r"item_size / head_num must be a multiple of 8"),
    ("transfer_kv_all_layer", dict(num_layers=3), ValueError, r"src_k_layers must hold num_layers=3 addresses"),
    ("transfer_kv_all_layer_lf_pf", dict(dst_layout_dim=16), ValueError, r"dst_layout_dim must be >= num_layers"),
    ("transfer_kv_per_layer_mla", dict(src=[1, 2]), TypeError, r"src must be an array"),
    ("transfer_kv_per_layer_mla", dict(block_quota=0), ValueError, r"block_quota must be >= 1, got 0"),
    ("transfer_kv_per_layer_mla", dict(src_indices=np.arange(4, dtype=np.int32)), TypeError,
     r"src_indices must hold int64 token indices, got dtype int32"),
    ("transfer_kv_all_layer_mla", dict(src_layers=np.zeros(2, np.float64)), TypeError,
     r"src_layers must be a uint64 table of layer addresses"),
]


@pytest.mark.parametrize("op,override,error,match", BOUND_ROWS)
def test_bad_bound_argument_raises_at_prepare(op, override, error, match):
    call = build(op, idx_place="host")
    bound, _ = _split(call)
    with pytest.raises(error, match=match):
        kv.prepare(getattr(kv, op), **{**bound, **override})
    assert call.untouched()


@pytest.mark.parametrize("op,override,error,match", [
    ("transfer_kv_per_layer_pf_lf", dict(layer_id=-1), ValueError, r"layer_id must be >= 0, got -1"),
    ("transfer_kv_per_layer_pf_lf", dict(layer_id=True), TypeError, r"layer_id must be an integer, got bool"),
    ("transfer_kv_per_layer_pf_lf", dict(layer_id=[1]), TypeError, r"layer_id must be an integer, got list"),
    ("transfer_kv_per_layer_mla", dict(num_warps_per_block=33), ValueError, r"num_warps_per_block must be <= 32"),
    ("transfer_kv_per_layer_mla", dict(src_indices=np.array([0, 1, 8, 2], np.int64)), kv.IndexOutOfRangeError,
     r"src_indices\[2\] = 8 is out of range .*valid tokens are \[0, 8\)"),
    ("transfer_kv_per_layer_mla", dict(dst_indices=np.arange(5, dtype=np.int64)), ValueError, r"same length"),
])
def test_bad_call_argument_same_as_plain(op, override, error, match):
    call = build(op, idx_place="host")
    bound, per_call = _split(call)
    transfer = kv.prepare(getattr(kv, op), **bound)
    with pytest.raises(error, match=match):
        transfer(**{**per_call, **override})
    assert call.untouched()
    with pytest.raises(error, match=match):
        call.run(**override)
    assert call.untouched()


def test_transfer_keeps_its_buffers_alive_and_says_what_is_bound():
    src = device(np.arange(64, dtype=np.uint8).reshape(8, 8))
    dst = device(np.zeros((8, 8), np.uint8))
    alive = weakref.ref(src)
    transfer = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=8, block_quota=1)
    del src
    gc.collect()
    assert alive() is not None
    idx = device(np.array([3, 5], np.int64))
    transfer(idx, idx)
    got = to_numpy(dst)
    np.testing.assert_array_equal(got[3], np.arange(24, 32))
    text = repr(transfer)
    assert "transfer_kv_per_layer_mla" in text and "src=" in text and "item_size=8" in text
    assert "call(src_indices, dst_indices, num_warps_per_block=32, *, stream=None, check=False)" in text


def test_plain_calls_reuse_their_plan_and_notice_changes():
    """The plan cache, by value: a hit for the same buffers, for other objects over the same bytes (a
    fresh view), and a miss when the bytes a kernel sees change (size, item size, writability)."""
    cache = plain("transfer_kv_per_layer_mla")._cache
    pool = np.arange(2 * 16 * 8, dtype=np.uint8).reshape(2, 16, 8)
    src = device(pool)
    dst = device(np.zeros((16, 8), np.uint8))
    idx = device(np.array([1, 2], np.int64))
    kv.transfer_kv_per_layer_mla(src[0], dst, idx, idx, 8, 1, 1)
    misses = cache.misses
    kv.transfer_kv_per_layer_mla(src[0], dst, idx, idx, 8, 1, 1)  # a fresh view of the same bytes
    assert cache.misses == misses  # a hit
    kv.transfer_kv_per_layer_mla(src[1], dst, idx, idx, 8, 1, 1)  # another layer: other bytes
    assert cache.misses == misses + 1
    kv.transfer_kv_per_layer_mla(src[0], dst, idx, idx, 16, 1, 1)  # another item_size: another plan
    assert cache.misses == misses + 2
    kv.transfer_kv_per_layer_mla(src[0], dst[:8], idx, idx, 8, 1, 1)  # fewer bytes: another plan, its bounds
    assert cache.misses == misses + 3
    with pytest.raises(kv.IndexOutOfRangeError, match=r"valid tokens are \[0, 8\)"):
        kv.transfer_kv_per_layer_mla(src[0], dst[:8], idx, np.array([1, 8], np.int64), 8, 1, 1)
    if isinstance(dst, np.ndarray):
        dst.shape = (8, 16)  # reshaped in place: the same bytes, the same plan (kernels address bytes)
        kv.transfer_kv_per_layer_mla(src[0], dst, idx, idx, 8, 1, 1)
        assert cache.misses == misses + 3
        dst.flags.writeable = False  # read-only now: another key, refused
        with pytest.raises(ValueError, match="dst is a read-only NumPy array"):
            kv.transfer_kv_per_layer_mla(src[0], dst, idx, idx, 8, 1, 1)


def test_plain_call_with_a_new_object_at_an_old_address_is_bounded_by_its_own_size():
    """Objects that come and go (often at a recycled address) are bounded by their own extent."""
    idx = device(np.array([0], np.int64))
    for rows in (16, 4, 16, 4):
        src = device(np.ones((rows, 8), np.uint8))
        dst = device(np.zeros((rows, 8), np.uint8))
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, 8, 1, 1)
        with pytest.raises(kv.IndexOutOfRangeError, match=rf"valid tokens are \[0, {rows}\)"):
            kv.transfer_kv_per_layer_mla(src, dst, idx, np.array([rows], np.int64), 8, 1, 1)
        del src, dst


@pytest.mark.gpu  # torch CUDA tensors
def test_torch_plan_cache_notices_a_tensor_resized_in_place():
    """A hit re-checks a torch tensor's data pointer and size: resize_ in place is a miss."""
    torch = pytest.importorskip("torch")
    cache = plain("transfer_kv_per_layer_mla")._cache
    src = torch.arange(16 * 8, dtype=torch.uint8, device="cuda").view(16, 8)
    dst = torch.zeros((16, 8), dtype=torch.uint8, device="cuda")
    idx = torch.tensor([1, 2], device="cuda")
    kv.transfer_kv_per_layer_mla(src, dst, idx, idx, 8)
    misses = cache.misses
    kv.transfer_kv_per_layer_mla(src, dst, idx, idx, 8)
    assert cache.misses == misses
    dst.resize_(4, 8)  # same memory, a quarter of the tokens
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[1\] = 5 is out of range .*\[0, 4\)"):
        kv.transfer_kv_per_layer_mla(src, dst, idx, torch.tensor([1, 5]), 8)
    assert cache.misses == misses + 1


@pytest.mark.gpu  # torch CUDA tensors
def test_same_index_tensors_over_layers_then_changed_in_place():
    """The fast path remembers the last index pair; the same tensors over all layers stay exact, and a
    pair changed in place (a resize_) is checked again."""
    torch = pytest.importorskip("torch")
    layers, item, pool = 4, 64, 32
    host_pool = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (pool, layers, item), dtype=np.uint8))
    host_pool = host_pool.pin_memory()
    gpu = [torch.full((pool, item), POISON, dtype=torch.uint8, device="cuda") for _ in range(layers)]
    si = torch.tensor([3, 9, 1, 30], device="cuda")
    di = torch.tensor([0, 5, 6, 7], device="cuda")
    loads = [kv.prepare(kv.transfer_kv_per_layer_mla_pf_lf, src=host_pool, dst=gpu[layer], item_size=item,
                        src_layout_dim=layers * item) for layer in range(layers)]
    for layer in range(layers):
        loads[layer](si, di, layer)
    torch.cuda.synchronize()
    for layer in range(layers):
        np.testing.assert_array_equal(gpu[layer][[0, 5, 6, 7]].cpu().numpy(), host_pool[[3, 9, 1, 30], layer].numpy())
    di.resize_(3)  # same object, same memory, one index fewer
    with pytest.raises(ValueError, match=r"same length, got 4 and 3"):
        loads[0](si, di, 0)
