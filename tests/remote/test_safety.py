"""kvnumba.remote as a hostile peer and a careless user would use it, two agents in this process: one table
per class of failure, each refused with an error naming what is wrong, before anything moves, changing
nothing (tests/remote/test_processes.py has the cases that are about processes across two).

- forged exports: framing or a header field wrong (``ExportError`` naming it, at ``connect``); and
  consistent forgeries (another view's addresses, ``writable`` claimed), refused by the exporter's token;
- exports that no longer stand: unexported, the agent closed or replaced; and the export of a temporary
  view, which stands (the agent holds it) until one of those;
- read-only exports, and read-only local destinations;
- layers the two sides do not both have;
- copies nobody waits for: finished anyway, their staging views given back, the pool shrunk again.
"""
import gc
import time
import weakref

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.remote import Agent, plan_copy, staging
from tests.helpers.forged_exports import CONSISTENT, FIELD_CASES
from tests.helpers.remote_support import LAUNCH, PLACE, SHAPE, expected, read_only, same_bytes, views
from tests.helpers.view_cases import POISON, view_bytes

# nixl: without NIXL each test fails (on the simulator) or is skipped (on a GPU) in one line (tests/conftest.py)
pytestmark = [pytest.mark.needs_target, pytest.mark.nixl]
IDX = np.arange(4, 12, dtype=np.int64)


@pytest.fixture(scope="module")
def agents():
    with Agent("exporter") as exporter, Agent("importer") as importer:
        yield exporter, importer


def state(agent):
    """What an agent knows of others: the agents connected, and the exports loaded into NIXL."""
    return dict(agent._remotes), {name: set(loaded) for name, loaded in agent._loaded.items()}


@pytest.fixture
def genuine(agents):
    """The exporter's pool (exported), and a check that the importer still copies from it correctly."""
    exporter, importer = agents
    pool = views("PageFirst", 1, False, False, PLACE)[1]
    exported = exporter.export(pool)

    def still_works():
        remote = importer.connect(exported)
        cache = views("VllmFlashAttn", 2, True, False, PLACE)[1]
        importer.copy(remote, cache, IDX, IDX, **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, IDX, IDX))

    yield exported, still_works
    exporter.unexport(pool)


@pytest.mark.parametrize("connected", [False, True], ids=["first contact", "exporter already connected"])
@pytest.mark.parametrize("case,forgery,match", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_a_forged_field_is_named_at_connect_and_changes_nothing(agents, genuine, case, forgery, match, connected):
    exporter, importer = agents
    exported, still_works = genuine
    if connected:
        still_works()
    else:
        importer._forget(exporter.name) if exporter.name in importer._remotes else None
    before = state(importer)
    with pytest.raises(kv.ExportError, match=match) as error:
        importer.connect(forgery(exported))
    assert not isinstance(error.value, kv.StaleExportError)
    assert state(importer) == before
    still_works()


def _other_view(exporter, writable):
    """Another view of the exporter, the same layout and geometry, exported (``writable``)."""
    other = views("PageFirst", 5, True, False, PLACE)[1]
    return other, exporter.export(other, writable=writable)


@pytest.mark.parametrize("case", list(CONSISTENT))
def test_a_consistent_forgery_is_refused_by_the_exporters_token(agents, genuine, case):
    """Everything checks out but the header is not the one the exporter wrote: its token says so."""
    exporter, importer = agents
    exported, still_works = genuine
    other, other_export = _other_view(exporter, writable=False)
    before_other = view_bytes(other)
    still_works()
    before = state(importer)
    with pytest.raises(kv.StaleExportError, match="the export was altered"):
        importer.connect(CONSISTENT[case](exported, other_export))
    assert state(importer) == before
    still_works()
    assert same_bytes(view_bytes(other), before_other)
    exporter.unexport(other)


def test_every_descriptor_is_checked_against_the_exports_buffers(agents, genuine):
    """The last line of defence, past connect's checks: a remote view whose addresses no longer agree with
    its buffers (here changed by hand) posts nothing."""
    exporter, importer = agents
    exported, still_works = genuine
    remote = importer.connect(exported)
    remote.side.bases = remote.side.bases + 8  # every item 8 bytes further: the last ones past the buffer
    mine = views("PageFirst", 3, False, False, PLACE)[1]
    for route in ("direct", "staged"):
        with pytest.raises(kv.ExportError, match=r"the copy would reach .* outside side.buffers\[\d\] of its export"):
            importer.copy(mine, remote, np.array([31]), np.array([31]), route=route, **LAUNCH)
    still_works()


# --- exports that no longer stand -------------------------------------------------------------------

def _unexport(exporter, pool, keep):
    exporter.unexport(pool)


def _close(exporter, pool, keep):
    exporter.close()


ENDINGS = {"unexported": _unexport, "the agent closed": _close}


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("op", ["WRITE", "READ"])
def test_an_export_that_no_longer_stands_is_refused(agents, ending, op):
    """The exporter's view ends (two ways); the importer's copies through its export are refused, and
    memory the exporter allocates afterwards (at the same addresses, as like as not) is never written."""
    _, importer = agents
    exporter = Agent("shortlived")
    try:
        keep = [views("PageFirst", 1, True, False, PLACE)[1]]
        remote = importer.connect(exporter.export(keep[0]))
        mine = views("PageFirst", 3, op == "READ", False, PLACE)[1]
        importer.copy(*((mine, remote) if op == "WRITE" else (remote, mine)), IDX, IDX, **LAUNCH).wait(60)
        ENDINGS[ending](exporter, keep[0], keep)
        later = [views("PageFirst", 4, True, False, PLACE)[1] for _ in range(8)]  # what the exporter makes next
        before = [view_bytes(v) for v in later] + [view_bytes(mine)]
        with pytest.raises(kv.StaleExportError, match="is stale"):
            importer.copy(*((mine, remote) if op == "WRITE" else (remote, mine)), IDX, IDX, **LAUNCH).wait(60)
        assert all(same_bytes(view_bytes(v), b) for v, b in zip([*later, mine], before)), "a refused copy wrote"
    finally:
        exporter.close()


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("op", ["WRITE", "READ"])
def test_the_export_of_a_temporary_view_stands_until_unexport_or_close(agents, ending, op):
    """``agent.export(kv.PageFirst(k, v))``, the view made in the call and kept by nobody else: the agent
    holds it, so after a collection copies through the export still land; unexport or close let it go, and
    make the export stale."""
    _, importer = agents
    exporter = Agent("temporary")
    try:
        _, pool = views("PageFirst", 1, op == "WRITE", False, PLACE)
        k, v = pool.k, pool.v
        made = kv.PageFirst(k, v)
        collected = weakref.ref(made)
        exported = exporter.export(made)
        del made, pool  # now nobody but the agent holds the view
        gc.collect()
        remote = importer.connect(exported)
        assert collected() is not None, "the agent let an exported view go"
        mine = views("PageFirst", 3, op == "READ", False, PLACE)[1]
        importer.copy(*((mine, remote) if op == "WRITE" else (remote, mine)), IDX, IDX, **LAUNCH).wait(60)
        if op == "READ":
            assert same_bytes(view_bytes(mine), expected("PageFirst", 1, "PageFirst", 3, IDX, IDX))
        else:
            assert same_bytes(view_bytes(kv.PageFirst(k, v)), expected("PageFirst", 3, "PageFirst", 1, IDX, IDX))
        ENDINGS[ending](exporter, collected(), None)
        gc.collect()
        assert collected() is None, f"{ending}: the agent still holds the view"
        before = view_bytes(mine)
        with pytest.raises(kv.StaleExportError, match="is stale"):
            importer.copy(*((mine, remote) if op == "WRITE" else (remote, mine)), IDX, IDX, **LAUNCH).wait(60)
        assert same_bytes(view_bytes(mine), before)
    finally:
        exporter.close()


def test_an_old_export_of_a_replaced_agent_is_refused_and_the_live_agent_kept(agents):
    """An agent closed and another took its name: connecting the first one's export is refused, and the
    importer keeps the live agent (its views go on copying)."""
    _, importer = agents
    pool = views("PageFirst", 1, False, False, PLACE)[1]
    with Agent("reborn") as first:
        old = first.export(pool)
        importer.connect(old)
    with Agent("reborn") as second:
        live = importer.connect(second.export(pool))
        cache = views("VllmFlashAttn", 2, True, False, PLACE)[1]
        before = state(importer)
        with pytest.raises(kv.StaleExportError, match="is connected here as another agent of that name"):
            importer.connect(old)
        assert state(importer) == before
        importer.copy(live, cache, IDX, IDX, **LAUNCH).wait(60)
        assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, IDX, IDX))


def test_the_export_of_a_closed_agent_is_stale_at_connect(agents):
    _, importer = agents
    pool = views("PageFirst", 1, False, False, PLACE)[1]
    gone = Agent("gone-before-connect")
    exported = gone.export(pool)
    gone.close()
    with pytest.raises(kv.StaleExportError, match="is stale"):
        importer.connect(exported)
    assert "gone-before-connect" not in state(importer)[0]


# --- read-only exports, and read-only local destinations -----------------------------------------------
# NumPy memory (host memory, pageable on a GPU: the direct route, no kernel).

@pytest.mark.parametrize("how", ["flag", "bytes", "writable=False"])
def test_a_read_only_export_is_never_written(agents, how):
    exporter, importer = agents
    pool = views("PageFirst", 1, False, False)[1]
    pool = read_only(pool, how) if how != "writable=False" else pool
    exported = exporter.export(pool, **({"writable": False} if how == "writable=False" else {}))
    remote = importer.connect(exported)
    assert remote.writable is False and repr(remote).endswith(", read-only)")
    before = view_bytes(pool)
    mine = views("PageFirst", 3, False, False)[1]
    with pytest.raises(ValueError, match=r"^dst is a read-only export \(agent 'exporter' .*nothing was moved"):
        importer.copy(mine, remote, IDX, IDX, route="direct")
    assert same_bytes(view_bytes(pool), before)
    cache = views("VllmFlashAttn", 2, True, False)[1]  # reading it is fine
    importer.copy(remote, cache, IDX, IDX, route="direct").wait(60)
    assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, IDX, IDX))
    if how != "writable=False":
        with pytest.raises(ValueError, match=r"writable=True, but the view's memory is read-only \(view.k is a "
                                             "read-only NumPy array"):
            exporter.export(pool, writable=True)
    exporter.unexport(pool)


def test_writable_and_read_only_exports_of_one_view_are_two_exports(agents):
    exporter, importer = agents
    pool = views("PageFirst", 1, True, False)[1]
    read = importer.connect(exporter.export(pool, writable=False))
    write = importer.connect(exporter.export(pool))
    assert (read.writable, write.writable) == (False, True)
    mine = views("PageFirst", 3, False, False)[1]
    importer.copy(mine, write, IDX, IDX, route="direct").wait(60)
    with pytest.raises(ValueError, match="dst is a read-only export"):
        importer.copy(mine, read, IDX, IDX, route="direct")
    with pytest.raises(TypeError, match="writable must be True, False or None, got str"):
        exporter.export(pool, writable="yes")
    exporter.unexport(pool)


@pytest.mark.parametrize("how", ["flag", "bytes"])
def test_a_read_into_a_read_only_local_view_is_refused(agents, how):
    exporter, importer = agents
    pool = views("PageFirst", 1, False, False)[1]
    remote = importer.connect(exporter.export(pool))
    cache = read_only(views("VllmFlashAttn", 2, True, False)[1], how)
    before = view_bytes(cache)
    for route in ("direct", "staged"):
        with pytest.raises(ValueError, match=r"^dst.k\[0\] is a read-only NumPy array; a destination must be writable"):
            importer.copy(remote, cache, IDX, IDX, route=route)
    assert same_bytes(view_bytes(cache), before)
    exporter.unexport(pool)


# --- layers the two sides do not both have ---------------------------------------------------------------

@pytest.mark.parametrize("layers,match", [
    (None, r"the views' layer counts differ: (src|dst) has (3|2), (dst|src) (2|3); pass layers="),
    (2, r"layers=2 is out of range for views of 2 layers"),
    (range(1, 3), r"layers=range\(1, 3\) is out of range for views of 2 layers"),
])
@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_layers_the_sides_do_not_both_have_are_refused_as_kv_copy_refuses_them(agents, op, layers, match):
    exporter, importer = agents
    pool = views("PageFirst", 1, op == "WRITE", False, PLACE)[1]  # 3 layers
    remote = importer.connect(exporter.export(pool))
    fewer = views("PageFirst", 2, op == "READ", False, PLACE, shape=dict(SHAPE, L=2))[1]
    src, dst = (remote, fewer) if op == "READ" else (fewer, remote)
    before = view_bytes(pool), view_bytes(fewer)
    with pytest.raises(ValueError, match=match):
        importer.copy(src, dst, IDX, IDX, layers)
    with pytest.raises(ValueError, match=match):
        plan_copy(src, dst, IDX, IDX, layers)
    assert same_bytes(view_bytes(pool), before[0]) and same_bytes(view_bytes(fewer), before[1])
    if layers is None:
        with pytest.raises(ValueError, match=r"the views' layer counts differ: src_view has"):
            kv.copy(*((pool, fewer) if op == "READ" else (fewer, pool)), IDX, IDX)  # the same rule
    exporter.unexport(pool)


# --- copies nobody waits for ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_copies_dropped_without_wait_finish_and_give_their_staging_back(agents, op):
    """Many staged copies in flight, none waited for: every one lands (READs are relayouted too), their
    NIXL handles are released, the staging views go back to a pool of at most Pool.KEEP views, and the
    registrations of the others end."""
    exporter, importer = agents
    count = 24
    pool = views("PageFirst", 1, op == "WRITE", False, PLACE)[1]
    remote = importer.connect(exporter.export(pool))
    gc.collect()
    registered = len(importer._registered)
    caches = [views("VllmFlashAttn", 10 + i, op == "READ", False, PLACE)[1] for i in range(count)]
    for i, cache in enumerate(caches):  # one token each: the pages differ, so each copy takes its own view
        token = np.array([i], np.int64)
        ends = (remote, cache) if op == "READ" else (cache, remote)
        importer.copy(*ends, token, token, route="staged", **LAUNCH)  # dropped: never waited for
    deadline = time.monotonic() + 120
    while importer._inflight and time.monotonic() < deadline:
        importer._reap()
        time.sleep(0.01)
    assert not importer._inflight
    assert importer._pool.size() <= staging.Pool.KEEP
    for i, cache in enumerate(caches):
        token = np.array([i], np.int64)
        if op == "READ":  # relayouted, though nobody waited
            assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 10 + i, token, token))
    if op == "WRITE":
        want = views("PageFirst", 1, True, False)[0]
        from kvnumba import reference

        for i in range(count):
            reference.copy(views("VllmFlashAttn", 10 + i, False, False)[0], want, np.array([i]), np.array([i]))
        assert same_bytes(view_bytes(pool), view_bytes(want))
    del caches, cache, ends
    gc.collect()
    staged_registrations = sum(len(held.keys) for _, _, held in
                               (entry for entries in importer._pool.free.values() for entry in entries))
    assert len(importer._registered) <= registered + staged_registrations
    exporter.unexport(pool)


def test_poison_is_the_view_cases_poison():
    assert POISON == 0xA5
