"""kvnumba.remote across two processes: this one and a peer (``tests/helpers/remote_peer.py``) with its own NIXL
agent and caches. Every layout pair READ from the peer and WRITTEN into it, byte for byte against
``kvnumba.reference`` with poisoned destinations; stale exports, a peer that closes or dies, and
notifications. On the simulator the caches are host memory; on a GPU, this process's are in GPU memory
and the peer's in pinned host memory (``tests/remote/test_gpu_processes.py`` has VRAM on both sides)."""
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from kvnumba.remote import Agent
from tests.helpers.remote_support import Peer, expected, indices, same_bytes, views
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, view_bytes

# nixl: without NIXL each test fails (on the simulator) or is skipped (on a GPU) in one line (tests/conftest.py)
pytestmark = [pytest.mark.needs_target, pytest.mark.nixl]
PLACE = None if SIMULATOR else ("device", "numba")
LAUNCH = dict(block_quota=1, num_warps_per_block=2)
NAMES = list(LAYOUTS)


@pytest.fixture(scope="module")
def peer():
    with Peer("prefill") as p:
        yield p


@pytest.fixture(scope="module")
def agent():
    with Agent("decode") as a:
        yield a


@pytest.fixture(scope="module")
def sources(peer, agent):
    """One exported source cache per layout in the peer, connected here."""
    return {name: agent.connect(peer.export(f"src-{name}", name, seed=100 + i)) for i, name in enumerate(NAMES)}


@pytest.mark.parametrize("remote", NAMES)
def test_read_every_layout_pair_from_another_process(agent, sources, remote):
    seed = 100 + NAMES.index(remote)
    for i, local in enumerate(NAMES):
        src_idx, dst_idx = indices(seed * 10 + i)
        _, cache = views(local, 200 + i, True, False, PLACE)
        done = agent.copy(sources[remote], cache, src_idx, dst_idx, **LAUNCH).wait(60)
        want = expected(remote, seed, local, 200 + i, src_idx, dst_idx)
        assert same_bytes(view_bytes(cache), want), f"{remote} -> {local}: {done!r}"


@pytest.mark.parametrize("remote", NAMES)
def test_write_every_layout_pair_into_another_process(agent, peer, remote):
    for i, local in enumerate(NAMES):
        key = f"dst-{remote}-{local}"
        target = agent.connect(peer.export(key, remote, seed=300 + i, poison=True))
        src_idx, dst_idx = indices(i)
        _, cache = views(local, 400 + i, False, False, PLACE)
        done = agent.copy(cache, target, src_idx, dst_idx, **LAUNCH).wait(60)
        want = expected(local, 400 + i, remote, 300 + i, src_idx, dst_idx)
        assert same_bytes(peer.view_bytes(key), want), f"{local} -> {remote}: {done!r}"
        peer.request("unexport", key=key)


@pytest.mark.parametrize("remote", [n for n in NAMES if n not in KV_ONLY])
def test_mla_across_processes(agent, peer, remote):
    source = agent.connect(peer.export(f"mla-{remote}", remote, seed=5, mla=True))
    target = agent.connect(peer.export(f"mla-dst-{remote}", remote, seed=6, poison=True, mla=True))
    src_idx, dst_idx = indices(7)
    _, cache = views("PageFirst", 8, True, True, PLACE)
    agent.copy(source, cache, src_idx, dst_idx, **LAUNCH).wait(60)
    assert same_bytes(view_bytes(cache), expected(remote, 5, "PageFirst", 8, src_idx, dst_idx, mla=True))
    agent.copy(cache, target, dst_idx, src_idx, **LAUNCH).wait(60)
    final, _ = views("PageFirst", 8, True, True)
    want_target, _ = views(remote, 6, True, True)
    from kvnumba import reference

    reference.copy(views(remote, 5, False, True)[0], final, src_idx, dst_idx)
    reference.copy(final, want_target, dst_idx, src_idx)
    assert same_bytes(peer.view_bytes(f"mla-dst-{remote}"), view_bytes(want_target))


def test_disaggregated_handoff_posts_one_descriptor_per_run(agent, peer):
    """A prefill's page-first pool, a request's 16 tokens pulled into a decode's vLLM blocks."""
    pool = agent.connect(peer.export("handoff", "PageFirst", seed=9))
    _, cache = views("VllmFlashAttn", 10, True, False, PLACE)
    request = np.arange(4, 20)
    slots = np.concatenate([np.arange(28, 32), np.arange(0, 12)])  # vLLM blocks 7, 0, 1, 2
    done = agent.copy(pool, cache, request, slots, **LAUNCH).wait(60)
    assert done.route == "staged" and done.descriptors == 2 and done.op == "READ"
    assert same_bytes(view_bytes(cache), expected("PageFirst", 9, "VllmFlashAttn", 10, request, slots))


def test_notification_reaches_the_other_process(agent, peer):
    target = agent.connect(peer.export("notified", "PageFirst", seed=11, poison=True))
    _, cache = views("PageFirst", 12, False, False, PLACE)
    agent.copy(cache, target, np.arange(4), np.arange(4), notify=b"request-42").wait(60)
    got, deadline = {}, time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = peer.request("notifications")["notifications"]
        time.sleep(0.001)
    assert got == {"decode": ["request-42"]}


def test_unexported_view_is_stale_across_processes(agent, peer):
    pool = agent.connect(peer.export("short", "PageFirst", seed=13))
    _, cache = views("PageFirst", 14, True, False, PLACE)
    agent.copy(pool, cache, np.arange(2), np.arange(2)).wait(60)
    peer.request("unexport", key="short")
    before = view_bytes(cache)
    with pytest.raises(kv.StaleExportError, match="is stale"):
        agent.copy(pool, cache, np.arange(8), np.arange(8))
    assert same_bytes(view_bytes(cache), before)


@pytest.mark.parametrize("ending", ["close", "kill"])
def test_a_peer_that_closes_or_dies_fails_the_copy(ending):
    with Agent(f"survivor-{ending}") as agent, Peer(f"doomed-{ending}") as doomed:
        pool = agent.connect(doomed.export("pool", "PageFirst", seed=15))
        _, cache = views("VllmFlashAttn", 16, True, False, PLACE)
        agent.copy(pool, cache, np.arange(4), np.arange(4)).wait(60)
        before = view_bytes(cache)
        if ending == "close":
            doomed.request("close")
        else:
            doomed.kill()
        with pytest.raises((kv.RemoteError, kv.StaleExportError)):
            agent.copy(pool, cache, np.arange(4, 12), np.arange(4, 12)).wait(60)
        assert same_bytes(view_bytes(cache), before)
