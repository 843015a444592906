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
