"""kvnumba.remote with two NIXL agents in this process (UCX, host memory on the simulator; device or pinned
memory on a GPU): every layout pair, READ and WRITE, each route, checked byte for byte against
``kvnumba.reference`` with poisoned destinations; and the promises: named errors with nothing written,
stale exports, failures that never report success, close()."""
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.remote import Agent, RemoteView, plan_copy
from tests.helpers.placement import PLACE as PLACE_ARRAY
from tests.helpers.remote_support import LAUNCH, PLACE, SHAPE, expected, indices, same_bytes, views
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, view_bytes

# nixl: without NIXL each test fails (on the simulator) or is skipped (on a GPU) in one line (tests/conftest.py)
pytestmark = [pytest.mark.needs_target, pytest.mark.nixl]  # the staged route relayouts with kv.copy
PAIRS = [(s, d) for s in LAYOUTS for d in LAYOUTS]
MLA_LAYOUTS = [name for name in LAYOUTS if name not in KV_ONLY]


def I(*tokens):  # noqa: E743 - int64 token indices, short
    return np.array(tokens, np.int64)


@pytest.fixture(scope="module")
def agents():
    with Agent("prefill") as prefill, Agent("decode") as decode:
        yield prefill, decode


def _read(agents, s, d, route, mla=False, layers=None, seed=0):
    """decode READs from prefill's ``s`` view into its own poisoned ``d`` view; returns the copy."""
    return _copy(agents, s, d, route, mla, layers, seed, read=True)


def _write(agents, s, d, route, mla=False, layers=None, seed=0):
    """prefill WRITEs its ``s`` view into decode's poisoned ``d`` view."""
    return _copy(agents, s, d, route, mla, layers, seed, read=False)


def _copy(agents, s, d, route, mla, layers, seed, read):
    """One copy from an ``s`` view into a poisoned ``d`` view, the remote side exported by its owner and
    connected by the agent that copies; every byte compared, and a READ's plan against what it posted."""
    prefill, decode = agents
    src_idx, dst_idx = indices(seed)
    _, src = views(s, 10 + seed, False, mla, PLACE)
    _, dst = views(d, 20 + seed, True, mla, PLACE)
    owner, exported, copier = (prefill, src, decode) if read else (decode, dst, prefill)
    remote = copier.connect(owner.export(exported))
    ends = (remote, dst) if read else (src, remote)
    done = copier.copy(*ends, src_idx, dst_idx, layers, route=route, **LAUNCH).wait(60)
    want = expected(s, 10 + seed, d, 20 + seed, src_idx, dst_idx, layers, mla)
    assert same_bytes(view_bytes(dst), want), f"{s} -> {d} {'READ' if read else 'WRITE'} {done!r}"
    if read:  # what plan_copy says is what was posted
        planned = plan_copy(remote, dst, src_idx, dst_idx, layers, route=route)
        assert (planned.route, planned.descriptors, planned.bytes) == (done.route, done.descriptors, done.bytes), \
            f"{planned!r} vs {done!r}"
    owner.unexport(exported)
    return done


@pytest.mark.parametrize("s,d", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_every_layout_pair_read_and_write(agents, s, d):
    for route in ("auto", "direct"):
        assert _read(agents, s, d, route).route in ("direct", "staged")
        _write(agents, s, d, route)


@pytest.mark.parametrize("s,d", [("PageFirst", "VllmFlashAttn"), ("PageHead", "LayerFirstList"),
                                 ("VllmFlashAttn", "FlashInferHND"), ("HeadMajorPages", "PageFirstDirect"),
                                 ("LayerFirst", "PageHead"), ("PageUnified", "PageHead")])
def test_staged_route_forced(agents, s, d):
    done = _read(agents, s, d, "staged")
    assert done.route == "staged" and "kv.copy" in repr(done)
    done = _write(agents, s, d, "staged")
    assert done.route == "staged" and "kv.copy" in repr(done)


@pytest.mark.parametrize("s", MLA_LAYOUTS)
def test_mla(agents, s):
    for d in ("PageFirst", "LayerFirstList"):
        _read(agents, s, d, "auto", mla=True)
        _write(agents, d, s, "auto", mla=True)


@pytest.mark.parametrize("layers", [1, range(1, 3)])
def test_layer_window(agents, layers):
    for route in ("direct", "staged"):
        _read(agents, "PageFirst", "VllmFlashAttn", route, layers=layers)
        _write(agents, "VllmFlashAttn", "PageFirstDirect", route, layers=layers)


def test_page_first_pool_into_vllm_posts_one_descriptor_per_run(agents):
    """The issue's example: a request's pages from a page-first host pool into vLLM's cache."""
    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    request = np.arange(8, 24)  # 16 consecutive tokens of the pool
    slots = np.concatenate([np.arange(20, 24), np.arange(4, 8), np.arange(12, 20)])  # vLLM blocks 5, 1, 3, 4
    direct = decode.copy(remote, cache, request, slots, route="direct", **LAUNCH).wait(60)
    assert direct.descriptors == 16 * SHAPE["L"] * 2
    staged = decode.copy(remote, cache, request, slots, **LAUNCH).wait(60)
    assert staged.route == "staged" and staged.descriptors == 2  # K's run and V's run of the pool
    assert staged.nixl_descriptors in (None, 2)  # NIXL's own count, where its telemetry is on
    assert "2 descriptors (768 B each) of PageFirst runs -> staging -> kv.copy -> VllmFlashAttn" in repr(staged)
    assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, request, slots))
    prefill.unexport(pool)


def test_repr_and_counts(agents):
    done = _read(agents, "VllmFlashAttn", "VllmFlashAttn", "direct")
    text = repr(done)
    assert text.startswith("RemoteCopy(READ, route=direct: ") and text.endswith(", done)")
    assert done.bytes == 12 * SHAPE["L"] * 2 * 16 and done.descriptors < 12 * SHAPE["L"] * 2


def test_empty_indices(agents):
    prefill, decode = agents
    _, src = views("PageFirst", 1, False, False, PLACE)
    _, dst = views("PageFirst", 2, True, False, PLACE)
    remote = decode.connect(prefill.export(src))
    done = decode.copy(remote, dst, np.array([], np.int64), np.array([], np.int64))
    assert done.done() and done.bytes == 0 and done.descriptors == 0
    assert same_bytes(view_bytes(dst), expected("PageFirst", 1, "PageFirst", 2, I(), I()))


def test_notify(agents):
    prefill, decode = agents
    _, src = views("PageFirst", 1, False, False, PLACE)
    _, dst = views("PageFirst", 2, True, False, PLACE)
    remote = prefill.connect(decode.export(dst))
    prefill.copy(src, remote, np.arange(4), np.arange(4), notify=b"request-7").wait(60)
    got, deadline = {}, time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        for name, messages in decode.notifications().items():
            got.setdefault(name, []).extend(messages)
        time.sleep(0.001)
    assert got == {"prefill": [b"request-7"]}


# --- the promises ------------------------------------------------------------------------------------

@pytest.fixture
def pair(agents):
    """A fresh exported pool on prefill, connected by decode, and decode's poisoned local cache."""
    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    before = view_bytes(cache)
    yield remote, cache, pool
    assert same_bytes(view_bytes(cache), before), "a refused copy wrote to the destination"
    prefill.unexport(pool)


@pytest.mark.parametrize("call,error,match", [
    (lambda d, r, c: d.copy(r, r, I(0), I(0)), TypeError, "exactly one of src and dst .* both are"),
    (lambda d, r, c: d.copy(c, c, I(0), I(0)), TypeError, "exactly one of src and dst .* neither is"),
    (lambda d, r, c: d.copy(r, c, np.array([0, 32]), np.array([0, 1])), kv.IndexOutOfRangeError,
     r"src_indices\[1\] = 32 is out of range for the tokens of src \(PageFirst, 32 tokens\): valid tokens are "
     r"\[0, 32\); nothing was written"),
    (lambda d, r, c: d.copy(r, c, np.array([0, 1]), np.array([0, 99])), kv.IndexOutOfRangeError,
     r"dst_indices\[1\] = 99 is out of range for the tokens of dst \(VllmFlashAttn, 32 tokens\)"),
    (lambda d, r, c: d.copy(r, c, np.array([0, 1]), np.array([0])), ValueError, "same length"),
    (lambda d, r, c: d.copy(r, c, np.array([0.0]), np.array([0])), TypeError, "int64"),
    (lambda d, r, c: d.copy(r, c, I(0), I(0), layers=3), ValueError, "layers=3 is out of range for views of 3 layers"),
    (lambda d, r, c: d.copy(r, c, I(0), I(0), route="fastest"), ValueError, "route must be one of"),
    (lambda d, r, c: d.copy(r, c, I(0), I(0), notify="text"), TypeError, "notify must be bytes"),
    (lambda d, r, c: d.copy(r, c, I(0), I(0), num_warps_per_block=0), ValueError, "num_warps_per_block"),
    (lambda d, r, c: d.copy(r, "cache", I(0), I(0)), TypeError, "dst must be a kvnumba cache view"),
])
def test_bad_calls_are_named_and_write_nothing(agents, pair, call, error, match):
    remote, cache, _ = pair
    with pytest.raises(error, match=match):
        call(agents[1], remote, cache)


def test_views_that_do_not_fit_are_refused(agents, pair):
    remote, _, _ = pair
    _, narrow = views("PageFirst", 3, True, False, PLACE, shape=dict(SHAPE, D=8))
    with pytest.raises(ValueError, match="the views' items differ: src 16 bytes, dst 32 bytes"):
        agents[1].copy(remote, narrow, I(0), I(0))
    _, mla = views("PageFirst", 3, True, True, PLACE)
    with pytest.raises(ValueError, match="src is K and V but dst is MLA"):
        agents[1].copy(remote, mla, I(0), I(0))


def test_a_remote_view_of_another_agent_is_refused(agents, pair):
    remote, cache, _ = pair
    with Agent("third") as third:
        with pytest.raises(ValueError, match="src is a RemoteView connected by another agent"):
            third.copy(remote, cache, I(0), I(0))


@pytest.mark.parametrize("damage,error,match", [
    (lambda b: b[:-3], kv.ExportError, "exported is damaged"),
    (lambda b: b"x" + b[1:], kv.ExportError, "exported is not a kvnumba export"),
    (lambda b: b"", kv.ExportError, "not a kvnumba export"),
    (lambda b: b.decode("latin-1"), TypeError, "exported must be the bytes Agent.export returned, got str"),
])
def test_wrong_exports(agents, damage, error, match):
    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    exported = prefill.export(pool)
    with pytest.raises(error, match=match):
        decode.connect(damage(exported))
    with pytest.raises(kv.ExportError, match="exported comes from agent 'prefill', this agent"):
        prefill.connect(exported)
    prefill.unexport(pool)


def test_unexported_view_is_stale(agents):
    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    decode.copy(remote, cache, I(0), I(0)).wait(60)
    before = view_bytes(cache)
    prefill.unexport(pool)
    with pytest.raises(kv.StaleExportError, match="is stale: its agent no longer exports that view"):
        decode.copy(remote, cache, np.arange(8), np.arange(8))
    assert same_bytes(view_bytes(cache), before)


def test_replaced_agent_makes_its_old_exports_stale(agents):
    _, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    with Agent("shortlived") as first:
        old = decode.connect(first.export(pool))
        decode.copy(old, cache, I(1), I(1)).wait(60)
    with Agent("shortlived") as second:  # same name, new agent
        new = decode.connect(second.export(pool))
        with pytest.raises(kv.StaleExportError, match="agent 'shortlived' was replaced"):
            decode.copy(old, cache, I(2), I(2))
        decode.copy(new, cache, I(3), I(3)).wait(60)
    want = expected("PageFirst", 1, "VllmFlashAttn", 2, I(1, 3), I(1, 3))
    assert same_bytes(view_bytes(cache), want)


def test_closed_agent_exports_fail_and_never_report_success(agents):
    _, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    gone = Agent("gone")
    remote = decode.connect(gone.export(pool))
    gone.close()
    with pytest.raises(kv.StaleExportError, match="is stale"):
        decode.copy(remote, cache, np.arange(4), np.arange(4)).wait(60)
    assert same_bytes(view_bytes(cache), expected("PageFirst", 1, "VllmFlashAttn", 2, I(), I()))


def test_failed_transfer_raises_every_time(agents, monkeypatch):
    """NIXL answering ERR while polling: done() and wait() raise, and go on raising."""
    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    _, cache = views("VllmFlashAttn", 2, True, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    monkeypatch.setattr(type(decode), "_check_fresh", lambda self, view: None)  # its token read would fail too
    monkeypatch.setattr(type(decode._nixl), "transfer", lambda self, handle, notif_msg=b"": "PROC")
    monkeypatch.setattr(type(decode._nixl), "check_xfer_state", lambda self, handle: "ERR")
    copy = decode.copy(remote, cache, np.arange(4), np.arange(4), route="direct")
    for attempt in (copy.done, copy.wait, copy.done):
        with pytest.raises(kv.RemoteError, match="the NIXL READ .* failed: state 'ERR'"):
            attempt()
    assert repr(copy).endswith("failed)")
    monkeypatch.undo()
    prefill.unexport(pool)


def test_close_deregisters_and_context_manager(agents):
    _, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    with Agent("scoped") as scoped:
        scoped.export(pool)
        assert scoped._registered  # the pool, the token slab, the scratch word
    assert scoped.closed and not scoped._registered
    assert "closed" in repr(scoped)
    scoped.close()  # again: nothing
    with pytest.raises(ValueError, match="agent 'scoped' is closed"):
        scoped.export(pool)


def test_local_registrations_follow_the_view(agents):
    import gc

    prefill, decode = agents
    _, pool = views("PageFirst", 1, False, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    gc.collect()  # the views of earlier tests that only the collector frees: their registrations go with them
    count = len(decode._registered)
    cache = views("VllmFlashAttn", 2, True, False, PLACE)[1]
    decode.copy(remote, cache, I(0), I(0), route="direct").wait(60)
    assert len(decode._registered) == count + SHAPE["L"]  # one per vLLM layer cache
    del cache
    gc.collect()
    assert len(decode._registered) == count
    prefill.unexport(pool)


def test_remote_view_describes_the_export(agents):
    prefill, decode = agents
    _, pool = views("PageHead", 1, False, False, PLACE)
    remote = decode.connect(prefill.export(pool))
    assert isinstance(remote, RemoteView) and remote.layout == "PageHead" and remote.agent == "prefill"
    assert remote.geometry == pool.geometry and not remote.mla
    assert repr(remote).startswith("RemoteView(PageHead of agent 'prefill': L=3, T=32, P=4, H=2, item=16 B")
    prefill.unexport(pool)


@pytest.mark.parametrize("route", ["auto", "direct", "staged"])
def test_a_page_unified_pool_of_head_groups(agents, route):
    """A pool of two head groups of two heads (SGLang's ``[T/P, G, L, 2, P, H/G, D]``) exported and read into a
    layer-first view, then written back into a second pool: its groups are runs of their own, its layout found
    again by name on the importing side; every byte as ``kvnumba.reference`` puts it."""
    prefill, decode = agents
    L, T, P, D = SHAPE["L"], SHAPE["T"], SHAPE["P"], SHAPE["D"]
    rng = np.random.default_rng(4)
    put = (lambda a: a) if PLACE is None else PLACE_ARRAY["device"]
    pool_np = kv.PageUnified(rng.integers(0, 2**16, (T // P, 2, L, 2, P, 2, D), dtype=np.uint16))
    lf_np = kv.LayerFirst(np.full((L, T, 4, D), 0xA5A5, np.uint16), np.full((L, T, 4, D), 0xA5A5, np.uint16))
    back_np = kv.PageUnified(np.full((T // P, 2, L, 2, P, 2, D), 0xA5A5, np.uint16))
    pool, lf, back = (kv.PageUnified(put(pool_np.k)), kv.LayerFirst(put(lf_np.k), put(lf_np.v)),
                      kv.PageUnified(put(back_np.k)))
    src_idx, dst_idx = indices(5)
    remote = decode.connect(prefill.export(pool))
    done = decode.copy(remote, lf, src_idx, dst_idx, route=route, **LAUNCH).wait(60)
    assert route == "auto" or done.route == route
    reference.copy(pool_np, lf_np, src_idx, dst_idx)
    assert same_bytes(view_bytes(lf), view_bytes(lf_np))
    target = decode.connect(prefill.export(back))
    decode.copy(lf, target, dst_idx, src_idx, route=route, **LAUNCH).wait(60)
    reference.copy(lf_np, back_np, dst_idx, src_idx)
    assert same_bytes(view_bytes(back), view_bytes(back_np)) and (np.asarray(view_bytes(back_np)[0]) != 0xA5).any()
    prefill.unexport(pool)
    prefill.unexport(back)
