"""Plans found by value, and what prepared transfers hold, on a real GPU with torch tensors.

SGLang's call shapes (a fresh ``pool[layer]`` view and new index tensors every call) must hit the plan
cache and copy the right bytes, on both load kernels. What a by-value key cannot see must still be
refused: pinned memory freed and replaced by pageable memory at the same address, memory unregistered
after ``cuda.pinned``, torch tensors resized or re-pointed under a prepared transfer. Every destination
starts poisoned; every byte is compared.
"""
import gc

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.api.transfer import clear_plan_caches, plain
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

POISON = 0xA5
ITEM, LAYERS, TOKENS = 256, 4, 2048


@pytest.fixture
def load_path(monkeypatch):
    def use(path):
        monkeypatch.setenv("KVNUMBA_LOAD_PATH", path)
        clear_plan_caches()

    yield use
    clear_plan_caches()


def _pools(seed=0):
    g = torch.Generator().manual_seed(seed)
    host_k = torch.randint(0, 255, (LAYERS, TOKENS, ITEM), dtype=torch.uint8, generator=g).pin_memory()
    host_v = torch.randint(0, 255, (LAYERS, TOKENS, ITEM), dtype=torch.uint8, generator=g).pin_memory()
    dev_k = [torch.full((TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    dev_v = [torch.full((TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    return host_k, host_v, dev_k, dev_v


@pytest.mark.parametrize("path", ["staged", "register"])
def test_fresh_views_and_new_index_tensors_hit_and_copy_right(path, load_path):
    load_path(path)
    host_k, host_v, dev_k, dev_v = _pools()
    cache = plain("transfer_kv_per_layer")._cache
    rng = np.random.default_rng(0)
    for batch in range(3):
        src = torch.from_numpy(rng.permutation(TOKENS)[:1024].astype(np.int64)).cuda()  # new tensors each batch
        dst = torch.from_numpy(rng.permutation(TOKENS)[:1024].astype(np.int64)).cuda()
        misses = cache.misses
        for layer in range(LAYERS):
            kv.transfer_kv_per_layer(host_k[layer], dev_k[layer], host_v[layer], dev_v[layer], src, dst, ITEM)
        assert cache.misses == (misses + LAYERS if batch == 0 else misses)  # one plan per layer, then hits
        torch.cuda.synchronize()
        s, d = src.cpu(), dst.cpu()
        for layer in range(LAYERS):
            assert torch.equal(dev_k[layer].cpu()[d], host_k[layer][s])
            assert torch.equal(dev_v[layer].cpu()[d], host_v[layer][s])
    plan = list(cache.entries.values())[-1].plan
    assert (plan.kernel is not plan.register_kernel) == (path == "staged")


def test_pinned_memory_freed_and_replaced_by_pageable_memory_is_refused():
    """The plan of a pinned buffer is not reused for pageable memory at the same address."""
    dev = torch.full((TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda")
    idx = torch.arange(8, device="cuda")
    pinned = torch.ones((TOKENS, ITEM), dtype=torch.uint8).pin_memory()
    address = pinned.data_ptr()
    kv.transfer_kv_per_layer_mla(pinned[:], dev, idx, idx, ITEM)  # the plan is cached
    torch.cuda.synchronize()
    del pinned
    gc.collect()
    torch._C._host_emptyCache()  # the pinned block goes back to the driver (cudaFreeHost)
    same_address = None
    held = []
    for _ in range(64):  # pageable tensors of the same size until one lands where the pinned one was
        candidate = torch.ones((TOKENS, ITEM), dtype=torch.uint8)
        if candidate.data_ptr() == address:
            same_address = candidate
            break
        held.append(candidate)
    pageable = same_address if same_address is not None else held[-1]
    assert not pageable.is_pinned()
    dev.fill_(POISON)
    with pytest.raises(kv.PageableMemoryError, match=r"src is a CPU torch tensor in pageable host memory"):
        kv.transfer_kv_per_layer_mla(pageable[:], dev, idx, idx, ITEM)
    torch.cuda.synchronize()
    assert (dev.cpu() == POISON).all()
    print(f"pageable memory at the freed pinned address: {same_address is not None}")


def test_numpy_memory_unregistered_after_cuda_pinned_is_refused():
    from numba import cuda

    src = cuda.to_device(np.ones((64, ITEM), np.uint8))
    dst = np.full((64, ITEM), POISON, np.uint8)  # pageable, registered for the with block only
    idx = cuda.to_device(np.arange(8, dtype=np.int64))
    with cuda.pinned(dst):
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, check=True)
        assert (dst[:8] == 1).all()
    dst[...] = POISON
    with pytest.raises(kv.PageableMemoryError, match=r"dst is a NumPy array in pageable host memory"):
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM)
    assert (dst == POISON).all()


def test_prepared_transfer_refuses_a_torch_buffer_whose_storage_was_reallocated():
    host_k, host_v, dev_k, dev_v = _pools()
    load = kv.prepare(kv.transfer_kv_per_layer, src_k=host_k[0], dst_k=dev_k[0], src_v=host_v[0], dst_v=dev_v[0],
                      item_size=ITEM)
    idx = torch.arange(16, device="cuda")
    load(idx, idx)
    torch.cuda.synchronize()
    grown = dev_k[0]
    grown.resize_(4 * TOKENS, ITEM)  # more bytes than its storage: reallocated, the old block freed
    grown.fill_(POISON)
    with pytest.raises(kv.BufferMovedError, match=r"^dst_k moved since kv.prepare"):
        load(idx, idx)
    torch.cuda.synchronize()
    assert (grown.cpu() == POISON).all()


def test_prepared_transfer_keeps_writing_its_own_memory_after_set_():
    host_k, host_v, dev_k, dev_v = _pools()
    prepared_memory = dev_k[1]
    keep = prepared_memory.detach()  # to read it back afterwards
    load = kv.prepare(kv.transfer_kv_per_layer, src_k=host_k[1], dst_k=prepared_memory, src_v=host_v[1],
                      dst_v=dev_v[1], item_size=ITEM)
    other = torch.full((TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda")
    prepared_memory.set_(other)  # the caller's tensor now points elsewhere
    idx = torch.arange(16, device="cuda")
    load(idx, idx)
    torch.cuda.synchronize()
    assert torch.equal(keep[:16].cpu(), host_k[1][:16])  # written where it was prepared
    assert (other.cpu() == POISON).all()


def test_plain_call_after_resize_is_bounded_by_the_new_extent():
    host_k, host_v, dev_k, dev_v = _pools()
    src, dst = host_k[2].clone().pin_memory(), dev_k[2]
    idx = torch.arange(4, device="cuda")
    kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM)
    dst.resize_(8, ITEM)  # same storage, fewer tokens
    far = torch.tensor([1, 9], device="cuda")
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[1\] = 9 is out of range"):
        kv.transfer_kv_per_layer_mla(src, dst, far, far, ITEM, check=True)


def test_many_staged_plans_recycle_their_maps_and_stay_right(load_path):
    """More plans than a small map store holds: retired blocks are reused after a synchronisation."""
    from kvnumba.plan import tensor_maps

    from kvnumba import config

    store = tensor_maps.MapStore()
    store.SLAB_BLOCKS, store.RECYCLE_AT = 4, 4
    load_path("staged")
    host = torch.randint(0, 255, (64, TOKENS // 4, ITEM), dtype=torch.uint8).pin_memory()
    idx = torch.arange(TOKENS // 4, device="cuda")
    with config.override(map_store=store):
        for round_ in range(40):
            view = host[round_]  # a new plan each time (another address); the previous plan goes away
            out = torch.full((TOKENS // 4, ITEM), POISON, dtype=torch.uint8, device="cuda")
            load = kv.prepare(kv.transfer_kv_per_layer_mla, src=view, dst=out, item_size=ITEM)
            load(idx, idx)
            torch.cuda.synchronize()
            assert torch.equal(out.cpu(), view)
            del load
            gc.collect()
    assert len(store._slabs) <= 3  # blocks were recycled, not leaked
