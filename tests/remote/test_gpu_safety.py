"""kvnumba.remote's refusals on a real GPU, VRAM on both sides across two processes (the simulator's twins:
tests/remote/test_safety.py and test_processes.py): forged exports of VRAM, exports that no longer stand,
read-only exports, and staged copies nobody waits for. Every refused copy leaves the peer's VRAM as it was.

Needs NIXL (``nixl_cu13``; on the H200 the bundle of ``../shared/gpu/README.md``). compute-sanitizer
memcheck runs over this file too: a write outside what the peer registered would be an error there only
if it landed outside an allocation, so the bytes are checked as well.
"""
import gc
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.remote import Agent, staging
from tests.helpers.forged_exports import CONSISTENT, FIELD_CASES
from tests.helpers.remote_support import ENDINGS, Peer, expected, same_bytes, views
from tests.helpers.view_cases import view_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.nixl]  # without NIXL on a GPU: skipped (tests/conftest.py)

ON_DEVICE = ("device", "numba")
IDX = np.arange(4, 12, dtype=np.int64)


@pytest.fixture(scope="module")
def peer():
    with Peer("gpu-safety-peer", gpu=True) as p:
        yield p


@pytest.fixture(scope="module")
def agent():
    with Agent("gpu-safety-local") as a:
        yield a


def state(agent):
    return dict(agent._remotes), {name: set(loaded) for name, loaded in agent._loaded.items()}


@pytest.mark.parametrize("case,forgery,match", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_a_forged_field_of_a_vram_export_is_named_at_connect(agent, peer, case, forgery, match):
    exported = peer.export("genuine", "PageFirst", seed=1)
    before = state(agent)
    with pytest.raises(kv.ExportError, match=match):
        agent.connect(forgery(exported))
    assert state(agent) == before
    _, cache = views("VllmFlashAttn", 2, True, False, ON_DEVICE)
    agent.copy(agent.connect(exported), cache, IDX, IDX).wait(120)  # the genuine export still works
    assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, IDX, IDX))


@pytest.mark.parametrize("case", list(CONSISTENT))
def test_a_consistent_forgery_of_a_vram_export_is_refused(agent, peer, case):
    exported = peer.export("forge-base", "PageFirst", seed=3)
    other = peer.export("forge-other", "PageFirst", seed=4, poison=True, writable=False)
    before = peer.view_bytes("forge-other")
    with pytest.raises(kv.StaleExportError, match="the export was altered"):
        agent.connect(CONSISTENT[case](exported, other))
    assert same_bytes(peer.view_bytes("forge-other"), before)


@pytest.mark.parametrize("op", ["WRITE", "READ"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_vram_export_that_no_longer_stands_is_refused(ending, op):
    name = f"gpu-{ending}-{op}".replace(" ", "-")
    with Agent(f"survivor-{name}") as agent, Peer(f"doomed-{name}", gpu=True) as doomed:
        pool = agent.connect(doomed.export("pool", "PageFirst", seed=5, poison=op == "WRITE"))
        _, cache = views("PageFirst", 6, op == "READ", False, ON_DEVICE)
        ends = (pool, cache) if op == "READ" else (cache, pool)
        agent.copy(*ends, IDX, IDX).wait(120)
        doomed.end(ending)
        later = []
        if ending == "unexported":  # the peer's next VRAM, likely at the same address
            for i in range(6):
                doomed.request("make", key=f"later-{i}", layout="PageFirst", seed=7, poison=True, mla=False)
                later.append(doomed.view_bytes(f"later-{i}"))
        before = view_bytes(cache)
        with pytest.raises(kv.StaleExportError, match="is stale"):
            agent.copy(*ends, np.arange(12, 20), np.arange(12, 20)).wait(120)
        assert same_bytes(view_bytes(cache), before)
        for i, bytes_before in enumerate(later):
            assert same_bytes(doomed.view_bytes(f"later-{i}"), bytes_before), "written into the peer's new VRAM"


def test_a_read_only_vram_export_is_never_written(agent, peer):
    target = agent.connect(peer.export("read-only", "VllmFlashAttn", seed=8, writable=False))
    assert not target.writable
    before = peer.view_bytes("read-only")
    _, mine = views("PageFirst", 9, False, False, ON_DEVICE)
    for route in ("direct", "staged"):
        with pytest.raises(ValueError, match="^dst is a read-only export"):
            agent.copy(mine, target, IDX, IDX, route=route)
    assert same_bytes(peer.view_bytes("read-only"), before)
    _, cache = views("PageFirst", 10, True, False, ON_DEVICE)
    agent.copy(target, cache, IDX, IDX).wait(120)
    assert same_bytes(view_bytes(cache), expected("VllmFlashAttn", 8, "PageFirst", 10, IDX, IDX))


def test_vram_copies_dropped_without_wait_finish_and_give_their_staging_back(agent, peer):
    pool = agent.connect(peer.export("dropped", "PageFirst", seed=11))
    count = 64
    caches = [views("VllmFlashAttn", 100 + i, True, False, ON_DEVICE)[1] for i in range(count)]
    for i, cache in enumerate(caches):
        token = np.array([i % 32], np.int64)
        agent.copy(pool, cache, token, token, route="staged")  # never waited for
    deadline = time.monotonic() + 300
    while agent._inflight and time.monotonic() < deadline:
        agent._reap()
        time.sleep(0.01)
    assert not agent._inflight and agent._pool.size() <= staging.Pool.KEEP
    for i, cache in enumerate(caches):
        token = np.array([i % 32], np.int64)
        assert same_bytes(view_bytes(cache), expected("PageFirst", 11, "VllmFlashAttn", 100 + i, token, token))
    del caches, cache
    gc.collect()
