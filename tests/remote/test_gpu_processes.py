"""kvnumba.remote on a real GPU, across two processes: VRAM on both sides, and VRAM <-> pinned host memory,
READ and WRITE, both routes (the staged one relayouts with kvnumba's kernel on the GPU), checked byte for
byte against ``kvnumba.reference`` with poisoned destinations; and one request at a realistic size.

Needs NIXL (``nixl_cu13``; on the H200 the bundle of ``../shared/gpu/README.md``). On machines with
TCP only (no RDMA), UCX must have ``tcp`` in ``UCX_TLS`` (the default, all transports, has it).
"""
import base64

import numpy as np
import pytest

from kvnumba import reference
from kvnumba.remote import Agent
from tests.helpers.remote_support import Peer, expected, indices, same_bytes, views
from tests.helpers.view_cases import LAYOUTS, view_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.nixl]  # without NIXL on a GPU: skipped (tests/conftest.py)

ON_DEVICE, ON_HOST = ("device", "numba"), ("host", "numba")
LOCAL_LAYOUTS = ["VllmFlashAttn", "PageFirst", "LayerFirstList", "FlashInferHND"]
# (the peer's memory, this process's memory)
MEMORIES = {"vram-vram": ("gpu", ON_DEVICE), "vram-pinned": ("gpu", ON_HOST), "pinned-vram": ("host", ON_DEVICE)}


@pytest.fixture(scope="module", params=list(MEMORIES))
def setup(request):
    peer_memory, local_place = MEMORIES[request.param]
    with Peer(f"gpu-peer-{request.param}", gpu=peer_memory == "gpu") as peer, \
            Agent(f"gpu-local-{request.param}") as agent:
        yield peer, agent, local_place


@pytest.mark.parametrize("remote", list(LAYOUTS))
@pytest.mark.parametrize("route", ["auto", "direct"])
def test_read_and_write_across_processes(setup, remote, route):
    peer, agent, place = setup
    seed = list(LAYOUTS).index(remote)
    source = agent.connect(peer.export(f"src-{remote}-{route}", remote, seed=seed))
    for i, local in enumerate(LOCAL_LAYOUTS):
        src_idx, dst_idx = indices(10 * seed + i)
        _, cache = views(local, 50 + i, True, False, place)
        done = agent.copy(source, cache, src_idx, dst_idx, route=route).wait(120)
        assert same_bytes(view_bytes(cache), expected(remote, seed, local, 50 + i, src_idx, dst_idx)), repr(done)

        key = f"dst-{remote}-{local}-{route}"
        target = agent.connect(peer.export(key, remote, seed=70 + i, poison=True))
        _, mine = views(local, 90 + i, False, False, place)
        done = agent.copy(mine, target, src_idx, dst_idx, route=route).wait(120)
        assert same_bytes(peer.view_bytes(key), expected(local, 90 + i, remote, 70 + i, src_idx, dst_idx)), repr(done)
        peer.request("unexport", key=key)


def test_mla_across_processes(setup):
    peer, agent, place = setup
    source = agent.connect(peer.export("mla", "PageFirstDirect", seed=3, mla=True))
    src_idx, dst_idx = indices(4)
    _, cache = views("LayerFirstList", 5, True, True, place)
    agent.copy(source, cache, src_idx, dst_idx).wait(120)
    assert same_bytes(view_bytes(cache), expected("PageFirstDirect", 3, "LayerFirstList", 5, src_idx, dst_idx,
                                                  mla=True))


def test_a_request_at_scale():
    """A prefill's page-first pool in pinned host memory (2048 tokens, 8 layers, items of 8 heads x 128
    bf16 = 2 KiB, K and V: 64 MiB), a 1024-token request pulled into a decode's vLLM cache in VRAM
    (pages of 16) through scattered blocks: every byte checked."""
    L, T, P, H, D = 8, 2048, 16, 8, 128
    rng = np.random.default_rng(0)
    from numba import cuda

    import kvnumba as kv

    with Peer("gpu-prefill-scale", gpu=False) as peer, Agent("gpu-decode-scale") as agent:
        peer.request("make_large", key="pool", L=L, T=T, H=H, D=D, seed=1)
        pool = agent.connect(base64.b64decode(peer.request("export", key="pool")["exported"]))
        blocks = T // P
        caches_host = [np.full((2, blocks, P, H, D), 0xA5A5, np.uint16) for _ in range(L)]
        caches = [cuda.to_device(c) for c in caches_host]
        request = np.arange(512, 1536, dtype=np.int64)
        order = rng.permutation(blocks)[:1024 // P]
        slots = (order[:, None] * P + np.arange(P)[None, :]).ravel().astype(np.int64)
        for route, most in (("direct", 1024 * L * 2), ("auto", 2)):
            done = agent.copy(pool, kv.VllmFlashAttn(caches), request, slots, route=route).wait(300)
            assert done.descriptors <= most, repr(done)
        data = np.random.default_rng(1)  # the peer's pool, drawn the same way (remote_peer.py, make_large)
        k, v = (data.integers(0, 2**16, (T, L, H, D), dtype=np.uint16) for _ in range(2))
        want = [c.copy() for c in caches_host]
        reference.copy(kv.PageFirst(k, v), kv.VllmFlashAttn(want), request, slots)
        assert all(np.array_equal(c.copy_to_host(), w) for c, w in zip(caches, want))
