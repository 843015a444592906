"""kv.copy between cache views: every built-in pair (and a user-defined layout), with and without MLA,
against kvnumba.reference.copy byte for byte, destinations poisoned; the views' errors; kv.prepare with
views; a property test over random view pairs. The same tests run on the simulator and on a GPU."""
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import PLACE, host, to_numpy
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, POISON, HeadMajorPages, assert_same_bytes, make_view, view_bytes

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset

NAMES = list(LAYOUTS)
L, T, P, H, D = 3, 16, 4, 2, 8  # 16 tokens in pages of 4; items of 2 heads x 8 uint16 = 32 bytes


def run_copy(src_name, dst_name, *, mla=False, count=6, layers=None, seed=0, places=("device", "device"),
             framework="numba", block_quota=1, num_warps_per_block=2, geometry=(L, T, P, H, D)):
    """kv.copy on placed views and reference.copy on NumPy ones; every destination byte must agree."""
    rng = np.random.default_rng(seed)
    g = geometry
    src_np, src = make_view(src_name, *g, rng, poison=False, mla=mla, place=(places[0], framework))
    dst_np, dst = make_view(dst_name, *g, rng, poison=True, mla=mla, place=(places[1], framework))
    tokens = g[1]
    si = rng.choice(tokens, count, replace=False).astype(np.int64)
    di = rng.choice(tokens, count, replace=False).astype(np.int64)
    put = PLACE["device"]
    kv.copy(src, dst, put(si), put(di), layers, block_quota=block_quota, num_warps_per_block=num_warps_per_block)
    reference.copy(src_np, dst_np, si, di, layers)
    moved = assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, f"{src_name} -> {dst_name}")
    assert count == 0 or moved > 0, "the reference moved nothing"


PAIRS = [(s, d) for s in NAMES for d in NAMES]


@pytest.mark.parametrize("src_name,dst_name", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_every_pair_matches_the_reference(src_name, dst_name):
    run_copy(src_name, dst_name)


MLA_PAIRS = [(s, d) for s, d in PAIRS if s not in KV_ONLY and d not in KV_ONLY]


@pytest.mark.parametrize("src_name,dst_name", MLA_PAIRS, ids=[f"{s}-{d}" for s, d in MLA_PAIRS])
def test_every_mla_pair_matches_the_reference(src_name, dst_name):
    run_copy(src_name, dst_name, mla=True)


@pytest.mark.parametrize("layers", [None, 0, 2, range(1, 3)])
@pytest.mark.parametrize("pair", [("PageFirst", "VllmFlashAttn"), ("PageHead", "FlashInferHND")])
def test_layers(pair, layers):
    run_copy(*pair, layers=layers)


@pytest.mark.parametrize("places", [("host", "device"), ("device", "host")], ids=["h2d", "d2h"])
@pytest.mark.parametrize("pair", [("PageFirst", "LayerFirstList"), ("LayerFirst", "PageFirstDirect"),
                                  ("PageHead", "FlashInferNHD")])
def test_host_and_device(pair, places):
    run_copy(*pair, places=places)


@pytest.mark.parametrize("count", [0, 1, 16])
def test_token_counts_and_the_last_token(count):
    run_copy("PageFirst", "FlashInferHND", count=count, block_quota=2, num_warps_per_block=1)


@pytest.mark.gpu  # torch tensors on a GPU
@pytest.mark.parametrize("pair", [("PageFirst", "VllmFlashAttn"), ("FlashInferHND", "PageHead"),
                                  ("LayerFirstList", "HeadMajorPages")])
def test_torch_views(pair):
    pytest.importorskip("torch")
    run_copy(*pair, framework="torch")


# --- the seed's own pairs, through views, against the seed's entry points -------------------------

def test_a_seed_pair_through_views_equals_the_entry_point():
    """kv.copy(PageFirst, LayerFirst list, layer l) moves what transfer_kv_per_layer_pf_lf moves."""
    rng = np.random.default_rng(5)
    src_k, src_v = (rng.integers(0, 256, (T, L, 32), dtype=np.uint8) for _ in range(2))
    si = rng.choice(T, 5, replace=False).astype(np.int64)
    di = rng.choice(T, 5, replace=False).astype(np.int64)
    dev = PLACE["device"]
    a = [dev(np.full((T, 32), POISON, np.uint8)) for _ in range(2)]
    b = [[dev(np.full((T, 32), POISON, np.uint8)) for _ in range(L)] for _ in range(2)]
    hk, hv = host(src_k), host(src_v)
    kv.transfer_kv_per_layer_pf_lf(hk, a[0], hv, a[1], dev(si), dev(di), 1, 32, L * 32)
    kv.copy(kv.PageFirst(hk, hv), kv.LayerFirst(b[0], b[1]), dev(si), dev(di), 1)
    np.testing.assert_array_equal(to_numpy(a[0]), to_numpy(b[0][1]))
    np.testing.assert_array_equal(to_numpy(a[1]), to_numpy(b[1][1]))


# --- errors ---------------------------------------------------------------------------------------

def _np_views(src="PageFirst", dst="LayerFirst", mla=False, geometry=(L, T, P, H, D)):
    rng = np.random.default_rng(0)
    return make_view(src, *geometry, rng, False, mla)[1], make_view(dst, *geometry, rng, True, mla)[1]


IDX = np.arange(4, dtype=np.int64)


@pytest.mark.parametrize("build,error,match", [
    (lambda: (np.zeros(4), _np_views()[1]), TypeError, r"src_view must be a kvnumba cache view .*got ndarray"),
    (lambda: (_np_views(mla=True)[0], _np_views()[1]), ValueError, r"src_view is MLA \(no V\) but dst_view is K and V"),
    (lambda: (_np_views()[0], _np_views(geometry=(L, T, P, H, 4))[1]), ValueError,
     r"the views' items differ: src_view 32 bytes, dst_view 16 bytes"),
    (lambda: (kv.PageFirst(np.zeros((T, L, 2, 8), np.uint16), np.zeros((T, L, 2, 8), np.uint16)),
              kv.PageHead(np.zeros((4, 4, 4, L, 4), np.uint16), np.zeros((4, 4, 4, L, 4), np.uint16))),
     ValueError, r"the views' heads differ: src_view 2, dst_view 4"),
    (lambda: (kv.PageFirst(np.zeros((T, L, 8, 2), np.uint16), np.zeros((T, L, 8, 2), np.uint16)),
              kv.PageHead(np.zeros((4, 8, 4, L, 2), np.uint16), np.zeros((4, 8, 4, L, 2), np.uint16))),
     ValueError, r"an item of 32 bytes split into 8 heads is not a whole number of 8-byte words per head"),
    (lambda: (kv.PageFirst(np.zeros((T, L, H, D), np.float16), np.zeros((T, L, H, D), np.float16)),
              _np_views()[1]), TypeError, r"the views' dtypes differ: src_view float16, dst_view uint16"),
])
def test_views_that_do_not_fit_are_refused(build, error, match):
    src, dst = build()
    before = [b.copy() for b in view_bytes(dst)]
    with pytest.raises(error, match=match):
        kv.copy(src, dst, IDX, IDX)
    for got, want in zip(view_bytes(dst), before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layers,error,match", [
    (3, ValueError, r"layers=3 is out of range for views of 3 layers"),
    (range(2, 5), ValueError, r"layers=range\(2, 5\) is out of range"),
    (range(0, 3, 2), ValueError, r"layers must be a non-empty range with step 1"),
    (-1, ValueError, r"layers must be >= 0, got -1"),
    ("all", TypeError, r"layers must be None, an int or a range, got str"),
])
def test_bad_layers(layers, error, match):
    src, dst = _np_views()
    with pytest.raises(error, match=match):
        kv.copy(src, dst, IDX, IDX, layers)


def test_an_index_outside_a_view_names_it():
    rng = np.random.default_rng(0)
    src = make_view("PageFirst", L, T, P, H, D, rng, False, False, place=("device", "numba"))[1]
    dst = make_view("VllmFlashAttn", L, T, P, H, D, rng, True, False, place=("device", "numba"))[1]
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[1\] = 16 is out of range for dst_view "
                                                      r"\(VllmFlashAttn\(L=3, T=16, P=4.*valid tokens are \[0, 16\)"):
        kv.copy(src, dst, IDX, np.array([0, 16, 1, 2], np.int64))


def test_views_check_their_shapes():
    with pytest.raises(ValueError, match=r"PageFirst: a buffer is \[T, L, \*item\], got \(4, 4\)"):
        kv.PageFirst(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match=r"PageFirst: v has the geometry"):
        kv.PageFirst(np.zeros((4, 2, 8), np.uint8), np.zeros((4, 3, 8), np.uint8))
    assert kv.PageHead(np.zeros((2, 2, 4, 3, 8), np.uint8), page_size=4).geometry.page_size == 4
    with pytest.raises(ValueError, match=r"PageFirstDirect: page_size=8, but the buffers' pages hold 4 tokens"):
        kv.PageFirstDirect(np.zeros((2, 3, 4, 8), np.uint8), page_size=8)
    with pytest.raises(ValueError, match=r"VllmFlashInfer: layout must be 'NHD' or 'HND', got 'NDH'"):
        kv.VllmFlashInfer([np.zeros((2, 2, 4, 1, 8), np.uint8)], layout="NDH")
    with pytest.raises(ValueError, match=r"VllmFlashAttn: every layer is \[2, num_blocks"):
        kv.VllmFlashAttn([np.zeros((3, 2, 4, 1, 8), np.uint8)])


def test_a_user_layout_whose_arithmetic_leaves_its_buffer_is_refused():
    class Stretched(HeadMajorPages):
        @staticmethod
        def token_offset(token, layout_dim, item_size, heads, page_size):
            return token * item_size * 2  # twice too far

    with pytest.raises(ValueError, match=r"Stretched: its address arithmetic puts token 15, layer 2, .* outside k"):
        Stretched(np.zeros((L, T // P, H, P, D), np.uint16), np.zeros((L, T // P, H, P, D), np.uint16))


# --- kv.prepare with views --------------------------------------------------------------------------

def test_prepared_copy_over_layers():
    rng = np.random.default_rng(2)
    src_np, src = make_view("PageFirst", L, T, P, H, D, rng, False, False, place=("host", "numba"))
    dst_np, dst = make_view("VllmFlashAttn", L, T, P, H, D, rng, True, False, place=("device", "numba"))
    loads = [kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=layer) for layer in range(L)]
    assert "src_view=PageFirst(L=3, T=16" in repr(loads[0])
    si, di = np.array([1, 7, 12], np.int64), np.array([0, 8, 15], np.int64)
    for layer in range(L):
        loads[layer](PLACE["device"](si), PLACE["device"](di))
        reference.copy(src_np, dst_np, si, di, layer)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


# --- property: any pair, any geometry, any indices and layers -----------------------------------------

@st.composite
def copies(draw):
    src_name, dst_name = draw(st.sampled_from(NAMES)), draw(st.sampled_from(NAMES))
    mla = draw(st.booleans()) and src_name not in KV_ONLY and dst_name not in KV_ONLY
    layers = draw(st.integers(1, 3))
    page = draw(st.sampled_from([1, 2, 4]))
    tokens = page * draw(st.integers(1, 4))
    heads = draw(st.sampled_from([1, 2, 4]))
    dim = 4 * draw(st.integers(1, 3))  # uint16: heads x dim x 2 bytes, each head a multiple of 8 bytes
    window = draw(st.sampled_from([None, "one", "range"]))
    first = draw(st.integers(0, layers - 1))
    chosen = {None: None, "one": first, "range": range(first, layers)}[window]
    return dict(src_name=src_name, dst_name=dst_name, mla=mla, count=draw(st.integers(0, tokens)),
                layers=chosen, seed=draw(st.integers(0, 2**16)), geometry=(layers, tokens, page, heads, dim),
                block_quota=draw(st.integers(1, 2)), num_warps_per_block=draw(st.integers(1, 2)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(copies())
def test_random_view_pairs_match_the_reference(case):
    run_copy(**case)


def test_raw_layer_tables_as_a_view():
    """LayerTable: the seed's uint64 tables of layer addresses, with the tokens and item size given."""
    rng = np.random.default_rng(4)
    k_layers = [rng.integers(0, 2**16, (T, H, D), dtype=np.uint16) for _ in range(L)]
    v_layers = [rng.integers(0, 2**16, (T, H, D), dtype=np.uint16) for _ in range(L)]
    placed_k = [PLACE["device"](a) for a in k_layers]
    placed_v = [PLACE["device"](a) for a in v_layers]
    src = kv.LayerTable(kv.layer_table(placed_k), kv.layer_table(placed_v), tokens=T, item_size=H * D * 2, heads=H)
    dst_np, dst = make_view("PageFirst", L, T, P, H, D, rng, True, False, place=("device", "numba"))
    si, di = np.array([0, 15, 3], np.int64), np.array([4, 5, 6], np.int64)
    kv.copy(src, dst, PLACE["device"](si), PLACE["device"](di))
    reference.copy(kv.LayerFirst(k_layers, v_layers), dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(kv.IndexOutOfRangeError, match=r"src_indices\[0\] = 16 is out of range"):
        kv.copy(src, dst, np.array([16], np.int64), np.array([0], np.int64))


# --- layer counts and heads: what the docs say (docs/guides/layouts.md) ------------------------------------

def test_layer_counts_that_differ_need_layers():
    """layers=None means every layer: views of 4 and 2 layers are refused (nothing written), unless layers= says
    which; the reference follows the same rule."""
    rng = np.random.default_rng(7)
    src_np, src = make_view("PageFirst", 4, T, P, H, D, rng, False, False, place=("device", "numba"))
    dst_np, dst = make_view("LayerFirst", 2, T, P, H, D, rng, True, False, place=("device", "numba"))
    before = [b.copy() for b in view_bytes(dst)]
    message = (r"the views' layer counts differ: src_view has 4, dst_view 2; pass layers= to say which to copy "
               r"\(e\.g\. layers=range\(2\)\)")
    with pytest.raises(ValueError, match=message):
        kv.copy(src, dst, IDX, IDX)
    with pytest.raises(ValueError, match=message):
        kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=None)
    with pytest.raises(ValueError, match=message):
        reference.copy(src_np, dst_np, IDX, IDX)
    for got, want in zip(view_bytes(dst), before):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"layers=range\(0, 3\) is out of range for views of 2 layers"):
        kv.copy(src, dst, IDX, IDX, range(3))
    kv.copy(src, dst, PLACE["device"](IDX), PLACE["device"](IDX), range(2))
    reference.copy(src_np, dst_np, IDX, IDX, range(2))
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src,dst", [
    # neither view splits its items by head: compared all the same
    (lambda: kv.PageFirst(np.zeros((T, L, 2, 8), np.uint16)), lambda: kv.LayerFirst(np.zeros((L, T, 4, 4), np.uint16))),
    (lambda: kv.PageFirst(np.zeros((T, L, 16), np.uint16)), lambda: kv.PageFirstDirect(np.zeros((4, L, 4, 2, 8),
                                                                                                  np.uint16))),
], ids=["2-vs-4-heads", "flat-vs-2-heads"])
def test_heads_that_differ_are_refused_whichever_views(src, dst):
    s, d = src(), dst()
    with pytest.raises(ValueError, match=rf"the views' heads differ: src_view {s.geometry.heads}, dst_view "
                                         rf"{d.geometry.heads} \(items of H heads are \(H, D\), a flat item \(D,\) has "
                                         r"one head\)"):
        kv.copy(s, d, IDX, IDX)


def test_a_layer_table_says_its_heads():
    tables = kv.layer_table([PLACE["device"](np.zeros((T, H, D), np.uint16)) for _ in range(L)])
    dst = kv.PageFirst(PLACE["device"](np.zeros((T, L, H, D), np.uint16)))
    with pytest.raises(ValueError, match=r"heads differ: src_view 1, dst_view 2 .*; a LayerTable takes heads="):
        kv.copy(kv.LayerTable(tables, tokens=T, item_size=H * D * 2), dst, IDX, IDX)
    kv.copy(kv.LayerTable(tables, tokens=T, item_size=H * D * 2, heads=H), dst, IDX, IDX)


def test_a_prepared_copy_takes_its_launch_shape_by_keyword_only():
    rng = np.random.default_rng(0)
    src = make_view("PageFirst", L, T, P, H, D, rng, False, False, place=("device", "numba"))[1]
    dst = make_view("LayerFirst", L, T, P, H, D, rng, True, False, place=("device", "numba"))[1]
    copy = kv.prepare(kv.copy, src_view=src, dst_view=dst)
    with pytest.raises(TypeError, match=r"copy transfer takes 3 positional arguments \(src_indices, dst_indices, "
                                        r"layers\) but 4 were given"):
        copy(IDX, IDX, None, 1)
    copy(IDX, IDX, block_quota=1, num_warps_per_block=2)
    bound = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=0)  # the fast path, too
    with pytest.raises(TypeError):
        bound(IDX, IDX, 1)
    bound(IDX, IDX, block_quota=1)
    assert "block_quota" in str(inspect.signature(bound)).split("*")[1]
