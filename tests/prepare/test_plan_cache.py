"""The plan cache's one lookup, ``PlanCache.find`` (every plain call's, ``kvnumba.plan.build.caller``), answers
what ``get`` stored; calls with checks on do not take it."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.plan import build
from kvnumba.plan.cache import PlanCache
from kvnumba.plan.spec import SPECS
from tests.helpers.placement import host

pytestmark = pytest.mark.needs_target


class _Plan:
    """A cached plan whose fast call says which plan answered, and with which ``check``."""

    tables = ()

    def __init__(self, name):
        self.name = name

    def fast(self, *args, check=False, **kwargs):
        return self.name, check


def _both(cache, objects, scalars, built):
    """What ``find`` answers before ``get`` and what ``get`` answers: a plan's name, or "miss"."""
    found = cache.find(objects, scalars)
    got = cache.get(objects, scalars, lambda: built)
    return "miss" if found is None else found.name, "miss" if got is built else got.name


def test_find_answers_what_get_stored():
    cache = PlanCache()
    a, b = host(np.zeros(8, np.uint8)), host(np.zeros(16, np.uint8))  # pinned: on a GPU a pageable one never hits
    assert _both(cache, (a,), (4,), _Plan("A")) == ("miss", "miss")  # get built and stored A
    assert _both(cache, (a,), (4,), _Plan("other")) == ("A", "A")  # both hit
    assert _both(cache, (b,), (4,), _Plan("B")) == ("miss", "miss")  # another buffer: another key
    assert _both(cache, (a,), (5,), _Plan("C")) == ("miss", "miss")  # another size
    assert _both(cache, (a,), (True,), _Plan("D")) == ("miss", "miss")  # True is not 1
    assert _both(cache, (a,), ([4],), _Plan("E")) == ("miss", "miss")  # unhashable: never stored
    assert _both(cache, (a,), ([4],), _Plan("E")) == ("miss", "miss")
    view = a[:4]  # another value of the same memory: another key for both
    assert _both(cache, (view,), (4,), _Plan("F")) == ("miss", "miss")
    a.flags.writeable = False  # a flag in the key: both miss
    assert _both(cache, (a,), (4,), _Plan("G")) == ("miss", "miss")
    assert cache.misses == 8


def test_the_plain_caller_runs_the_cached_plan_and_passes_check_on(monkeypatch):
    spec = SPECS["transfer_kv_per_layer"]
    cache = build.plan_cache(spec)
    buffers = tuple(host(np.zeros(8, np.uint8)) for _ in spec.buffers)
    cache.get(buffers, (4,), lambda: _Plan("A"))
    call = build.caller(spec, cache)
    assert call(buffers, (4,), None, None, None, 2, 32, None, False) == ("A", False)
    assert call(buffers, (4,), None, None, None, 2, 32, None, True) == ("A", True)  # no tables: the same plan
    monkeypatch.setattr(_Plan, "tables", ("a table",))  # with checks on, a plan with layer tables is built again
    monkeypatch.setattr(build, "build", lambda spec, geometry, strict, stream: _Plan(f"strict={strict}"))
    assert call(buffers, (4,), None, None, None, 2, 32, None, True) == ("strict=True", True)
    assert call(buffers, (4,), None, None, None, 2, 32, None, False) == ("A", False)


def test_clear_plan_caches_empties_every_plan_cache():
    cache = PlanCache()
    a = host(np.zeros(8, np.uint8))
    cache.get((a,), (4,), lambda: _Plan("A"))
    kv.clear_plan_caches()
    assert cache.find((a,), (4,)) is None and not cache.entries


def test_a_reshaped_or_retyped_layer_in_a_list_is_another_key():
    """The copy-engine entry points' plans read rows and pages from their buffers' shapes (and check dtypes):
    a list holding the same memory reshaped, or viewed as another dtype of the same size, misses."""
    cache = PlanCache()
    a = host(np.zeros((4, 8), np.uint8))
    assert _both(cache, ([a],), (4,), _Plan("A")) == ("miss", "miss")
    assert _both(cache, ([a],), (4,), _Plan("other")) == ("A", "A")
    assert _both(cache, ([a.reshape(8, 4)],), (4,), _Plan("B")) == ("miss", "miss")
    assert _both(cache, ([a.view(np.int8)],), (4,), _Plan("C")) == ("miss", "miss")
    assert _both(cache, ([a, a],), (4,), _Plan("D")) == ("miss", "miss")  # another length: another key


def test_transfer_kv_direct_of_reshaped_layers_copies_their_rows():
    """The same memory as rows of 16 bytes, then of 8: each call copies its own rows (not the earlier plan's)."""
    src = host(np.arange(64, dtype=np.uint8)).reshape(4, 16)
    dst = host(np.zeros(64, np.uint8)).reshape(4, 16)
    idx, to = np.array([0, 1], np.int64), np.array([2, 3], np.int64)
    kv.transfer_kv_direct([src], [dst], idx, to, 1)
    assert (dst[2:] == src[:2]).all() and not dst[:2].any()
    dst[:] = 0
    kv.transfer_kv_direct([src.reshape(8, 8)], [dst.reshape(8, 8)], idx, to, 1)
    assert (dst.reshape(8, 8)[2:4] == src.reshape(8, 8)[:2]).all()
    assert np.count_nonzero(dst.reshape(8, 8)[[0, 1, 4, 5, 6, 7]]) == 0


def test_the_direct_caller_runs_the_cached_plan():
    spec = SPECS["transfer_kv_per_layer_direct_pf_lf"]
    cache = build.plan_cache(spec)
    lists = ([host(np.zeros(8, np.uint8))], [host(np.zeros(8, np.uint8))])
    ran = []

    class Plan:
        def run(self, *args):
            ran.append(args)

    cache.get(lists, (0, 4), Plan)
    build.direct_caller(spec, cache)(lists, (0, 4), "s", "d", None, True)
    assert ran == [("s", "d", None, True)] and cache.misses == 1
