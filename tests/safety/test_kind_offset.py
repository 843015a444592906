"""Nothing a view class says moves a pointer out of its buffer: ``kind_offset`` (where V starts in an array K
and V share) is checked against the buffer's extent once per plan, for kvnumba's classes and subclasses alike
(``kvnumba.checks.user_layouts``).

- A subclass whose ``kind_offset`` lies (past the end, far past, negative, not a multiple of 8, a float) is
  refused when it is built, naming ``kind_offset``.
- A class that starts lying after it was built (the check at construction passed) is refused by the plan, on
  every route and on either side of the copy, before anything is written: guards and poisoned bytes intact.
- The copy engine's runs come from the same checked arithmetic: an honest subclass copies the same bytes by
  kernel and by copy engine.
- The hull the plan checks kvnumba's own classes by (their first and last byte) is the exact one, evaluated
  at every layer, token and head.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.checks import user_layouts as extents
from tests.helpers.guarded import all_intact, guarded_view
from tests.helpers.placement import synchronize
from tests.helpers.view_cases import LAYOUTS

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 8  # int16: items of 32 bytes
SRC = np.array([0, 3, 5, 6], np.int64)
DST = np.array([1, 2, 4, 7], np.int64)
SHARED = ["PageUnified", "VllmFlashAttn"]  # K and V share arrays: V's offset is not 0
LAYOUT_NAMES = ["PageFirst", *SHARED]


def _rebuild(cls, view):
    """A view of class ``cls`` (a subclass of ``view``'s) over ``view``'s buffers."""
    if hasattr(view, "caches"):
        return cls(view.caches)
    if view.v is view.k or view.v is None:
        return cls(view.k)
    return cls(view.k, view.v)


def _subclass(base):
    class Lying(base):
        lie = None  # None: the truth; else a function (view, which) -> what kind_offset says

        def kind_offset(self, which):
            told = type(self).lie
            return super().kind_offset(which) if told is None else told(self, which)

    return Lying


def _nbytes(view, which):
    return min(int(np.asarray(b).nbytes) for b in view.buffers(which))


LIES = {
    "past the end": lambda view, which: _nbytes(view, which),
    "one word past": lambda view, which: view.__class__.__mro__[1].kind_offset(view, which) + 8,
    "far past": lambda view, which: 1 << 40,
    "negative": lambda view, which: -64,
    "not a word": lambda view, which: 4,
    "a float": lambda view, which: 0.0,
    "a bool": lambda view, which: False,
}


def _built(name, place="device", poison=True, seed=0):
    view, twin, guards = guarded_view(name, L, T, P, H, D, place, poison, seed)
    return _subclass(type(view)), view, twin, guards


@pytest.mark.parametrize("lie", list(LIES))
@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_a_lying_class_is_refused_when_built(name, lie):
    cls, view, _, guards = _built(name)
    cls.lie = staticmethod(LIES[lie])
    if lie == "one word past" and name not in SHARED:
        cls.lie = staticmethod(lambda v, which: 8 if which == "v" else 0)
    with pytest.raises((ValueError, TypeError), match="kind_offset"):
        _rebuild(cls, view)
    assert all_intact(guards)


@pytest.mark.parametrize("route", ["kernel", "copy_engine", "auto"])
@pytest.mark.parametrize("side", ["dst", "src"])
@pytest.mark.parametrize("lie", ["past the end", "far past", "negative", "a float"])
@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_a_lie_told_after_it_was_built_is_refused_by_the_plan(name, lie, side, route):
    cls, view, _, guards = _built(name, poison=side == "dst", seed=3)
    liar = _rebuild(cls, view)  # honest while it is checked
    other, _, other_guards = guarded_view("LayerFirst", L, T, P, H, D, "host", side == "src", seed=4)
    cls.lie = staticmethod(LIES[lie])
    src, dst = (other, liar) if side == "dst" else (liar, other)
    with pytest.raises((ValueError, TypeError), match="kind_offset"):
        kv.copy(src, dst, SRC, DST, route=route, block_quota=1, num_warps_per_block=1)
    assert all_intact(guards + other_guards)
    poisoned = guards if side == "dst" else other_guards
    assert all(g.untouched() for g in poisoned), "a refused copy wrote bytes"


@pytest.mark.parametrize("name", SHARED)
def test_an_honest_subclass_copies_the_same_bytes_on_both_routes(name):
    results = []
    for route in ("kernel", "copy_engine"):
        cls, view, twin, guards = _built(name)
        src, src_np, src_guards = guarded_view("LayerFirst", L, T, P, H, D, "host", False, seed=5)
        honest = _rebuild(cls, view)
        kv.copy(src, honest, SRC, DST, route=route, block_quota=1, num_warps_per_block=1)
        synchronize()
        assert kv.last_route() == route
        reference.copy(src_np, twin, SRC, DST)
        got = [g.middle().copy() for g in guards]
        want = [np.asarray(b).view(np.uint8).reshape(-1) for b in _twin_arrays(twin)]
        assert all((a == b).all() for a, b in zip(got, want))
        assert all_intact(guards + src_guards)
        results.append(got)
    assert all((a == b).all() for a, b in zip(*results))


def _twin_arrays(twin):
    if hasattr(twin, "caches"):
        return list(twin.caches)
    if twin.v is twin.k or twin.v is None:
        return [twin.k]
    return [twin.k, twin.v]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_corners_of_each_built_in_layout_are_its_exact_hull(name):
    view, _, _ = guarded_view(name, L, T, P, H, D, "host")
    heads = extents.copy_heads_of(view)
    lo, hi = extents.hull(view)
    assert (lo, hi) == extents._everywhere(view, heads)  # a class of the user's is evaluated everywhere
    if type(view).built_in:
        assert extents._corners(view, heads) == (lo, hi)
    assert lo >= 0 and hi <= min(int(np.asarray(b).nbytes) for b in view.buffers("k"))


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_the_corners_of_a_page_unified_pool_of_head_groups_are_its_exact_hull(groups):
    pool = np.zeros((T // P, groups, L, 2, P, 4 // groups, D), np.int16)
    view = kv.PageUnified(pool)
    runs = extents.copy_heads_of(view)
    assert runs == (groups if groups > 1 else 1)
    assert extents._corners(view, runs) == extents._everywhere(view, runs)
    lo, hi = extents.hull(view)
    offset = view.kind_offset("v")
    assert lo >= 0 and offset + hi <= pool.nbytes
