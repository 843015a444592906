"""kv.load_resident by copy engine (``route="copy_engine"``, and ``"auto"`` where runs are long): one batch of
copies per layer, in layer order, each layer's count published on the stream after its copies. Every source
layout byte for byte against kvnumba.reference.copy with the destinations poisoned; the route ``auto`` takes;
the layer count; errors with nothing written. On a GPU the waits are real (``test_gpu_resident.py``)."""
import gc

import numpy as np
import pytest
from numba import cuda

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import PLACE, synchronize
from tests.helpers.view_cases import POISON, assert_same_bytes, make_view, view_bytes

pytestmark = [pytest.mark.needs_target]

L, T, P, H, D = 3, 16, 4, 2, 8  # items of 2 heads x 8 uint16 = 32 bytes: short runs
SOURCES = ["PageFirst", "PageHead", "LayerFirst", "PageUnified", "PageFirstDirect"]


def load(src_name, dst_name, geometry=(L, T, P, H, D), *, route, layers=None, pages=None, seed=0, mla=False):
    """A resident load of host indices on placed views, checked against reference.copy; the ``ResidentLoad``."""
    rng = np.random.default_rng(seed)
    src_np, src = make_view(src_name, *geometry, rng, poison=False, mla=mla, place=("host", "numba"))
    dst_np, dst = make_view(dst_name, *geometry, rng, poison=True, mla=mla, place=("device", "numba"))
    tokens, page = geometry[1], geometry[2]
    if pages is None:
        si, di = (rng.choice(tokens, 6, replace=False).astype(np.int64) for _ in range(2))
    else:  # whole pages: one run per page and layer where the layouts keep a page's tokens together
        si, di = ((rng.choice(tokens // page, pages, replace=False)[:, None] * page + np.arange(page)).reshape(-1)
                  for _ in range(2))
    # a stream of its own (the legacy default stream has no batch call, where auto takes the kernel), made for the
    # call alone: the load keeps it alive until it is waited for
    done = kv.load_resident(src, dst, PLACE["host"](si), PLACE["host"](di), layers, route=route, stream=cuda.stream())
    gc.collect()
    for layer in done.layers:
        done.wait(layer)
    done.synchronize()
    reference.copy(src_np, dst_np, si, di, layers)
    assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, f"{src_name} -> {dst_name} by {done.route}")
    assert done.landed() == len(done.layers)
    return done


@pytest.mark.parametrize("src_name", SOURCES)
def test_every_source_layout_by_copy_engine(src_name):
    done = load(src_name, "LayerFirstList", route="copy_engine")
    assert done.route == "copy_engine" and not done.staged and done.moved_by == "copy_engine"
    assert "copy_engine" in repr(done)


@pytest.mark.parametrize("src_name", ["PageFirst", "LayerFirst", "PageUnified"])
def test_mla_by_copy_engine(src_name):
    assert load(src_name, "LayerFirst", route="copy_engine", mla=True).route == "copy_engine"


def test_some_layers_by_copy_engine():
    done = load("LayerFirst", "LayerFirst", route="copy_engine", layers=range(1, 3))
    assert done.layers == range(1, 3)


# Layer-first pools of 16 KiB items in pages of 4 tokens: a page of a layer's K (or V) is one 64 KiB run.
LONG_RUNS = (2, 16, 4, 8, 1024)


@pytest.mark.parametrize("src_name", ["LayerFirst", "PageFirstDirect", "PageUnified"])
def test_auto_takes_the_copy_engine_for_long_runs(src_name):
    assert load(src_name, "LayerFirst", LONG_RUNS, route="auto", pages=2).route == "copy_engine"


def test_auto_takes_the_resident_loader_for_short_runs():
    assert load("LayerFirst", "LayerFirst", route="auto").route == "kernel"
    assert load("PageFirst", "LayerFirst", LONG_RUNS, route="auto", pages=2).route == "kernel"  # a token a run


def test_the_kernel_route_is_the_resident_loader():
    assert load("LayerFirst", "LayerFirst", LONG_RUNS, route="kernel", pages=2).route == "kernel"


@pytest.mark.parametrize("route,error,message", [
    ("engine", ValueError, "route must be one of 'auto', 'kernel', 'copy_engine', got 'engine'"),
    (None, TypeError, "route must be one of"),
])
def test_a_bad_route_is_named_and_nothing_is_written(route, error, message):
    rng = np.random.default_rng(1)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("host", "numba"))
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    idx = PLACE["host"](np.arange(4, dtype=np.int64))
    with pytest.raises(error, match=message):
        kv.load_resident(src, dst, idx, idx, route=route)
    synchronize()
    for got in view_bytes(dst):
        assert (got.view(np.uint8) == POISON).all()


def test_an_index_out_of_range_is_refused_before_any_copy():
    rng = np.random.default_rng(2)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("host", "numba"))
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    signal = kv.LayerSignal(L)
    with pytest.raises(kv.errors.IndexOutOfRangeError, match=r"src_indices\[1\] = 16"):
        kv.load_resident(src, dst, PLACE["host"](np.array([0, T], np.int64)), PLACE["host"](np.arange(2, dtype=np.int64)),
                         route="copy_engine", signal=signal)
    synchronize()
    for got in view_bytes(dst):
        assert (got.view(np.uint8) == POISON).all()
    assert signal.landed() == 0


def test_a_signal_serves_loads_by_both_routes_in_turn():
    signal = kv.LayerSignal(L)
    rng = np.random.default_rng(3)
    src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("host", "numba"))
    dst_np, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    for route in ("copy_engine", "kernel", "copy_engine"):
        si, di = (rng.choice(T, 5, replace=False).astype(np.int64) for _ in range(2))
        done = kv.load_resident(src, dst, PLACE["host"](si), PLACE["host"](di), route=route, signal=signal)
        done.wait(L - 1)
        done.synchronize()
        assert done.route == route and signal.landed() == L
        reference.copy(src_np, dst_np, si, di)
    assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, "three loads")
