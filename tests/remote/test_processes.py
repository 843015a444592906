"""kvnumba.remote across two processes: this one and a peer (``tests/helpers/remote_peer.py``) with its own NIXL
agent and caches. Every layout pair READ from the peer and WRITTEN into it, byte for byte against
``kvnumba.reference`` with poisoned destinations; stale exports, a peer that closes or dies, and
notifications. On the simulator the caches are host memory; on a GPU, this process's are in GPU memory
and the peer's in pinned host memory (``tests/remote/test_gpu_processes.py`` has VRAM on both sides)."""
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.remote import Agent
from tests.helpers.forged_exports import CONSISTENT
from tests.helpers.remote_support import ENDINGS, LAUNCH, PLACE, Peer, expected, indices, same_bytes, views
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, view_bytes

# nixl: without NIXL each test fails (on the simulator) or is skipped (on a GPU) in one line (tests/conftest.py)
pytestmark = [pytest.mark.needs_target, pytest.mark.nixl]
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


# --- exports that no longer stand, read-only exports, forgeries: across processes ---------------------

@pytest.mark.parametrize("op", ["WRITE", "READ"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_an_export_that_no_longer_stands_is_refused_across_processes(ending, op):
    """The peer's view ends (three ways); copies through its export are refused with StaleExportError, and
    the views the peer makes afterwards (at the same addresses, as like as not) are never written."""
    name = f"{ending}-{op}".replace(" ", "-")
    with Agent(f"survivor-{name}") as agent, Peer(f"doomed-{name}") as doomed:
        pool = agent.connect(doomed.export("pool", "PageFirst", seed=15, poison=op == "WRITE"))
        _, cache = views("PageFirst", 16, op == "READ", False, PLACE)
        ends = (pool, cache) if op == "READ" else (cache, pool)
        agent.copy(*ends, np.arange(4), np.arange(4), **LAUNCH).wait(60)
        doomed.end(ending)
        later = []
        if ending == "unexported":
            for i in range(6):
                doomed.request("make", key=f"later-{i}", layout="PageFirst", seed=17, poison=True, mla=False)
                later.append(doomed.view_bytes(f"later-{i}"))
        before = view_bytes(cache)
        with pytest.raises(kv.StaleExportError, match="is stale"):
            agent.copy(*ends, np.arange(4, 12), np.arange(4, 12), **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), before)
        for i, bytes_before in enumerate(later):
            assert same_bytes(doomed.view_bytes(f"later-{i}"), bytes_before), "written into the peer's new memory"


def test_an_export_stands_after_the_peer_drops_its_view():
    """The peer keeps no reference to the view it exported (and collects): the agent there holds it, so copies
    through the export land; closing that agent makes the export stale."""
    with Agent("keeper") as agent, Peer("dropper") as peer:
        pool = agent.connect(peer.export("pool", "PageFirst", seed=21))
        peer.request("drop", key="pool")
        src_idx, dst_idx = indices(22)
        _, cache = views("VllmFlashAttn", 23, True, False, PLACE)
        agent.copy(pool, cache, src_idx, dst_idx, **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), expected("PageFirst", 21, "VllmFlashAttn", 23, src_idx, dst_idx))
        peer.end("the agent closed")
        before = view_bytes(cache)
        with pytest.raises(kv.StaleExportError, match="is stale"):
            agent.copy(pool, cache, src_idx, dst_idx, **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), before)


@pytest.mark.parametrize("how", ["flag", "bytes", "writable=False"])
def test_a_read_only_export_is_never_written_across_processes(agent, peer, how):
    key = f"read-only-{how}"
    options = {"writable": False} if how == "writable=False" else {"read_only": how}
    target = agent.connect(peer.export(key, "PageFirst", seed=18, **options))
    assert target.writable is False
    before = peer.view_bytes(key)
    _, cache = views("PageFirst", 19, False, False, PLACE)
    with pytest.raises(ValueError, match="^dst is a read-only export"):
        agent.copy(cache, target, np.arange(4), np.arange(4), **LAUNCH)
    assert same_bytes(peer.view_bytes(key), before)
    _, mine = views("PageFirst", 20, True, False, PLACE)
    agent.copy(target, mine, np.arange(4), np.arange(4), **LAUNCH).wait(60)
    assert same_bytes(view_bytes(mine), expected("PageFirst", 18, "PageFirst", 20, np.arange(4), np.arange(4)))
    peer.request("unexport", key=key)


def test_an_old_export_of_a_peer_whose_name_was_reused_is_refused(agent):
    """A peer process ended and another took its agent's name: the first one's export is refused at
    connect, and this agent keeps the running one."""
    with Peer("reused") as first:
        old = first.export("pool", "PageFirst", seed=21)
        agent.connect(old)
        first.request("close")
    with Peer("reused") as second:
        live = agent.connect(second.export("pool", "PageFirst", seed=22))
        with pytest.raises(kv.StaleExportError, match="is stale"):
            agent.connect(old)
        _, cache = views("PageFirst", 23, True, False, PLACE)
        agent.copy(live, cache, np.arange(4), np.arange(4), **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), expected("PageFirst", 22, "PageFirst", 23, np.arange(4), np.arange(4)))


def test_a_forgery_pointing_at_another_view_of_the_peer_is_refused(agent, peer):
    """A consistent forgery: the header of one export of the peer with the memory (addresses, regions,
    NIXL metadata) of another, writable where that one was exported read-only."""
    writable = peer.export("forged-writable", "PageFirst", seed=24, poison=True)
    protected_bytes = peer.export("forged-protected", "PageFirst", seed=25, writable=False)
    forged = CONSISTENT["bases at another exported view"](writable, protected_bytes)
    before = peer.view_bytes("forged-protected")
    with pytest.raises(kv.StaleExportError, match="the export was altered"):
        agent.connect(forged)
    _, cache = views("PageFirst", 26, False, False, PLACE)
    target = agent.connect(protected_bytes)
    with pytest.raises(ValueError, match="^dst is a read-only export"):
        agent.copy(cache, target, np.arange(4), np.arange(4), **LAUNCH)
    assert same_bytes(peer.view_bytes("forged-protected"), before)
