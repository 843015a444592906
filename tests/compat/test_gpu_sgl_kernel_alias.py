"""Transfers through ``sgl_kernel.kvcacheio`` installed by ``kvnumba.compat``, on torch CUDA tensors,
called the way SGLang calls them: pinned host pools ``[L, T, D]`` sliced per layer, layer tables made
by hand from ``data_ptr()`` (uint64, on the GPU), host indices for the copy engines, a side stream.
Every destination byte is compared with ``kvnumba.reference``."""
import numpy as np
import pytest

from kvnumba import compat, reference
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

LAYERS, TOKENS, ELEMS = 4, 1024, 128  # bf16 elements per item: 256-byte items
ITEM = ELEMS * 2
PAGE = 16


@pytest.fixture(autouse=True)
def alias():
    with compat.sgl_kernel_installed() as module:
        yield module


def as_bytes(t):
    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def host_pool():
    return torch.randn(LAYERS, TOKENS, ELEMS, dtype=torch.bfloat16).pin_memory()


def gpu_pool():
    return torch.zeros(LAYERS, TOKENS, ELEMS, dtype=torch.bfloat16, device="cuda")


def raw_table(pool):
    return torch.tensor([pool[layer].data_ptr() for layer in range(LAYERS)], dtype=torch.uint64, device="cuda")


def page_indices(rng, pages):
    """``pages`` distinct pages of the pool, their tokens in order (as SGLang's paged allocator gives)."""
    starts = rng.choice(TOKENS // PAGE, pages, replace=False) * PAGE
    return torch.from_numpy((starts[:, None] + np.arange(PAGE)).reshape(-1).astype(np.int64))


def test_per_layer_and_all_layer_kernels_through_the_alias():
    from sgl_kernel.kvcacheio import transfer_kv_all_layer, transfer_kv_per_layer

    rng = np.random.default_rng(0)
    src_k, src_v = host_pool(), host_pool()
    one_k, one_v, all_k, all_v = gpu_pool(), gpu_pool(), gpu_pool(), gpu_pool()
    si, di = page_indices(rng, 8), page_indices(rng, 8)
    torch.cuda.synchronize()
    transfer_kv_per_layer(src_k[0], one_k[0], src_v[0], one_v[0], si.cuda(), di.cuda(), item_size=ITEM)
    transfer_kv_all_layer(raw_table(src_k), raw_table(all_k), raw_table(src_v), raw_table(all_v), si.cuda(),
                          di.cuda(), item_size=ITEM, num_layers=LAYERS)
    torch.cuda.synchronize()
    for src, one, everything in ((src_k, one_k, all_k), (src_v, one_v, all_v)):
        want = np.zeros_like(as_bytes(everything))
        reference.transfer_kv_all_layer_mla(list(as_bytes(src)), list(want), si.numpy(), di.numpy(), ITEM, LAYERS)
        np.testing.assert_array_equal(as_bytes(everything), want)
        np.testing.assert_array_equal(as_bytes(one), np.concatenate([want[:1], np.zeros_like(want[1:])]))


def test_copy_engines_through_the_alias_on_a_side_stream():
    from sgl_kernel.kvcacheio import transfer_kv_all_layer_direct_lf_pf, transfer_kv_direct

    rng = np.random.default_rng(1)
    src_k, src_v = host_pool(), host_pool()
    dst_k, dst_v = gpu_pool(), gpu_pool()
    si, di = page_indices(rng, 8), page_indices(rng, 8)
    torch.cuda.synchronize()
    transfer_kv_direct([src_k[layer] for layer in range(LAYERS)] + [src_v[layer] for layer in range(LAYERS)],
                       [dst_k[layer] for layer in range(LAYERS)] + [dst_v[layer] for layer in range(LAYERS)],
                       si, di.cuda(), page_size=PAGE)
    torch.cuda.synchronize()
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        want = np.zeros_like(as_bytes(dst))
        reference.transfer_kv_direct(list(as_bytes(src)), list(want), si.numpy(), di.numpy(), PAGE)
        np.testing.assert_array_equal(as_bytes(dst), want)

    # Back up all layers of the GPU pools into page-first-direct host pools, on a side stream.
    pf = [torch.zeros(TOKENS // PAGE, LAYERS, PAGE, ELEMS, dtype=torch.bfloat16).pin_memory() for _ in range(2)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        transfer_kv_all_layer_direct_lf_pf([dst_k[layer] for layer in range(LAYERS)]
                                           + [dst_v[layer] for layer in range(LAYERS)], pf, di, si, PAGE)
    side.synchronize()
    want = [np.zeros_like(as_bytes(p)) for p in pf]
    reference.transfer_kv_all_layer_direct_lf_pf(list(as_bytes(dst_k)) + list(as_bytes(dst_v)), want, di.numpy(),
                                                 si.numpy(), PAGE)
    for got, w in zip(pf, want):
        np.testing.assert_array_equal(as_bytes(got), w)
