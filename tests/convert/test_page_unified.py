"""SGLang's page-unified pool in ``kv.convert``: K and V in (a pair), one pool out, and back; MLA one tensor each
way. Checked byte for byte against a per-token loop over the pool's definition and ``kvnumba.reference.copy``
(the views' NumPy pictures); the kernel engine against the NumPy engine (simulator or GPU)."""
import itertools

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import device, to_numpy

L, T, H, D, P = 2, 8, 4, 4, 4  # uint16: 8-byte heads, so the kernels may go head by head
WHOLE = ["layer_first", "page_first", "page_first_direct", "page_head"]


def _kv(seed=0, heads=H, dtype=np.uint16):
    """A layer_first K and V ``(L, T, heads, D)`` with distinct values."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 2**15, (L, T, heads, D)).astype(dtype)
    return k, (k.astype(np.int64) + 2**15).astype(dtype)


def _pool_by_loop(k, v, page_size, groups):
    """The pool ``[T/P, G, L, 2, P, H/G, D]`` by its definition: token t, layer l, head h of K (0) or V (1)."""
    layers, tokens, heads, dim = k.shape
    per = heads // groups
    pool = np.zeros((tokens // page_size, groups, layers, 2, page_size, per, dim), k.dtype)
    for l, t, h in itertools.product(range(layers), range(tokens), range(heads)):
        for kind, x in enumerate((k, v)):
            pool[t // page_size, h // per, l, kind, t % page_size, h % per] = x[l, t, h]
    return pool


def _tokens():
    return np.arange(T, dtype=np.int64)


@pytest.mark.parametrize("groups", [1, 2])
def test_pair_to_pool_is_sglangs_byte_order(groups):
    k, v = _kv()
    pool = kv.convert((k, v), "layer_first", "page_unified", page_size=P, head_groups=groups)
    want = _pool_by_loop(k, v, P, groups)
    assert pool.shape == (T // P, groups, L, 2, P, H // groups, D) and pool.dtype == k.dtype
    np.testing.assert_array_equal(pool, want)
    oracle = np.zeros_like(want)  # kvnumba.reference.copy, from the views' pictures
    reference.copy(kv.LayerFirst(k, v), kv.PageUnified(oracle), _tokens(), _tokens())
    assert pool.tobytes() == oracle.tobytes()


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dst", WHOLE)
def test_pool_to_pair_in_every_layout(dst, groups):
    rng = np.random.default_rng(groups)
    pool = rng.integers(0, 2**16, (T // P, groups, L, 2, P, H // groups, D)).astype(np.uint16)
    k_lf, v_lf = np.zeros((L, T, H, D), np.uint16), np.zeros((L, T, H, D), np.uint16)
    reference.copy(kv.PageUnified(pool), kv.LayerFirst(k_lf, v_lf), _tokens(), _tokens())
    got = kv.convert(pool, "pu", dst, page_size=P)
    assert isinstance(got, tuple) and len(got) == 2
    for mine, lf in zip(got, (k_lf, v_lf)):
        np.testing.assert_array_equal(mine, kv.convert(lf, "lf", dst, P))


@pytest.mark.parametrize("groups", [1, 2])
def test_round_trips(groups):
    k, v = _kv(seed=3)
    pool = kv.convert((k, v), "lf", "pu", P, head_groups=groups)
    back = kv.convert(pool, "pu", "lf", P)
    np.testing.assert_array_equal(back[0], k)
    np.testing.assert_array_equal(back[1], v)
    k_pf, v_pf = kv.convert(k, "lf", "pf"), kv.convert(v, "lf", "pf")  # pf -> pu -> ph
    pool = kv.convert([k_pf, v_pf], kv.PageFirst, kv.PageUnified, P, head_groups=groups)  # a list, the classes
    k_ph, v_ph = kv.convert(pool, "pu", "ph", P)
    np.testing.assert_array_equal(k_ph, kv.convert(k, "lf", "ph", P))
    np.testing.assert_array_equal(v_ph, kv.convert(v, "lf", "ph", P))


def test_pool_to_pool_regroups_heads():
    k, v = _kv(seed=5)
    one = kv.convert((k, v), "lf", "pu", P)
    two = kv.convert(one, "pu", "pu", P, head_groups=2)
    np.testing.assert_array_equal(two, _pool_by_loop(k, v, P, 2))
    np.testing.assert_array_equal(kv.convert(two, "pu", "pu", P), one)  # default: one group


@pytest.mark.parametrize("item", [(6,), (1, 6)], ids=["D", "1xD"])
def test_mla_one_tensor_each_way(item):
    rng = np.random.default_rng(7)
    c = rng.integers(0, 2**16, (L, T, *item)).astype(np.uint16)
    pool = kv.convert(c, "lf", "pu", P)
    assert pool.shape == (T // P, L, P, 6)
    np.testing.assert_array_equal(pool.reshape(-1), kv.convert(c, "lf", "pfd", P).reshape(-1))  # pfd's bytes
    oracle = np.zeros_like(pool)
    reference.copy(kv.LayerFirst(c.reshape(L, T, 6)), kv.PageUnified(oracle), _tokens(), _tokens())
    np.testing.assert_array_equal(pool, oracle)
    back = kv.convert(pool, "pu", "lf", P)
    assert not isinstance(back, tuple) and back.shape == (L, T, 6)
    np.testing.assert_array_equal(back, c.reshape(L, T, 6))


def test_a_pair_of_single_head_items_is_an_mha_pool():
    k, v = _kv(heads=1)
    pool = kv.convert((k[:, :, 0], v[:, :, 0]), "lf", "pu", P)  # items (D,): one head
    np.testing.assert_array_equal(pool, _pool_by_loop(k, v, P, 1))


K4 = np.zeros((L, T, H, D), np.uint16)


@pytest.mark.parametrize("call,error,match", [
    (lambda: kv.convert((K4, K4), "lf", "pu", P, head_groups=3), ValueError,
     r"^head_groups=3 does not divide the H=4 heads"),
    (lambda: kv.convert((K4, K4), "lf", "pu", P, head_groups=0), ValueError, r"head_groups must be >= 1, got 0"),
    (lambda: kv.convert(K4, "lf", "pf", head_groups=2), ValueError, r"^head_groups applies to dst='page_unified'"),
    (lambda: kv.convert(K4[:, :, 0], "lf", "pu", P, head_groups=2), ValueError,
     r"^head_groups=2: an MLA pool \[T/P, L, P, D\] has no head groups"),
    (lambda: kv.convert(K4, "lf", "pu", P), ValueError,
     r"^array: one tensor makes an MLA pool, of items \(D,\) or \(1, D\); items \(4, 4\)"),
    (lambda: kv.convert((K4, K4[:1]), "lf", "pu", P), ValueError,
     r"^array: K and V must have one shape, got \(2, 8, 4, 4\) and \(1, 8, 4, 4\)"),
    (lambda: kv.convert((K4, K4, K4), "lf", "pu", P), ValueError, r"^array: a tuple of 3 arrays"),
    (lambda: kv.convert((K4, K4.astype(np.int16)), "lf", "pu", P), TypeError,
     r"^array: K and V must have one dtype, got uint16 and int16"),
    (lambda: kv.convert((K4, K4), "lf", "pu"), ValueError, r"^page_unified needs page_size"),
    (lambda: kv.convert((K4[:, :6], K4[:, :6]), "lf", "pu", P), ValueError,
     r"^page_unified needs T divisible by page_size=4: got T=6"),
    (lambda: kv.convert(np.zeros((2, 1, L, 2, P, H)), "pu", "lf", P), ValueError,
     r"^PageUnified: the buffer is \[T/P, G, L, 2, P, H/G, D\]"),
    (lambda: kv.convert(np.zeros((2, 1, L, 3, P, H, D)), "pu", "lf", P), ValueError, r"^PageUnified: the buffer is"),
    (lambda: kv.convert(np.zeros((2, 1, L, 2, P, H, D)), "pu", "lf", 2), ValueError,
     r"^page_unified: its page size is 4 \(shape \(2, 1, 2, 2, 4, 4, 4\)\), page_size=2 was given"),
    (lambda: kv.convert((K4, K4), "pu", "lf", P), ValueError, r"^array: src='page_unified' reads one pool"),
])
def test_bad_input_is_refused_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_converted_shape_points_to_convert():
    from kvnumba.convert import converted_shape

    with pytest.raises(ValueError, match=r"^dst: page_unified holds K and V in one array"):
        converted_shape((L, T, H, D), "lf", "pu", P)


# --- the kernel engine: kv.copy between the views, against the NumPy engine -----------------------------

@pytest.mark.needs_target
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("other", ["layer_first", "page_head"])
def test_kernels_match_numpy(other, groups):
    """To and from a pool on the kernels; page_head with 1 < G < H goes through a layer-first pair."""
    k, v = (kv.convert(x, "lf", other, P) for x in _kv(seed=groups))
    want = kv.convert((k, v), other, "pu", P, head_groups=groups, engine="numpy")
    pool = kv.convert((device(k), device(v)), other, "pu", P, head_groups=groups, engine="kernels", block_quota=2,
                      num_warps_per_block=1)
    np.testing.assert_array_equal(to_numpy(pool), want)
    back = kv.convert(device(want), "pu", other, P, engine="kernels", block_quota=2, num_warps_per_block=1)
    np.testing.assert_array_equal(to_numpy(back[0]), k)
    np.testing.assert_array_equal(to_numpy(back[1]), v)


@pytest.mark.needs_target
def test_kernels_mla():
    c = np.random.default_rng(9).integers(0, 2**16, (L, T, 4)).astype(np.uint16)
    pool = kv.convert(device(c), "lf", "pu", P, engine="kernels")
    np.testing.assert_array_equal(to_numpy(pool), kv.convert(c, "lf", "pu", P, engine="numpy"))
    np.testing.assert_array_equal(to_numpy(kv.convert(pool, "pu", "pf", P, engine="kernels")), c.swapaxes(0, 1))
