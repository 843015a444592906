"""The three copy-engine entry points on torch tensors at HiCache's scale, on a real GPU.

All-layer backups (GPU -> pinned host) and per-layer loads (pinned host -> GPU) on a side stream,
where thousands of page copies go out as one ``cudaMemcpyBatchAsync``; one-token pages (tens of
thousands of copies); MLA; ``transfer_kv_direct``'s merged runs and scattered tokens; and the legacy
default stream, where the batch call is forbidden (the seed's batch path crashes there) and kvnumba
must copy page by page. Every destination starts poisoned and every byte is compared with
``kvnumba.reference``. Host time and GB/s are ``scripts/bench.py``'s job, not these tests'.
"""
from typing import NamedTuple

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

POISON = 0xA5


class Backup(NamedTuple):
    tokens: int
    page: int
    layers: int
    kinds: int  # 2: K and V buffers; 1: MLA
    item: int  # bytes per token per layer


# HiCache's shape (8192 tokens, page 128, 32 layers) at 256-byte items: the 4096 copies of one batch
# are what matters here, not the bytes. Page 1: 32768 one-token copies. MLA: 1152-byte items.
BACKUPS = {
    "hicache": Backup(8192, 128, 32, 2, 256),
    "page-1": Backup(512, 1, 32, 2, 256),
    "mla": Backup(2048, 64, 32, 1, 1152),
}


def as_bytes(t):
    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def random_layers(count, tokens, item):
    """``count`` layer-first bf16 buffers ``[tokens, item / 2]`` of random bits, on the GPU."""
    return [torch.randint(-2**15, 2**15, (tokens, item // 2), dtype=torch.int16, device="cuda").view(torch.bfloat16)
            for _ in range(count)]


def poisoned(shape, *, pinned):
    t = torch.full(shape, POISON, dtype=torch.uint8)
    return (t.pin_memory() if pinned else t.cuda()).view(torch.bfloat16)


def paged_indices(rng, pages, page):
    """``pages`` whole pages of a pool of ``pages`` pages, in random order: page-start + 0..page-1."""
    starts = rng.choice(pages, pages, replace=False) * page
    return (starts[:, None] + np.arange(page)).reshape(-1).astype(np.int64)


def expected_path(stream_handle):
    return "batch" if kv.batch_copy_available(stream_handle) else "page"


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(as_bytes(g), w), f"destination {i} differs from the reference"


def backup(shape, rng, *, run):
    """Layer-first (GPU) -> page-first-direct (pinned host) for all layers; ``run(call)`` issues it.
    Returns the sources and the checked destinations."""
    pages = shape.tokens // shape.page
    lf = random_layers(shape.kinds * shape.layers, shape.tokens, shape.item)
    pf = [poisoned((pages, shape.layers, shape.page, shape.item), pinned=True) for _ in range(shape.kinds)]
    src = paged_indices(rng, pages, shape.page)
    dst = paged_indices(rng, pages, shape.page)
    torch.cuda.synchronize()
    # GPU indices on the layer-first side, host indices on the pinned side, as HiCache passes them.
    run(lambda **stream: kv.transfer_kv_all_layer_direct_lf_pf(lf, pf, torch.from_numpy(src).cuda(),
                                                               torch.from_numpy(dst), shape.page, **stream))
    want = [np.full(as_bytes(p).shape, POISON, np.uint8) for p in pf]
    reference.transfer_kv_all_layer_direct_lf_pf([as_bytes(x) for x in lf], want, src, dst, shape.page)
    assert_same(pf, want)
    return lf, pf


@pytest.mark.parametrize("shape", BACKUPS.values(), ids=BACKUPS.keys())
def test_all_layer_backup_on_a_side_stream(shape):
    side = torch.cuda.Stream()

    def run(call):
        with torch.cuda.stream(side):
            call()
        side.synchronize()  # waiting on the side stream alone is enough if the copies ran there

    backup(shape, np.random.default_rng(0), run=run)
    assert kv.last_path() == expected_path(side.cuda_stream)


def test_per_layer_load_of_every_layer_on_a_side_stream():
    shape = BACKUPS["hicache"]
    rng = np.random.default_rng(1)
    pages, layers = shape.tokens // shape.page, shape.layers
    pf = [torch.from_numpy(rng.integers(0, 256, (pages, layers, shape.page, shape.item), dtype=np.uint8))
          .pin_memory().view(torch.bfloat16) for _ in range(2)]
    back = [poisoned((shape.tokens, shape.item), pinned=False) for _ in range(2 * layers)]
    src = paged_indices(rng, pages, shape.page)
    dst = paged_indices(rng, pages, shape.page)
    src_host, dst_gpu = torch.from_numpy(src), torch.from_numpy(dst).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for layer in range(layers):
            kv.transfer_kv_per_layer_direct_pf_lf(pf, [back[layer], back[layers + layer]], src_host, dst_gpu, layer,
                                                  shape.page)
    side.synchronize()
    assert kv.last_path() == expected_path(side.cuda_stream)
    pf_bytes = [as_bytes(p) for p in pf]
    want = [np.full(as_bytes(b).shape, POISON, np.uint8) for b in back]
    for layer in range(layers):
        reference.transfer_kv_per_layer_direct_pf_lf(pf_bytes, [want[layer], want[layers + layer]], src, dst, layer,
                                                     shape.page)
    assert_same(back, want)


@pytest.mark.parametrize("indices", ["whole-pages", "scattered"])
def test_transfer_kv_direct_to_pinned_host(indices):
    """Whole pages in both pools merge into page-long runs; scattered tokens are runs of one."""
    tokens, page, layers, item = 8192, 128, 32, 256
    rng = np.random.default_rng(2)
    if indices == "whole-pages":
        src, dst = paged_indices(rng, tokens // page, page), paged_indices(rng, tokens // page, page)
    else:
        src, dst = (rng.choice(tokens, 256, replace=False).astype(np.int64) for _ in range(2))
    lf = random_layers(2 * layers, tokens, item)
    host = [poisoned((tokens, item), pinned=True) for _ in range(2 * layers)]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kv.transfer_kv_direct(lf, host, torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda(), 1)
    side.synchronize()
    assert kv.last_path() == "batch"  # one cudaMemcpyBatchAsync for every run of every layer
    want = [np.full(as_bytes(h).shape, POISON, np.uint8) for h in host]
    reference.transfer_kv_direct([as_bytes(x) for x in lf], want, src, dst, 1)
    assert_same(host, want)


LEGACY = {  # (torch's current stream, explicit stream=): every way a call lands on the legacy stream
    "torch-default-stream": ("default", None),
    "stream=0": ("side", 0),
    "stream=1-cudaStreamLegacy": ("side", 1),
}


@pytest.mark.parametrize("current,explicit", LEGACY.values(), ids=LEGACY.keys())
def test_legacy_default_stream_falls_back_to_page_copies(current, explicit):
    """The driver forbids cudaMemcpyBatchAsync on the legacy default stream: page by page, same bytes."""
    assert not kv.batch_copy_available(0) and not kv.batch_copy_available(1)
    stream = torch.cuda.default_stream() if current == "default" else torch.cuda.Stream()

    def run(call):
        with torch.cuda.stream(stream):
            if explicit is None:
                call()  # torch tensors follow torch's current stream
            else:
                call(stream=explicit)
        torch.cuda.synchronize()

    backup(Backup(1024, 64, 4, 2, 256), np.random.default_rng(3), run=run)
    assert kv.last_path() == "page"
