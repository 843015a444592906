"""The seed's own checks, as clear TypeError/ValueError naming the argument; nothing written on error."""
import numpy as np
import pytest

import kvnumba
import kvnumba as kv
from tests.helpers.placement import device, to_numpy

pytestmark = pytest.mark.needs_target

ITEM = 16


def _per_layer_args(**override):
    src = np.arange(8 * ITEM, dtype=np.uint8).reshape(8, ITEM)
    args = dict(src_k=device(src), dst_k=device(np.zeros_like(src)), src_v=device(src), dst_v=device(np.zeros_like(src)),
                src_indices=device(np.array([1, 2], np.int64)), dst_indices=device(np.array([3, 4], np.int64)),
                item_size=ITEM)
    args.update(override)
    return args


@pytest.mark.parametrize("override,error,match", [
    (dict(item_size=12), ValueError, r"item_size must be a multiple of 8 bytes, got 12"),
    (dict(item_size=0), ValueError, r"item_size must be >= 1, got 0"),
    (dict(item_size=16.0), TypeError, r"item_size must be an integer, got float"),
    (dict(src_indices=np.array([1, 2], np.int32)), TypeError, r"src_indices must hold int64 token indices, got dtype int32"),
    (dict(dst_indices=np.array([1, 2, 3], np.int64)), ValueError, r"same length, got 2 and 3"),
    (dict(dst_indices=np.array([[1, 2]], np.int64)), ValueError, r"dst_indices must be one-dimensional"),
    (dict(src_k=[1, 2, 3]), TypeError, r"src_k must be an array"),
    (dict(block_quota=0), ValueError, r"block_quota must be >= 1, got 0"),
    (dict(num_warps_per_block=33), ValueError, r"num_warps_per_block must be <= 32, got 33"),
])
def test_per_layer_rejects(override, error, match):
    args = _per_layer_args(**override)
    with pytest.raises(error, match=match):
        kvnumba.transfer_kv_per_layer(**args)
    assert not to_numpy(args["dst_k"]).any() and not to_numpy(args["dst_v"]).any()


def test_table_length_must_match_num_layers():
    layers = [device(np.zeros((4, ITEM), np.uint8)) for _ in range(3)]
    table = kvnumba.layer_table(layers)
    idx = device(np.array([0], np.int64))
    with pytest.raises(ValueError, match=r"src_k_layers must hold num_layers=2 addresses, got shape \(3,\)"):
        kvnumba.transfer_kv_all_layer(table, table, table, table, idx, idx, ITEM, 2)


def test_table_must_be_uint64():
    table = device(np.zeros(2, np.float64))
    idx = device(np.array([0], np.int64))
    with pytest.raises(TypeError, match=r"src_layers must be a uint64 table"):
        kvnumba.transfer_kv_all_layer_mla(table, table, idx, idx, ITEM, 2)


def test_page_head_item_must_split_into_8_byte_heads():
    args = _per_layer_args(item_size=24)
    with pytest.raises(ValueError, match=r"item_size / head_num must be a multiple of 8 bytes, got 24 / 2 = 12"):
        kvnumba.transfer_kv_per_layer_ph_lf(args["src_k"], args["dst_k"], args["src_v"], args["dst_v"],
                                            args["src_indices"], args["dst_indices"], 0, 24, 24, 1, 2)


def test_layer_table_rejects_empty_and_non_sequences():
    with pytest.raises(ValueError, match="at least one buffer"):
        kvnumba.layer_table([])
    with pytest.raises(TypeError, match="layers must be a sequence of arrays"):
        kvnumba.layer_table(5)
    with pytest.raises(TypeError, match=r"layers\[1\] must be an array"):
        kvnumba.layer_table([device(np.zeros(8, np.uint8)), "nope"])


def test_layout_names_fail_early():
    from kvnumba.layouts import view_class

    assert view_class("pf") is view_class("page_first") is view_class(kvnumba.PageFirst) is kvnumba.PageFirst
    with pytest.raises(ValueError, match=r"^src: unknown layout 'pg'"):
        view_class("pg", "src")
    with pytest.raises(ValueError, match=r"^src: unknown layout 3"):
        view_class(3, "src")


def test_unknown_stream_object():
    with pytest.raises(TypeError, match="stream must be a CUDA stream"):
        kvnumba.transfer_kv_per_layer(**_per_layer_args(), stream="fast")


EMPTY_VIEWS = {
    "LayerFirst, 0 layers": (lambda: kv.LayerFirst(np.zeros((0, 8, 2, 8), np.int16)), "k holds 0 layers"),
    "LayerFirst, 0 tokens": (lambda: kv.LayerFirst(np.zeros((2, 0, 2, 8), np.int16)), "k holds 0 tokens"),
    "LayerFirst, empty items": (lambda: kv.LayerFirst(np.zeros((2, 8, 2, 0), np.int16)), "k holds 0 item bytes"),
    "LayerFirst list, 0 tokens": (lambda: kv.LayerFirst([np.zeros((0, 16), np.int16)] * 2), "k holds 0 tokens"),
    "PageFirst, 0 tokens": (lambda: kv.PageFirst(np.zeros((0, 2, 16), np.int16)), "k holds 0 tokens"),
    "PageFirst, 0 layers": (lambda: kv.PageFirst(np.zeros((8, 0, 16), np.int16)), "k holds 0 layers"),
    "PageFirstDirect, 0 pages": (lambda: kv.PageFirstDirect(np.zeros((0, 2, 4, 16), np.int16)), "k holds 0 tokens"),
    "PageHead, 0 layers": (lambda: kv.PageHead(np.zeros((2, 2, 4, 0, 8), np.int16)), "k holds 0 layers"),
    "VllmFlashAttn, 0 blocks": (lambda: kv.VllmFlashAttn([np.zeros((2, 0, 4, 2, 8), np.int16)]),
                                "caches holds 0 tokens"),
}


@pytest.mark.parametrize("case", list(EMPTY_VIEWS))
def test_an_empty_view_is_refused_when_built(case):
    make, message = EMPTY_VIEWS[case]
    with pytest.raises(ValueError, match=message):
        make()
