"""kv.copy's routes (kvnumba.plan.routes): the copy engine moves exactly the kernel's bytes for every built-in
view pair, K/V and MLA, host and device indices, runs and scattered tokens, against kvnumba.reference.copy
with poisoned destinations; ``auto`` chooses by where the indices are and how long their runs are; what
the copy-engine route refuses. The same tests run on the simulator (whose copies stand in for the engines)
and on a GPU (one cudaMemcpyBatchAsync)."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.plan import routes
from tests.helpers.placement import PLACE, on_gpu, synchronize, to_numpy
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, POISON, make_view, view_bytes

pytestmark = pytest.mark.needs_target

BUILT_IN = [name for name in LAYOUTS if name != "HeadMajorPages"]
L, T, P, H, D = 3, 16, 4, 2, 8  # items of 2 heads x 8 uint16 = 32 bytes


def _indices(kind, rng, count, tokens=T, page=P):
    """``(src, dst)`` int64 indices: ``runs`` (whole pages, so layer-first and paged sides make runs),
    ``scattered`` (random tokens), ``one`` (one token), ``same`` (the same tokens on both sides)."""
    if kind == "runs":
        pages = count // page
        src = (rng.choice(tokens // page, pages, replace=False)[:, None] * page + np.arange(page)).reshape(-1)
        dst = (rng.choice(tokens // page, pages, replace=False)[:, None] * page + np.arange(page)).reshape(-1)
    elif kind == "scattered":
        src, dst = (rng.choice(tokens, count, replace=False) for _ in range(2))
    elif kind == "one":
        src, dst = np.array([tokens - 1]), np.array([0])
    else:
        src = dst = np.arange(count)
    return src.astype(np.int64), dst.astype(np.int64)


def run_route(src_name, dst_name, *, route="copy_engine", mla=False, kind="runs", count=8, layers=None,
              where="host", places=("device", "device"), seed=0):
    """kv.copy by ``route`` on placed views, reference.copy on NumPy ones: every destination byte agrees."""
    rng = np.random.default_rng(seed)
    src_np, src = make_view(src_name, L, T, P, H, D, rng, poison=False, mla=mla, place=(places[0], "numba"))
    dst_np, dst = make_view(dst_name, L, T, P, H, D, rng, poison=True, mla=mla, place=(places[1], "numba"))
    si, di = _indices(kind, rng, count)
    put = PLACE["device"] if where == "device" else (lambda a: a)
    kv.copy(src, dst, put(si), put(di), layers, route=route)
    synchronize()
    reference.copy(src_np, dst_np, si, di, layers)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"{src_name} -> {dst_name} by {route}")
    return kv.last_route()


PAIRS = [(s, d) for s in BUILT_IN for d in BUILT_IN]


@pytest.mark.parametrize("src_name,dst_name", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_the_copy_engine_moves_every_pair_as_the_reference(src_name, dst_name):
    assert run_route(src_name, dst_name) == "copy_engine"


MLA_PAIRS = [(s, d) for s, d in PAIRS if s not in KV_ONLY and d not in KV_ONLY]


@pytest.mark.parametrize("src_name,dst_name", MLA_PAIRS, ids=[f"{s}-{d}" for s, d in MLA_PAIRS])
def test_the_copy_engine_moves_every_mla_pair(src_name, dst_name):
    assert run_route(src_name, dst_name, mla=True, kind="scattered") == "copy_engine"


@pytest.mark.parametrize("kind", ["runs", "scattered", "one", "same"])
@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("pair", [("LayerFirst", "LayerFirstList"), ("PageFirstDirect", "VllmFlashAttn"),
                                  ("PageHead", "FlashInferHND"), ("PageFirst", "LayerFirst")])
def test_indices_of_every_kind_and_place(pair, kind, where):
    run_route(*pair, kind=kind, where=where, count=16 if kind == "same" else 8)


@pytest.mark.parametrize("layers", [None, 0, 2, range(1, 3)])
@pytest.mark.parametrize("pair", [("LayerFirstList", "VllmFlashAttn"), ("PageHead", "PageFirst")])
def test_layers(pair, layers):
    run_route(*pair, layers=layers)


@pytest.mark.parametrize("places", [("host", "device"), ("device", "host")], ids=["h2d", "d2h"])
def test_host_and_device_memory(places):
    run_route("LayerFirstList", "PageFirstDirect", places=places)
    run_route("PageFirstDirect", "LayerFirst", places=places, kind="scattered")


def test_runs_are_found_where_both_sides_follow_on():
    """Tokens whose bytes follow each other in both views are one copy; a break on either side ends it."""
    rng = np.random.default_rng(0)
    place = ("device", "numba")
    _, src = make_view("LayerFirst", 2, 64, 8, 1, 4, rng, poison=False, mla=True, place=place)  # items of 8 bytes
    _, dst = make_view("PageFirstDirect", 2, 64, 8, 1, 4, rng, poison=True, mla=True, place=place)  # pages of 8
    plan = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=0)._plan
    si = np.array([0, 1, 2, 3, 10, 11, 20, 21, 22], np.int64)
    di = np.array([6, 7, 8, 9, 30, 31, 40, 41, 50], np.int64)  # a page ends after 7; 22 -> 50 breaks the last run
    engine = plan.engine
    found = engine.fill(*engine.offsets(si, di), 0, 1)
    assert (found.copies, found.runs, found.nbytes) == (5, 5, 9 * 8)
    dsts, srcs, sizes = engine.batch.out[:, :found.copies]
    assert sizes.tolist() == [16, 16, 16, 16, 8]
    starts = np.array([0, 2, 4, 6, 8])
    assert (srcs - srcs[0]).tolist() == ((si[starts] - si[0]) * 8).tolist()  # items of 8 bytes, one layer
    assert not routes.engine_pays(found)  # 14-byte copies on average: the kernel


@pytest.mark.parametrize("name", ["LayerFirst", "PageHead"])
def test_engine_copies_are_ordered_kind_layer_head_run(name):
    """Copies over 2 layers, K and V (and heads, where the view splits items): runs inner, then heads, layers
    and K/V, each run's source and destination offsets added to its part's; runs as a plain loop finds them."""
    rng = np.random.default_rng(3)
    place = ("device", "numba")
    _, src = make_view(name, 2, 16, 4, 2, 4, rng, poison=False, mla=False, place=place)
    _, dst = make_view(name, 2, 16, 4, 2, 4, rng, poison=True, mla=False, place=place)
    plan = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=range(2))._plan
    engine = plan.engine
    si, di = np.array([0, 1, 2, 9, 3], np.int64), np.array([4, 5, 6, 1, 12], np.int64)
    s_off = engine.src.token_offsets(si, engine.item_size, engine.heads)
    d_off = engine.dst.token_offsets(di, engine.item_size, engine.heads)
    runs = []  # (start, length), by a plain loop
    for i in range(len(si)):
        if runs and s_off[i] == s_off[i - 1] + engine.chunk and d_off[i] == d_off[i - 1] + engine.chunk:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    found = engine.fill(*engine.offsets(si, di), 0, 2)
    parts = engine.parts(0, 2)
    assert parts.shape[1] == 2 * 2 * engine.heads
    assert (found.runs, found.copies, found.nbytes) == (len(runs), len(runs) * parts.shape[1],
                                                       len(si) * engine.chunk * parts.shape[1])
    dsts, srcs, sizes = engine.batch.out[:, :found.copies]
    for part in range(parts.shape[1]):
        for r, (start, length) in enumerate(runs):
            k = part * len(runs) + r
            assert (srcs[k], dsts[k]) == (parts[0, part] + s_off[start], parts[1, part] + d_off[start])
            assert sizes[k] == length * engine.chunk
    if name == "LayerFirst":
        assert [length for _, length in runs] == [3, 1, 1]


@pytest.mark.parametrize("src_name,dst_name", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_the_one_pass_writes_what_offsets_and_fill_write(src_name, dst_name):
    """``EnginePlan.scan`` (the compiled check, offsets, runs and copies of a ``kv.copy`` by copy engine) writes
    the copies ``fill`` writes from ``offsets``, for runs and scattered tokens over two layers; an index at its
    side's limit is refused with nothing counted."""
    rng = np.random.default_rng(7)
    place = ("device", "numba")
    _, src = make_view(src_name, L, T, P, H, D, rng, poison=False, mla=False, place=place)
    _, dst = make_view(dst_name, L, T, P, H, D, rng, poison=True, mla=False, place=place)
    plan = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=range(1, 3))._plan
    engine, window = plan.engine, plan.windows[0]
    limits = (window.src_limit, window.dst_limit)
    for kind in ("runs", "scattered", "one"):
        si, di = _indices(kind, rng, 8)
        want = engine.fill(*engine.offsets(si, di), 1, 2)
        written = engine.batch.out[:, :want.copies].copy()
        engine.batch.out[:] = -1
        found = engine.scan(si, di, limits, 1, 2)
        assert found == want, kind
        np.testing.assert_array_equal(engine.batch.out[:, :found.copies], written, err_msg=kind)
    for side in (0, 1):
        bad = [np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64)]
        bad[side][3] = limits[side]
        assert engine.scan(bad[0], bad[1], limits, 1, 2) is None
        bad[side][3] = -1
        assert engine.scan(bad[0], bad[1], limits, 1, 2) is None


@pytest.mark.parametrize("src_name,dst_name", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_auto_skips_the_pass_only_where_no_run_can_form(src_name, dst_name):
    """``EnginePlan.may_pay`` is False (``auto`` takes the kernel without the pass) only where no two tokens of a
    side lie one chunk apart, which every run needs: checked against every pair of tokens of both sides."""
    rng = np.random.default_rng(9)
    place = ("device", "numba")
    _, src = make_view(src_name, L, T, P, H, D, rng, poison=False, mla=False, place=place)
    _, dst = make_view(dst_name, L, T, P, H, D, rng, poison=True, mla=False, place=place)
    engine = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=0)._plan.engine
    tokens = np.arange(T, dtype=np.int64)
    steps = [np.subtract.outer(offsets, offsets) for offsets in engine.offsets(tokens, tokens)]
    assert engine.may_pay or not all((step == engine.chunk).any() for step in steps)


# --- auto -------------------------------------------------------------------------------------------------

def _big_views(rng, tokens=128):
    """Layer-first views of items of 2 KiB (8 heads x 128 bf16): 32 tokens are a 64 KiB run."""
    k, v = (rng.integers(0, 2**16, (1, tokens, 8, 128), dtype=np.uint16) for _ in range(2))
    src = kv.LayerFirst(PLACE["host"](k), PLACE["host"](v))
    dst = kv.LayerFirst(PLACE["device"](np.zeros_like(k)), PLACE["device"](np.zeros_like(v)))
    return src, dst, k, v


def test_auto_takes_the_copy_engine_for_long_runs_of_host_indices():
    rng = np.random.default_rng(1)
    src, dst, k, v = _big_views(rng)
    runs = np.arange(64, dtype=np.int64)  # two 64 KiB runs per K and V
    stream = None
    if on_gpu():  # the batch call needs a stream other than the legacy default stream
        from numba import cuda

        stream = cuda.stream()
    kv.copy(src, dst, runs, runs, stream=stream)
    assert kv.last_route() == "copy_engine"
    kv.copy(src, dst, runs[::2].copy(), runs[::2].copy(), stream=stream)  # 2 KiB copies: the kernel
    assert kv.last_route() == "kernel"
    if on_gpu():  # indices in GPU memory (on the simulator every array is host memory)
        kv.copy(src, dst, PLACE["device"](runs), PLACE["device"](runs), stream=stream)
        assert kv.last_route() == "kernel"
    synchronize()
    np.testing.assert_array_equal(to_numpy(dst.k)[0, :64], k[0, :64])
    np.testing.assert_array_equal(to_numpy(dst.v)[0, :64], v[0, :64])


@pytest.mark.gpu  # the legacy default stream exists only on a GPU
def test_auto_stays_on_the_kernel_on_the_legacy_default_stream():
    rng = np.random.default_rng(2)
    src, dst, k, _ = _big_views(rng)
    runs = np.arange(64, dtype=np.int64)
    kv.copy(src, dst, runs, runs, stream=0)
    assert kv.last_route() == "kernel"
    kv.copy(src, dst, runs, runs, stream=0, route="copy_engine")  # asked for: page by page there
    assert kv.last_route() == "copy_engine" and kv.last_path() == "page"
    synchronize()
    np.testing.assert_array_equal(to_numpy(dst.k)[0, :64], k[0, :64])


def test_a_prepared_copy_takes_its_route_bound_or_per_call():
    rng = np.random.default_rng(3)
    src_np, src = make_view("PageFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_view("LayerFirstList", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = _indices("runs", rng, 8)
    bound = kv.prepare(kv.copy, src_view=src, dst_view=dst, route="copy_engine")
    bound(si, di)
    assert kv.last_route() == "copy_engine"
    free = kv.prepare(kv.copy, src_view=src, dst_view=dst)
    free(si, di, route="kernel")
    assert kv.last_route() == "kernel"
    free(si, di, route="copy_engine")
    assert kv.last_route() == "copy_engine"
    synchronize()
    reference.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


# --- refusals ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route, error, match", [("engine", ValueError, "route must be one of"),
                                                 (1, TypeError, "route must be one of"),
                                                 (None, TypeError, "route must be one of")])
def test_a_bad_route_is_refused_by_name(route, error, match):
    rng = np.random.default_rng(4)
    _, src = make_view("PageFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    with pytest.raises(error, match=match):
        kv.copy(src, dst, np.arange(4), np.arange(4), route=route)
    with pytest.raises(error, match=match):
        kv.prepare(kv.copy, src_view=src, dst_view=dst, route=route)
    assert all((b == POISON).all() for b in view_bytes(dst))


def test_a_layout_of_your_own_goes_by_kernel_only():
    rng = np.random.default_rng(5)
    _, src = make_view("HeadMajorPages", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    with pytest.raises(ValueError, match="route='copy_engine' cannot copy these views: HeadMajorPages is a layout"):
        kv.copy(src, dst, np.arange(4), np.arange(4), route="copy_engine")
    assert all((b == POISON).all() for b in view_bytes(dst))
    kv.copy(src, dst, np.arange(4), np.arange(4))  # auto: the kernel
    assert kv.last_route() == "kernel"


@pytest.mark.parametrize("where", ["host", "device"])
def test_indices_out_of_range_are_refused_before_any_copy(where, device_path):
    """The copy engine has no guard in the kernel: its indices are checked on the host, always."""
    rng = np.random.default_rng(6)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_view("PageFirstDirect", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    put = PLACE["device"] if where == "device" else (lambda a: a)
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[2\] = 16 is out of range"):
        kv.copy(src, dst, put(np.arange(3)), put(np.array([0, 1, T])), route="copy_engine")
    assert all((b == POISON).all() for b in view_bytes(dst))


@pytest.mark.parametrize("route", ["copy_engine", "auto"])
def test_host_indices_out_of_range_name_the_first_side_and_position(route):
    """Host indices are checked in the copy engine's one pass; its errors are the plain checks' (the source's
    first), and ``auto``, which would take the kernel for these short copies, raises them alike."""
    rng = np.random.default_rng(6)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_view("PageFirstDirect", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    for si, di, match in ((np.arange(3), np.array([0, 1, T]), r"dst_indices\[2\] = 16 is out of range"),
                          (np.array([0, -1, 2]), np.array([0, 1, T]), r"src_indices\[1\] = -1 is out of range")):
        with pytest.raises(kv.IndexOutOfRangeError, match=match):
            kv.copy(src, dst, si, di, route=route)
    assert all((b == POISON).all() for b in view_bytes(dst))


@pytest.mark.skipif(on_gpu(), reason="stands a capture in on the simulator; a GPU capture refuses host indices")
def test_auto_checks_host_indices_where_it_takes_the_kernel_before_the_pass(monkeypatch):
    """``auto`` leaves host indices to the copy engine's pass; where it takes the kernel before that pass (here a
    stream being captured), the host checks them first, as the kernel route does: out of range, nothing written."""
    from kvnumba.plan import per_call

    rng = np.random.default_rng(8)
    src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_view("PageFirstDirect", L, T, P, H, D, rng, poison=True, mla=False,
                            place=("device", "numba"))
    kv.copy(src, dst, np.zeros(0, np.int64), np.zeros(0, np.int64))  # the plan built before the "capture"
    monkeypatch.setattr(per_call.capture, "capturing", lambda handle: True)
    with pytest.raises(kv.IndexOutOfRangeError, match=r"src_indices\[1\] = 16 is out of range"):
        kv.copy(src, dst, np.array([0, T]), np.array([0, 1]))
    assert all((b == POISON).all() for b in view_bytes(dst))
    si, di = np.array([3, 7], np.int64), np.array([0, 1], np.int64)
    kv.copy(src, dst, si, di)
    assert kv.last_route() == "kernel"
    reference.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_the_route_log():
    log = routes.RouteLog()
    log.record("kernel")
    log.record("copy_engine")
    assert log.last == "copy_engine" and log.counts == {"kernel": 1, "copy_engine": 1}


def test_auto_weighs_the_copy_engines_host_time_against_the_kernels_load():
    """``engine_pays``: long copies, but a copy-engine call dearer than the kernel's whole load, go by kernel."""
    found = routes.EngineFill(copies=2, runs=1, nbytes=2 * 128 * 1024)
    cheap = routes.HostCost(engine_fixed_us=10.0, engine_per_copy_us=1.0, kernel_fixed_us=5.0,
                            kernel_bytes_per_us=1e4)  # engine 12 us, kernel 5 + 26.2 us
    dear = cheap._replace(engine_fixed_us=40.0)  # engine 42 us
    assert routes.engine_pays(found, cheap) and not routes.engine_pays(found, dear)
    short = routes.EngineFill(copies=64, runs=32, nbytes=64 * 8 * 1024)  # 8 KiB copies: too short either way
    assert not routes.engine_pays(short, cheap)
    assert not routes.engine_pays(routes.EngineFill(0, 0, 0), cheap)
