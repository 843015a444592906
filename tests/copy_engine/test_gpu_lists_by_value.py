"""The copy-engine entry points' plans found by value on a real GPU, with SGLang's call shapes: lists of torch
tensors, a fresh ``pool[layer]`` view and new index tensors (host and device) every call, a side stream. Fresh
views of the same memory hit and copy the right bytes; the same memory reshaped is another plan."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.api.transfer import plain
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

POISON = 0xA5
PAGES, LAYERS, P, ITEM = 16, 4, 16, 128
TOKENS = PAGES * P


def _pools():
    g = torch.Generator().manual_seed(3)
    host = [torch.randint(0, 255, (PAGES, LAYERS, P, ITEM), dtype=torch.uint8, generator=g).pin_memory()
            for _ in range(2)]
    gpu = [torch.full((LAYERS, TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda") for _ in range(2)]
    return host, gpu


def _pages(rng, count):
    pages = rng.choice(PAGES, count, replace=False)
    return (pages[:, None] * P + np.arange(P)).reshape(-1).astype(np.int64)


@pytest.mark.parametrize("where", ["host", "device"])
def test_fresh_views_and_new_index_tensors_hit_and_copy_right(where):
    (hk, hv), (gk, gv) = _pools()
    cache = plain("transfer_kv_per_layer_direct_pf_lf")._cache
    rng = np.random.default_rng(0)
    side = torch.cuda.Stream()
    misses = cache.misses
    for call in range(3):
        s, d = _pages(rng, 4), _pages(rng, 4)
        si, di = torch.from_numpy(s), torch.from_numpy(d)
        if where == "device":
            si, di = si.cuda(), di.cuda()
        for layer in range(LAYERS):
            kv.transfer_kv_per_layer_direct_pf_lf([hk, hv], [gk[layer], gv[layer]], si, di, layer, P, stream=side)
        side.synchronize()
        assert cache.misses == misses + LAYERS  # one plan a layer, then hits for fresh views
        for layer in range(LAYERS):
            for host, gpu in ((hk, gk), (hv, gv)):
                expected = host[:, layer].reshape(TOKENS, ITEM)[torch.from_numpy(s)]
                assert torch.equal(gpu[layer].cpu()[torch.from_numpy(d)], expected)


def test_the_same_memory_reshaped_is_another_plan():
    """Rows of 2 * ITEM bytes over the same memory: another plan, which copies those rows."""
    src = torch.randint(0, 255, (TOKENS, ITEM), dtype=torch.uint8).pin_memory()
    dst = torch.full((TOKENS, ITEM), POISON, dtype=torch.uint8, device="cuda")
    cache = plain("transfer_kv_direct")._cache
    idx, to = torch.tensor([0, 1], dtype=torch.int64), torch.tensor([4, 5], dtype=torch.int64)
    kv.transfer_kv_direct([src], [dst], idx, to, 1, check=True)
    misses = cache.misses
    kv.transfer_kv_direct([src.view(TOKENS // 2, 2 * ITEM)], [dst.view(TOKENS // 2, 2 * ITEM)], idx, to, 1,
                          check=True)
    assert cache.misses == misses + 1
    got, want = dst.view(TOKENS // 2, 2 * ITEM).cpu(), src.view(TOKENS // 2, 2 * ITEM)
    assert torch.equal(got[4:6], want[0:2])

