"""The oracle itself, checked against plain NumPy indexing of the layouts' shapes (no offsets)."""
import numpy as np

from kvnumba import reference

rng = np.random.default_rng(1)


def test_page_first_is_token_layer_item():
    T, L, item = 12, 3, 16
    src = rng.integers(0, 256, (T, L, item), dtype=np.uint8)
    dst_k = np.zeros((T, item), np.uint8)
    dst_v = np.zeros((T, item), np.uint8)
    si, di = np.array([5, 0, 11], np.int64), np.array([1, 2, 3], np.int64)
    reference.transfer_kv_per_layer_pf_lf(src, dst_k, src, dst_v, si, di, 2, item, L * item)
    np.testing.assert_array_equal(dst_k[di], src[si, 2])
    assert not dst_k[[0, 4]].any()


def test_page_head_is_page_head_slot_layer_headdim():
    P, H, L, hd, pages = 4, 2, 3, 8, 3
    T, item = P * pages, H * hd
    src = rng.integers(0, 256, (pages, H, P, L, hd), dtype=np.uint8)
    dst = np.zeros((T, H, hd), np.uint8)
    si, di = np.array([0, 5, 11], np.int64), np.array([7, 3, 0], np.int64)
    reference.transfer_kv_per_layer_ph_lf(src, dst, src, dst.copy(), si, di, 1, item, L * item, P, H)
    for s, d in zip(si, di):
        np.testing.assert_array_equal(dst[d], src[s // P, :, s % P, 1])


def test_layer_first_to_page_head_round_trip():
    P, H, L, hd, pages = 2, 4, 2, 8, 2
    T, item = P * pages, H * hd
    layers_k = [rng.integers(0, 256, (T, H, hd), dtype=np.uint8) for _ in range(L)]
    ph = np.zeros((pages, H, P, L, hd), np.uint8)
    idx = np.arange(T, dtype=np.int64)
    reference.transfer_kv_all_layer_lf_ph(layers_k, ph, layers_k, ph.copy(), idx, idx, item, L * item, L, P, H)
    for layer in range(L):
        for t in range(T):
            np.testing.assert_array_equal(ph[t // P, :, t % P, layer], layers_k[layer][t])
