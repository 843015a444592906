"""SGLang's page-unified pool (``kv.PageUnified``) in SGLang's byte order: MHA ``[T/P, G, L, 2, P, H/G, D]``
(head groups outermost, K then V inside each layer), MLA ``[T/P, L, P, D]``. Its shapes and names, the bytes
the kernel and the copy engines write (against an index-by-index definition and against
``kvnumba.reference``), with one and with several head groups, what it refuses, and that a one-group pool's
per-layer loads are runs the copy engine takes under ``route="auto"``.

(Every pair of layouts with a one-group pool is also copied byte for byte by ``tests/views/test_copy.py``,
its copy-engine runs by ``tests/views/test_routes.py`` and its remote transfers by ``tests/remote``: it is in
``tests/helpers/view_cases.LAYOUTS``.)"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba import layouts
from kvnumba.plan.copy_plan import copy_sides
from kvnumba.plan import routes
from kvnumba.remote.sides import find_parts
from tests.helpers.placement import device, host, on_gpu, synchronize, to_numpy

pytestmark = pytest.mark.needs_target

L, PAGES, P, H, D = 3, 4, 4, 4, 4  # items of 4 heads x 4 uint16 = 32 bytes; 8 bytes a head
POISON = 0xA5A5
LAUNCH = {"block_quota": 1, "num_warps_per_block": 1}  # the simulator runs a Python thread per CUDA thread
EXPECTED = r"PageUnified: the buffer is \[T/P, G, L, 2, P, H/G, D\] .* or \[T/P, L, P, D\] for MLA"


def _pool(groups=1, mla=False, rng=None):
    """A pool in pinned host memory (a GPU's kernels reach it; on the simulator, NumPy's): random, or poisoned."""
    shape = (PAGES, L, P, D) if mla else (PAGES, groups, L, 2, P, H // groups, D)
    return host(np.full(shape, POISON, np.uint16) if rng is None else rng.integers(0, 2**16, shape, dtype=np.uint16))


def _where(pool, kind, layer, token, head, mla=False):
    """SGLang's definition, element by element: where head ``head`` of token ``token``'s K (0) or V (1) of
    ``layer`` is in a pool."""
    page, slot = divmod(int(token), P)
    if mla:
        return pool[page, layer, slot]
    per_group = pool.shape[5]
    return pool[page, head // per_group, layer, kind, slot, head % per_group]


def _layer_first(rng=None, mla=False):
    shape = (L, PAGES * P, 1 if mla else H, D)
    make = (lambda: host(np.full(shape, POISON, np.uint16))) if rng is None else (
        lambda: host(rng.integers(0, 2**16, shape, dtype=np.uint16)))
    return kv.LayerFirst(make()) if mla else kv.LayerFirst(make(), make())


def test_it_is_a_built_in_layout_by_its_names():
    assert kv.PageUnified in layouts.BUILT_IN
    assert layouts.view_class("page_unified") is kv.PageUnified and layouts.view_class("pu") is kv.PageUnified
    assert layouts.view_name(kv.PageUnified) == "page_unified"
    assert kv.PageUnified.parts.name == "pu" and not kv.PageUnified.user_layout and not kv.PageUnified.parts.table
    names = {kv.PageUnified(_pool(g)).parts.name for g in (1, 2, 4)} | {kv.PageUnified(_pool(mla=True)).parts.name}
    assert names == {"pu", "pu_g2", "pu_g4", "pu_mla"}
    for name in names:  # an export names its layout; the importer finds the same arithmetic again
        assert find_parts(name).name == name


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_its_geometry_is_read_from_sglangs_shape(groups):
    view = kv.PageUnified(_pool(groups), page_size=P)
    g = view.geometry
    assert (g.layers, g.tokens, g.page_size, g.heads, g.item_bytes) == (L, PAGES * P, P, H, H * D * 2)
    assert g.layout_dim == 2 * L * P * H * D * 2  # a page: every group's K and V of every layer
    assert view.v is view.k and view.head_groups == groups and view.head_split == (groups > 1)
    assert view.kind_offset("v") == P * (H // groups) * D * 2  # V follows K inside one (group, layer)
    assert view.head_runs == groups
    mla = kv.PageUnified(_pool(mla=True))
    assert mla.mla and (mla.geometry.layers, mla.geometry.heads, mla.geometry.item_bytes) == (L, 1, D * 2)


@pytest.mark.parametrize("shape", [
    (PAGES, 2, L, P, H, D),  # kvnumba's former order [T/P, 2, L, P, *item]
    (PAGES, 1, L, P, D),  # its former MLA order
    (PAGES, 1, L, 3, P, H, D),  # not K and V
    (PAGES, 2, 1, L, P, H, D),  # K/V outside the layers
    (PAGES, L, P),
])
def test_a_buffer_of_any_other_order_is_refused(shape):
    with pytest.raises(ValueError, match=EXPECTED):
        kv.PageUnified(np.zeros(shape, np.uint16))


def test_a_wrong_page_size_is_refused():
    with pytest.raises(ValueError, match="page_size=8, but the buffers' pages hold 4 tokens"):
        kv.PageUnified(_pool(), page_size=8)


@pytest.mark.parametrize("route", ["kernel", "copy_engine"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_each_head_lands_where_sglang_puts_it(groups, route):
    """Token t's head h of layer l lands at pool[t // P, h // (H/G), l, K or V, t % P, h % (H/G)]; nothing else
    of the pool is written."""
    rng = np.random.default_rng(groups)
    src = _layer_first(rng)
    pool = _pool(groups)
    tokens = np.arange(P, 3 * P, dtype=np.int64)  # pages 1 and 2, whole: runs for the copy engines
    slots = tokens[::-1].copy()
    kv.copy(src, kv.PageUnified(pool), tokens, slots, route=route, **LAUNCH)
    synchronize()
    assert kv.last_route() == route
    for s, d in zip(tokens, slots):
        for layer in range(L):
            for head in range(H):
                assert (_where(pool, 0, layer, d, head) == src.k[layer, s, head]).all()
                assert (_where(pool, 1, layer, d, head) == src.v[layer, s, head]).all()
    untouched = np.ones(PAGES, bool)
    untouched[1:3] = False
    assert (pool[untouched] == POISON).all()


def test_mla_latents_land_where_sglang_puts_them():
    rng = np.random.default_rng(5)
    src = _layer_first(rng, mla=True)
    pool = _pool(mla=True)
    tokens = np.array([0, 5, PAGES * P - 1], np.int64)  # the first, a middle and the last page's last slot
    slots = np.array([PAGES * P - 1, 2, 9], np.int64)
    kv.copy(src, kv.PageUnified(pool), tokens, slots, **LAUNCH)
    synchronize()
    for s, d in zip(tokens, slots):
        for layer in range(L):
            assert (_where(pool, 0, layer, d, 0, mla=True) == src.k[layer, s, 0]).all()
    written = np.zeros(pool.shape, bool)
    for d in slots:
        written[d // P, :, d % P] = True
    assert (pool[~written] == POISON).all()


def _partners(groups):
    """Views a pool of ``groups`` head groups copies to and from: ``(name, make(rng or None))``."""
    def two(shape, make):
        def build(rng):
            def array():
                return host(np.full(shape, POISON, np.uint16) if rng is None
                            else rng.integers(0, 2**16, shape, dtype=np.uint16))
            return make(array(), array())
        return build

    partners = [
        ("LayerFirst", lambda rng: _layer_first(rng)),
        ("PageFirst", two((PAGES * P, L, H, D), kv.PageFirst)),
        ("PageFirstDirect", two((PAGES, L, P, H, D), kv.PageFirstDirect)),
        ("VllmFlashAttn", lambda rng: kv.VllmFlashAttn([host(np.full((2, PAGES, P, H, D), POISON, np.uint16)) if rng is None
                                                        else host(rng.integers(0, 2**16, (2, PAGES, P, H, D),
                                                                               dtype=np.uint16)) for _ in range(L)])),
        ("PageUnified-1", lambda rng: kv.PageUnified(_pool(1, rng=rng))),
        ("PageUnified-2", lambda rng: kv.PageUnified(_pool(2, rng=rng))),
    ]
    if groups in (1, H):  # every head apart: only with one group, or one head a group
        partners.append(("PageHead", two((PAGES, H, P, L, D), kv.PageHead)))
    return [p for p in partners if not (groups == 4 and p[0] == "PageUnified-2")]  # 4 runs and 2 do not meet


INDICES = {
    "scattered": (np.array([3, 14, 7, 0, 9], np.int64), np.array([12, 1, 15, 6, 8], np.int64)),
    "one token": (np.array([5], np.int64), np.array([PAGES * P - 1], np.int64)),
    "last page": (np.arange((PAGES - 1) * P, PAGES * P, dtype=np.int64), np.arange(P, dtype=np.int64)),
}


def _copy_and_compare(src_np, src, dst_np, dst, si, di, layers=None, route="auto"):
    kv.copy(src, dst, si, di, layers, route=route, **LAUNCH)
    synchronize()
    reference.copy(src_np, dst_np, si, di, layers)
    got = [np.asarray(b).view(np.uint8) for b in dst.buffers("k") + ([] if dst.mla or dst.v is dst.k else dst.buffers("v"))]
    want = [np.asarray(b).view(np.uint8) for b in dst_np.buffers("k") + ([] if dst_np.mla or dst_np.v is dst_np.k
                                                                          else dst_np.buffers("v"))]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return sum(int((w != 0xA5).sum()) for w in want)


def _numpy_twin(view):
    """The same view over NumPy copies of its buffers (for the reference)."""
    if isinstance(view, kv.VllmFlashAttn):
        return view.like([np.array(c, copy=True) for c in view.caches])
    if isinstance(view, kv.PageUnified):
        return view.like(np.array(view.k, copy=True))
    return view.like(np.array(view.k, copy=True), None if view.v is None else np.array(view.v, copy=True))


@pytest.mark.parametrize("indices", list(INDICES))
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_the_kernel_agrees_with_the_reference_both_ways(groups, indices):
    """Into and out of a pool of 1, 2 and 4 head groups, with poisoned destinations: every byte as the reference
    writes it, and the reference moves something."""
    si, di = INDICES[indices]
    for name, make in _partners(groups):
        rng = np.random.default_rng(len(name) + groups)
        pool = kv.PageUnified(_pool(groups, rng=rng))
        other = make(None)
        assert _copy_and_compare(_numpy_twin(pool), pool, _numpy_twin(other), other, si, di, route="kernel") > 0, name
        pool = kv.PageUnified(_pool(groups))
        source = make(rng)
        assert _copy_and_compare(_numpy_twin(source), source, _numpy_twin(pool), pool, si, di, route="kernel") > 0, name


@pytest.mark.parametrize("indices", list(INDICES))
def test_mla_both_ways(indices):
    si, di = INDICES[indices]
    rng = np.random.default_rng(9)
    for make_other in (lambda r: _layer_first(r, mla=True),
                       lambda r: kv.PageFirstDirect(host(np.full((PAGES, L, P, D), POISON, np.uint16)) if r is None
                                                    else host(r.integers(0, 2**16, (PAGES, L, P, D), dtype=np.uint16)))):
        pool, other = kv.PageUnified(_pool(mla=True, rng=rng)), make_other(None)
        assert _copy_and_compare(_numpy_twin(pool), pool, _numpy_twin(other), other, si, di) > 0
        pool, other = kv.PageUnified(_pool(mla=True)), make_other(rng)
        assert _copy_and_compare(_numpy_twin(other), other, _numpy_twin(pool), pool, si, di) > 0


@pytest.mark.parametrize("per_layer", [False, True], ids=["one array", "per-layer arrays"])
def test_a_per_layer_load_of_one_group_is_one_run_a_page_and_takes_the_copy_engine(per_layer):
    """One head group: a page's K (or V) of one layer is one run of P items in the pool, and lands as one run in
    a layer-first pool whose page slots are contiguous (one array, or SGLang's per-layer arrays): a per-layer
    load of 64-token pages of 1 KiB items makes 64 KiB copies, which ``auto`` gives the copy engine."""
    pages, page, heads, dim = 3, 64, 4, 128  # items of 1 KiB
    rng = np.random.default_rng(11)
    pool = kv.PageUnified(host(rng.integers(0, 2**16, (pages, 1, 2, 2, page, heads, dim), dtype=np.uint16)))
    shape = (2, pages * page, heads, dim)
    k, v = np.full(shape, POISON, np.uint16), np.full(shape, POISON, np.uint16)
    if per_layer:
        dst = kv.LayerFirst([device(k[0]), device(k[1])], [device(v[0]), device(v[1])])
    else:
        dst = kv.LayerFirst(device(k), device(v))
    si = np.arange(page, 3 * page, dtype=np.int64)  # pages 1 and 2
    di = np.concatenate([np.arange(2 * page, 3 * page), np.arange(page)]).astype(np.int64)  # to slots 2 and 0
    engine = copy_sides({"src_view": pool, "dst_view": dst, "layers": 1}, False).engine
    filled = engine.fill(*engine.offsets(si, di), 1, 1)
    assert (filled.runs, filled.copies) == (2, 4)  # one run a page, in K and in V
    assert set(engine.batch.out[2, :filled.copies].tolist()) == {page * heads * dim * 2}  # each a page of items
    stream = None
    if on_gpu():  # the batch call needs a stream other than the legacy default stream
        from numba import cuda

        stream = cuda.stream()
    kv.copy(pool, dst, si, di, 1, stream=stream)
    synchronize()
    assert kv.last_route() == "copy_engine"
    want_k = np.full(shape, POISON, np.uint16)
    want_v = want_k.copy()
    for s, d in zip(si, di):
        want_k[1, d] = pool.k[s // page, 0, 1, 0, s % page]
        want_v[1, d] = pool.k[s // page, 0, 1, 1, s % page]
    for got, want in ((dst.k, want_k), (dst.v, want_v)):
        np.testing.assert_array_equal(np.stack([to_numpy(a) for a in got]) if per_layer else to_numpy(got), want)


def test_with_more_groups_the_runs_shorten_and_auto_takes_the_kernel(monkeypatch):
    """Two head groups: a token's heads are two runs of half an item, and the layer-first side keeps each apart
    from the next token's, so no copy could be longer: ``auto`` takes the kernel without scanning the indices
    (``EnginePlan.may_pay``), and the bytes are still the reference's."""
    rng = np.random.default_rng(12)
    pool = kv.PageUnified(_pool(2, rng=rng))
    dst = _layer_first()
    assert not kv.prepare(kv.copy, src_view=pool, dst_view=dst, layers=1)._plan.engine.may_pay
    monkeypatch.setattr(routes.EnginePlan, "scan", lambda *args: pytest.fail("auto scanned indices that cannot pay"))
    si = np.arange(P, 3 * P, dtype=np.int64)
    assert _copy_and_compare(_numpy_twin(pool), pool, _numpy_twin(dst), dst, si, si.copy(), layers=1) > 0
    assert kv.last_route() == "kernel"


def test_groups_and_a_layout_that_splits_every_head_do_not_meet():
    pool = kv.PageUnified(_pool(2))
    page_head = kv.PageHead(host(np.zeros((PAGES, H, P, L, D), np.uint16)), host(np.zeros((PAGES, H, P, L, D),
                                                                                          np.uint16)))
    with pytest.raises(ValueError, match=r"src_view cuts a token's 4 heads into 2 runs, dst_view into 4"):
        kv.copy(pool, page_head, np.array([0], np.int64), np.array([0], np.int64), **LAUNCH)
    assert (np.asarray(page_head.k) == 0).all()


def test_tokens_past_the_pool_are_refused():
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[0\] = 16 is out of range"):
        kv.copy(kv.PageFirst(host(np.zeros((PAGES * P, L, H, D), np.uint16)), host(np.zeros((PAGES * P, L, H, D),
                                                                                          np.uint16))),
                kv.PageUnified(_pool(2)), np.array([0], np.int64), np.array([PAGES * P], np.int64), **LAUNCH)


def _bf16(rng, shape):
    """bf16 bit patterns of normal values (uint16)."""
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("groups", [1, H])
def test_fp8_codes_and_scales_follow_the_pools_order(groups):
    """An FP8 pool (``kv.fp8_like``: codes in the pool's order, one scale a head beside them) filled from bf16
    and read back, byte for byte as ``kvnumba.quant_reference``; with one group, or one head a group."""
    from kvnumba import quant_reference

    rng = np.random.default_rng(13)
    shape = (L, PAGES * P, H, 8)
    src = kv.LayerFirst(host(_bf16(rng, shape)), host(_bf16(rng, shape)))
    pool_shape = (PAGES, groups, L, 2, P, H // groups, 8)
    got, want = (kv.fp8_like(kv.PageUnified(host(np.zeros(pool_shape, np.uint16))), dtype="bfloat16")
                 for _ in range(2))
    si, di = INDICES["scattered"]
    kv.copy(src, got, si, di, **LAUNCH)
    synchronize()
    quant_reference.copy(src, want, si, di)
    for part in ("codes", "scales"):
        np.testing.assert_array_equal(np.asarray(getattr(got, part).k), np.asarray(getattr(want, part).k))
    assert (np.asarray(want.codes.k) != 0).any()
    back, back_want = (kv.LayerFirst(host(np.zeros(shape, np.uint16)), host(np.zeros(shape, np.uint16)))
                       for _ in range(2))
    kv.copy(got, back, di, si, **LAUNCH)
    synchronize()
    quant_reference.copy(want, back_want, di, si)
    for a, b in ((back.k, back_want.k), (back.v, back_want.v)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fp8_refuses_groups_of_several_heads():
    """FP8 goes head by head (a scale a head): a pool of two groups of two heads is refused, nothing written."""
    src = kv.LayerFirst(host(np.zeros((L, PAGES * P, H, 8), np.uint16)), host(np.zeros((L, PAGES * P, H, 8), np.uint16)))
    dst = kv.fp8_like(kv.PageUnified(host(np.zeros((PAGES, 2, L, 2, P, 2, 8), np.uint16))), dtype="bfloat16")
    with pytest.raises(ValueError, match=r"dst_view \(PageUnified\(.*\)\) keeps its 4 heads in 2 groups"):
        kv.copy(src, dst, np.array([0], np.int64), np.array([0], np.int64), **LAUNCH)
    assert not np.asarray(dst.codes.k).any()


def test_an_mla_pool_has_page_first_directs_bytes():
    """SGLang's MLA order ``[T/P, L, P, D]`` is page-first-direct's with flat items (the docs send MLA pools through
    ``kvnumba convert`` under that name): the same token lands on the same bytes."""
    rng = np.random.default_rng(14)
    src = _layer_first(rng, mla=True)
    pool, pfd = _pool(mla=True), host(np.full((PAGES, L, P, D), POISON, np.uint16))
    si, di = INDICES["scattered"]
    kv.copy(src, kv.PageUnified(pool), si, di, **LAUNCH)
    kv.copy(src, kv.PageFirstDirect(pfd), si, di, **LAUNCH)
    synchronize()
    np.testing.assert_array_equal(np.asarray(pool), np.asarray(pfd))
    assert (np.asarray(pool) != POISON).any()
