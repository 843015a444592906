"""Cache views on a real GPU: a view's torch buffers given new memory in place, where the freed memory is
really reused (torch's caching allocators, device and pinned host), are refused at the next ``kv.copy``.

Each case builds a view over torch tensors (CUDA, or pinned host for SGLang's host pool), runs one
``kv.copy`` so that a plan with the old addresses is cached, changes a buffer in place (``resize_``,
``set_``, ``.data =``, its storage resized), then allocates "victims" of the freed block's size filled with
POISON, which torch's allocator places in the freed memory. The next ``kv.copy`` must raise ``ValueError``
naming the view and the buffer, and write nothing: the victims stay POISON, every other buffer is
as it was, and a transfer afterwards shows the CUDA context alive. Run it under
``compute-sanitizer --tool memcheck`` too: it must report no error.

``tests/safety/test_views.py`` runs every one of its tables on the GPU as well, with
Numba device arrays, CUDA and pinned torch tensors, in guarded allocations.
"""
import re

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.checks import guard
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

POISON = 0xA5
L, T, P, H, D = 4, 256, 16, 8, 64  # int16: items of 1 KiB, caches of 256 KiB per layer
IDX = np.arange(0, 64, dtype=np.int64)


@pytest.fixture(autouse=True)
def live_context_after():
    guard.clear()
    yield
    torch.cuda.synchronize()
    src = torch.randint(-2**15, 2**15, (T, 64), dtype=torch.int16, device="cuda")
    dst = torch.zeros_like(src)
    idx = torch.randperm(T, device="cuda")[:64]
    kv.transfer_kv_per_layer_mla(src, dst, idx, idx, 128, check=True)
    want = np.zeros((T, 64), np.int16)
    reference.transfer_kv_per_layer_mla(src.cpu().numpy(), want, idx.cpu().numpy(), idx.cpu().numpy(), 128)
    np.testing.assert_array_equal(dst.cpu().numpy(), want)


def _poisoned(shape, pinned=False):
    t = torch.full(shape, POISON * 257 - 65536, dtype=torch.int16)  # every byte 0xA5
    return t.pin_memory() if pinned else t.cuda()


def _random(shape, seed, pinned=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-2**15, 2**15, shape, dtype=torch.int16, generator=g)
    return t.pin_memory() if pinned else t.cuda()


def _is_poison(t):
    return bool((t.cpu().view(torch.uint8) == POISON).all())


def _resize_grow(t):
    t.resize_(t.numel() * 4)


def _resize_shrink(t):
    t.resize_(t.numel() // 4)


def _set_empty(t):
    t.set_(torch.empty(0, dtype=t.dtype, device=t.device, pin_memory=t.is_pinned()))


def _data_smaller(t):
    smaller = torch.zeros(t.numel() // 4, dtype=t.dtype)
    t.data = smaller.pin_memory() if t.is_pinned() else smaller.to(t.device)


def _storage_freed(t):
    t.untyped_storage().resize_(0)


MUTATIONS = {"resize_grow": _resize_grow, "resize_shrink": _resize_shrink, "set_empty": _set_empty,
             "data_smaller": _data_smaller, "storage_freed": _storage_freed}


def _scene(kind):
    """``(src view, dst view, {side: (tensor to change, its label)}, every buffer)``: SGLang's pinned host
    pool (PageFirst) and a GPU cache (vLLM's flash-attention layers, or K and V layer lists), loaded from
    the pool (``load_*``) or backed up into it (``backup``). Destinations start POISON."""
    load = kind != "backup"
    pool_k, pool_v = ((_random((T, L, H, D), s, pinned=True) if load else _poisoned((T, L, H, D), pinned=True))
                      for s in (1, 2))
    pool = kv.PageFirst(pool_k, pool_v)
    make = _poisoned if load else (lambda shape: _random(shape, 3 + shape[0]))
    if kind == "backup" or kind == "load_vllm":
        caches = [make((2, T // P, P, H, D)) for _ in range(L)]
        gpu, gpu_buffers, gpu_change = kv.VllmFlashAttn(caches), caches, (caches[1], "caches[1]")
    else:
        k, v = [make((T, H, D)) for _ in range(L)], [make((T, H, D)) for _ in range(L)]
        gpu, gpu_buffers, gpu_change = kv.LayerFirst(k, v), k + v, (v[1], "v[1]")
    if load:
        return pool, gpu, {"src": (pool_k, "k"), "dst": gpu_change}, [pool_k, pool_v, *gpu_buffers]
    return gpu, pool, {"src": gpu_change, "dst": (pool_v, "v")}, [*gpu_buffers, pool_k, pool_v]


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("side", ["src", "dst"])
@pytest.mark.parametrize("kind", ["load_vllm", "load_layer_lists", "backup"])
def test_a_buffer_changed_in_place_is_refused_and_its_freed_memory_untouched(kind, side, mutation):
    src, dst, change, buffers = _scene(kind)
    tensor, label = change[side]
    layer = 1
    idx = torch.from_numpy(IDX).cuda()
    kv.copy(src, dst, idx, idx, layer)  # a cached plan holding the old addresses
    torch.cuda.synchronize()
    old_ptr, old_bytes = tensor.data_ptr(), tensor.untyped_storage().nbytes()
    pinned = tensor.is_pinned()
    before = [b.clone() for b in buffers if b is not tensor]
    try:
        MUTATIONS[mutation](tensor)
    except RuntimeError as error:  # torch itself refuses this change of this kind of tensor: nothing to check
        pytest.skip(f"torch refuses {mutation} on this tensor: {error}")
    victims = [_poisoned((old_bytes // 2,), pinned) for _ in range(4)]  # the allocator hands out the freed block
    reused = any(v.data_ptr() <= old_ptr < v.data_ptr() + v.nbytes for v in victims)
    single = label in ("k", "v")  # a pool buffer holds every layer
    for layers in (layer, None, range(0, L)):
        with pytest.raises(ValueError, match=rf"{side}_view \(.*\) changed in place since it was made .*"
                                             rf"{re.escape(label)}, a torch tensor, is now \d+ bytes"):
            kv.copy(src, dst, idx, idx, layers)
    torch.cuda.synchronize()
    assert all(_is_poison(v) for v in victims), f"a victim was written (the freed block was reused: {reused})"
    for got, want in zip([b for b in buffers if b is not tensor], before):
        assert torch.equal(got.cpu(), want.cpu())
    if not single:  # the layers whose buffers did not change still copy, and check=True sees nothing skipped
        kv.copy(src, dst, idx, idx, 0, check=True)
        torch.cuda.synchronize()
        assert all(_is_poison(v) for v in victims)


def test_freed_pinned_pool_reused_by_the_next_pool():
    """SGLang's host pool is replaced by a new pinned tensor of the same size: the caching host allocator
    gives the new one the old block. A view over the old pool must not write into the new one."""
    pool_k, pool_v = (_poisoned((T, L, H, D), pinned=True) for _ in range(2))
    view = kv.PageFirst(pool_k, pool_v)
    gpu = kv.LayerFirst([_random((T, H, D), i) for i in range(L)], [_random((T, H, D), 10 + i) for i in range(L)])
    idx = torch.from_numpy(IDX).cuda()
    kv.copy(gpu, view, idx, idx)
    torch.cuda.synchronize()
    for t in (pool_k, pool_v):
        t.set_(torch.empty(0, dtype=t.dtype, pin_memory=True))
    new_pools = [_poisoned((T, L, H, D), pinned=True) for _ in range(2)]
    with pytest.raises(ValueError, match=r"dst_view \(PageFirst.*\) changed in place since it was made .*k, a torch "
                                         r"tensor, is now 0 bytes"):
        kv.copy(gpu, view, idx, idx)
    torch.cuda.synchronize()
    assert all(_is_poison(t) for t in new_pools)
