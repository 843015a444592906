"""SGLang's page-unified pool, declared as one view class (``kv.PageUnified``): its byte order, its names, and
that the declaration alone gives it the kernels, the copy engines, bounds and the reference.

(Every pair of layouts with it is copied and checked byte for byte by ``tests/views/test_copy.py``, its
copy-engine runs by ``tests/views/test_routes.py`` and its remote transfers by ``tests/remote``: it is in
``tests/helpers/view_cases.LAYOUTS``.)"""
import ast
from pathlib import Path

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.api import views
from tests.helpers.placement import host, synchronize

pytestmark = pytest.mark.needs_target

L, PAGES, P, H, D = 3, 4, 4, 2, 8


def _pool(mla=False, fill=None):
    """A pool in pinned host memory (a GPU's kernels reach it; on the simulator, NumPy's)."""
    shape = (PAGES, 1 if mla else 2, L, P, H, D)
    return host(np.zeros(shape, np.uint16) if fill is None else fill(shape))


def test_it_is_a_built_in_layout_by_its_names():
    assert kv.PageUnified in views.BUILT_IN
    assert views.view_class("page_unified") is kv.PageUnified and views.view_class("pu") is kv.PageUnified
    assert views.view_name(kv.PageUnified) == "page_unified"
    parts = kv.PageUnified.parts
    assert parts.name == "pu" and not kv.PageUnified.user_layout and not parts.table


def test_its_geometry_is_read_from_the_pool():
    view = kv.PageUnified(_pool(), page_size=P)
    g = view.geometry
    assert (g.layers, g.tokens, g.page_size, g.heads, g.item_bytes) == (L, PAGES * P, P, H, H * D * 2)
    assert g.layout_dim == 2 * L * P * H * D * 2  # a page: K and V of every layer
    assert view.v is view.k and view.kind_offset("v") == L * P * H * D * 2
    mla = kv.PageUnified(_pool(mla=True))
    assert mla.mla and mla.geometry.layers == L
    with pytest.raises(ValueError, match=r"PageUnified: the buffer is \[T/P, 2, L, P, \*item\]"):
        kv.PageUnified(np.zeros((PAGES, 3, L, P, H, D), np.uint16))
    with pytest.raises(ValueError, match="page_size=8, but the buffers' pages hold 4 tokens"):
        kv.PageUnified(_pool(), page_size=8)


@pytest.mark.parametrize("route", ["kernel", "copy_engine"])
def test_a_page_holds_k_then_v_of_every_layer(route):
    """Token t of layer l lands at pool[t // P, 0 (K) or 1 (V), l, t % P]: SGLang's page-unified order."""
    rng = np.random.default_rng(0)
    k = host(rng.integers(0, 2**16, (L, PAGES * P, H, D), dtype=np.uint16))
    v = host(rng.integers(0, 2**16, (L, PAGES * P, H, D), dtype=np.uint16))
    pool = host(np.full((PAGES, 2, L, P, H, D), 0xA5A5, np.uint16))
    tokens = np.arange(P, 3 * P, dtype=np.int64)  # pages 1 and 2, whole: runs for the copy engines
    slots = tokens[::-1].copy()
    kv.copy(kv.LayerFirst(k, v), kv.PageUnified(pool), tokens, slots, route=route)
    synchronize()
    assert kv.last_route() == route
    for src, dst in zip(tokens, slots):
        page, slot = divmod(int(dst), P)
        assert (pool[page, 0, :, slot] == k[:, src]).all() and (pool[page, 1, :, slot] == v[:, src]).all()
    untouched = np.ones(PAGES, bool)
    untouched[1:3] = False
    assert (pool[untouched] == 0xA5A5).all()


def test_the_reference_and_the_kernel_agree_both_ways():
    rng = np.random.default_rng(1)
    pool = _pool(fill=lambda shape: rng.integers(0, 2**16, shape, dtype=np.uint16))
    src_idx = rng.permutation(PAGES * P)[:7].astype(np.int64)
    dst_idx = rng.permutation(PAGES * P)[:7].astype(np.int64)
    for make_dst in (lambda: kv.PageHead(host(np.zeros((PAGES, H, P, L, D), np.uint16)),
                                         host(np.zeros((PAGES, H, P, L, D), np.uint16))),
                     lambda: kv.PageUnified(_pool())):
        got, want = make_dst(), make_dst()
        kv.copy(kv.PageUnified(pool), got, src_idx, dst_idx)
        synchronize()
        reference.copy(kv.PageUnified(pool), want, src_idx, dst_idx)
        assert all((np.asarray(a) == np.asarray(b)).all() for a, b in ((got.k, want.k), (got.v, want.v)))


def test_tokens_past_the_pool_are_refused():
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[0\] = 16 is out of range"):
        kv.copy(kv.PageFirst(host(np.zeros((PAGES * P, L, H, D), np.uint16)), host(np.zeros((PAGES * P, L, H, D),
                                                                                          np.uint16))),
                kv.PageUnified(_pool()), np.array([0], np.int64), np.array([PAGES * P], np.int64))


def test_the_layout_is_declared_in_one_module():
    """A built-in layout is one declaration: its class in ``kvnumba/api/views.py`` (and its name exported by
    ``kvnumba/__init__.py``); no other module of the package names it."""
    package = Path(kv.__file__).parent
    naming = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                    if any(word in path.read_text() for word in ("PageUnified", "page_unified")))
    assert naming == ["__init__.py", "api/views.py"]
    tree = ast.parse((package / "api" / "views.py").read_text())
    declared = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "PageUnified"]
    methods = {f.name for f in declared[0].body if isinstance(f, ast.FunctionDef)}
    assert {"layer_base", "token_offset", "shape"} <= methods
