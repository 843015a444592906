"""Index arrays in GPU memory on the copy-engine entry points, on a real GPU.

Both index tensors on the GPU come to the host through the plan's pinned staging buffer: one asynchronous copy
each on torch's current stream, one wait. These tests make the indices on the current stream just before the call
(no synchronisation in between: the copy must wait for them), call again with other indices of another length
(the buffer reused, then grown), and pass a strided index tensor (refused, as every entry point refuses one). Every destination starts
poisoned and is compared byte for byte with ``kvnumba.reference``.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

POISON = 0xA5
PAGE, LAYERS, ITEM = 16, 4, 256


def as_bytes(t):
    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def pages_of(rng, pool_pages, pages):
    starts = rng.choice(pool_pages, pages, replace=False) * PAGE
    return (starts[:, None] + np.arange(PAGE)).reshape(-1).astype(np.int64)


def made_on_the_gpu(values):
    """``values`` as a GPU tensor computed on torch's current stream (left in flight: no synchronisation)."""
    t = torch.from_numpy(values).cuda()
    return t * 3 - 2 * t  # a kernel on the current stream writes the tensor the call reads


def test_per_layer_load_with_both_index_tensors_on_the_gpu():
    rng = np.random.default_rng(5)
    pool_pages = 64
    pf = [torch.from_numpy(rng.integers(0, 256, (pool_pages, LAYERS, PAGE, ITEM), dtype=np.uint8)).pin_memory()
          for _ in range(2)]
    lf = [torch.full((pool_pages * PAGE, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(2)]
    want = [np.full((pool_pages * PAGE, ITEM), POISON, np.uint8) for _ in range(2)]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    for pages in (4, 2, 40):  # a call, a shorter one (the staging buffer reused), a longer one (grown)
        src, dst = pages_of(rng, pool_pages, pages), pages_of(rng, pool_pages, pages)
        kv.transfer_kv_per_layer_direct_pf_lf(pf, lf, made_on_the_gpu(src), made_on_the_gpu(dst), 1, PAGE,
                                              stream=side)
        side.synchronize()
        reference.transfer_kv_per_layer_direct_pf_lf([p.numpy() for p in pf], want, src, dst, 1, PAGE)
        for got, expected in zip(lf, want):
            assert np.array_equal(as_bytes(got), expected)


def test_transfer_kv_direct_with_both_index_tensors_on_the_gpu():
    rng = np.random.default_rng(6)
    tokens = 2048
    src_layers = [torch.from_numpy(rng.integers(0, 256, (tokens, ITEM), dtype=np.uint8)).cuda() for _ in range(3)]
    host = [torch.full((tokens, ITEM), POISON, dtype=torch.uint8).pin_memory() for _ in range(3)]
    want = [np.full((tokens, ITEM), POISON, np.uint8) for _ in range(3)]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    for count in (100, 1500):
        src, dst = (rng.choice(tokens, count, replace=False).astype(np.int64) for _ in range(2))
        kv.transfer_kv_direct(src_layers, host, made_on_the_gpu(src), made_on_the_gpu(dst), 1, stream=side)
        side.synchronize()
        reference.transfer_kv_direct([as_bytes(x) for x in src_layers], want, src, dst, 1)
        for got, expected in zip(host, want):
            assert np.array_equal(got.numpy(), expected)


def test_strided_gpu_indices_are_refused_as_the_first_call_of_a_process_refuses_them():
    """A strided index tensor gets the validated error whether or not a torch index was seen before."""
    pf = [torch.zeros((8, LAYERS, PAGE, ITEM), dtype=torch.uint8).pin_memory() for _ in range(2)]
    lf = [torch.full((8 * PAGE, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(2)]
    wide = torch.arange(2 * PAGE, dtype=torch.int64, device="cuda")
    for _ in range(2):
        with pytest.raises(ValueError, match="src_indices must be contiguous"):
            kv.transfer_kv_per_layer_direct_pf_lf(pf, lf, wide[::2], wide[:PAGE], 0, PAGE)
    torch.cuda.synchronize()
    for got in lf:
        assert (as_bytes(got) == POISON).all()


def test_out_of_range_gpu_indices_are_refused_and_nothing_is_written():
    pool_pages = 8
    pf = [torch.zeros((pool_pages, LAYERS, PAGE, ITEM), dtype=torch.uint8).pin_memory() for _ in range(2)]
    lf = [torch.full((pool_pages * PAGE, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(2)]
    src = np.arange(PAGE, dtype=np.int64) + pool_pages * PAGE  # one page past the pool
    dst = np.arange(PAGE, dtype=np.int64)
    with pytest.raises(kv.errors.IndexOutOfRangeError, match="src_indices"):
        kv.transfer_kv_per_layer_direct_pf_lf(pf, lf, made_on_the_gpu(src), made_on_the_gpu(dst), 0, PAGE)
    torch.cuda.synchronize()
    for got in lf:
        assert (as_bytes(got) == POISON).all()
