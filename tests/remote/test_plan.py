"""kvnumba.remote's planning, without NIXL: the byte ranges of each side, their merging, the route, and
the export format. Pure host arithmetic on views over NumPy arrays (no transfer, no kernel)."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.remote import export, plan
from kvnumba.remote.plan import plan_copy
from kvnumba.remote import sides
from tests.helpers.remote_support import SHAPE, views
from tests.helpers.view_cases import LAYOUTS, KV_ONLY

pytestmark = pytest.mark.smoke  # in the one-minute subset

L, T, P, H, D = 4, 64, 8, 2, 4
ITEM = H * D * 2  # uint16


def zeros(shape):
    return np.zeros(shape, np.uint16)


def page_first():
    return kv.PageFirst(zeros((T, L, H, D)), zeros((T, L, H, D)))


def vllm():
    return kv.VllmFlashAttn([zeros((2, T // P, P, H, D)) for _ in range(L)])


def test_merge_joins_only_ranges_contiguous_on_both_sides_in_one_buffer():
    a = np.array([0, 8, 16, 40, 48], np.int64)
    b = np.array([100, 108, 200, 208, 216], np.int64)
    length = np.full(5, 8, np.int64)
    buffers = np.array([0, 0, 0, 0, 1], np.int64)
    got = plan.merge(a, b, length, buffers, np.zeros(5, np.int64))
    assert [x.tolist() for x in got[:3]] == [[0, 16, 40, 48], [100, 200, 208, 216], [16, 8, 8, 8]]


def test_merge_sorts_by_the_first_side():
    a = np.array([16, 0, 8], np.int64)
    b = np.array([32, 0, 16], np.int64)
    starts, others, lengths, _, _ = plan.merge(a, b, np.array([8, 8, 8]), np.zeros(3, np.int64), np.zeros(3, np.int64))
    assert (starts.tolist(), others.tolist(), lengths.tolist()) == ([0, 8, 16], [0, 16, 32], [8, 8, 8])


def test_side_addresses_are_the_views_numpy_picture():
    """Every item's address from the layout arithmetic is where the view's ``logical`` picture keeps it."""
    for name in LAYOUTS:
        mla = False
        _, view = views(name, 0, False, mla)
        side = sides.of_view(view, "view")
        heads = side.geometry.heads if side.head_split else 1
        tokens = np.arange(side.geometry.tokens)
        layers = np.arange(side.geometry.layers)
        address = side.addresses(tokens, layers, side.geometry.item_bytes, heads)
        for k, which in enumerate(("k", "v")):
            for layer in layers:
                items = view.layer_items(which, int(layer))  # [T/P, P, H, D], a view of the buffer
                page = items.shape[1]
                for t in (0, 5, side.geometry.tokens - 1):
                    for h in range(heads):
                        head = items[t // page, t % page, h]
                        assert address[k, layer, t, h] == head.__array_interface__["data"][0], (name, which, layer, t, h)


def test_page_first_to_vllm_direct_is_per_token_per_layer_staged_per_run():
    tokens = np.arange(16, 48)  # two whole pages of 8... four pages: a request's contiguous tokens
    got = plan_copy(page_first(), vllm(), tokens, tokens, remote="src", route="direct")
    assert got.descriptors == 32 * L * 2 and got.smallest == got.largest == ITEM
    got = plan_copy(page_first(), vllm(), tokens, tokens, remote="src")
    assert got.route == "staged" and got.descriptors == 2  # one run of 32 tokens x all layers, K and V
    assert got.smallest == got.largest == 32 * L * ITEM and got.bytes == 32 * L * 2 * ITEM


def test_vllm_pages_merge_per_layer_when_blocks_are_consecutive():
    tokens = np.arange(16, 48)
    got = plan_copy(vllm(), vllm(), tokens, tokens, remote="src")
    assert got.route == "direct" and got.descriptors == L * 2  # one run of 4 blocks per layer, K and V
    scattered_pages = np.concatenate([np.arange(p * P, p * P + P) for p in (1, 5, 3, 7)])
    got = plan_copy(vllm(), vllm(), scattered_pages, scattered_pages, remote="src")
    assert got.descriptors == 4 * L * 2 and got.smallest == got.largest == P * ITEM  # per page per layer


def test_layer_window():
    tokens = np.arange(8)
    one = plan_copy(page_first(), vllm(), tokens, tokens, layers=2, route="direct")
    assert one.descriptors == 8 * 2 and one.bytes == 8 * 2 * ITEM
    some = plan_copy(vllm(), vllm(), tokens, tokens, layers=range(1, 3))
    assert some.descriptors == 2 * 2 and some.bytes == 8 * 2 * 2 * ITEM


def test_choose():
    assert plan.choose("auto", 100, 50) == "staged"
    assert plan.choose("auto", 100, 51) == "direct"
    assert plan.choose("auto", 100, None) == "direct"
    assert plan.choose("direct", 100, 1) == "direct"
    assert plan.choose("staged", 1, 100) == "staged"


def test_staging_tokens_keep_positions_within_pages():
    side = sides.of_view(vllm(), "v")
    tokens = np.array([41, 3, 40, 17, 2], np.int64)
    mapped, pages = plan.staging_tokens(side, tokens)
    assert pages == 3 and mapped.tolist() == [2 * P + 1, 3, 2 * P, P + 1, 2]


@pytest.mark.parametrize("bad,error,match", [
    (dict(route="fast"), ValueError, "route must be one of auto, direct, staged, got 'fast'"),
    (dict(layers=4), ValueError, r"layers=4 is out of range for views of 4 layers"),
    (dict(layers=range(0, 4, 2)), ValueError, "non-empty range with step 1"),
    (dict(layers="all"), TypeError, "layers must be None, an int or a range"),
    (dict(src_indices=np.array([0, T])), kv.IndexOutOfRangeError,
     r"src_indices\[1\] = 64 is out of range for the tokens of src \(PageFirst, 64 tokens\)"),
    (dict(dst_indices=np.array([-1, 0])), kv.IndexOutOfRangeError, r"dst_indices\[0\] = -1"),
])
def test_bad_arguments_are_named(bad, error, match):
    args = dict(src_indices=np.array([0, 1]), dst_indices=np.array([0, 1]))
    args.update(bad)
    with pytest.raises(error, match=match):
        plan_copy(page_first(), vllm(), **args)


def test_views_that_do_not_fit():
    mla = kv.PageFirst(zeros((T, L, 1, D)))
    with pytest.raises(ValueError, match="src is MLA"):
        plan_copy(mla, page_first(), np.arange(2), np.arange(2))
    wide = kv.PageFirst(zeros((T, L, H, 2 * D)), zeros((T, L, H, 2 * D)))
    with pytest.raises(ValueError, match="the views' items differ: src 32 bytes, dst 16 bytes"):
        plan_copy(wide, page_first(), np.arange(2), np.arange(2))
    floats = kv.PageFirst(np.zeros((T, L, H, D), np.float16), np.zeros((T, L, H, D), np.float16))
    with pytest.raises(TypeError, match="dtypes differ"):
        plan_copy(floats, page_first(), np.arange(2), np.arange(2))
    with pytest.raises(TypeError, match="LayerTable holds raw addresses|kv.LayerTable"):
        plan_copy(kv.LayerTable(np.zeros(L, np.uint64), tokens=T, item_size=ITEM), page_first(), [0], [0])


def test_every_layout_pair_plans_each_item_once():
    """Whatever the route, the planned bytes are every item of the copy exactly once."""
    shape = SHAPE
    item = shape["H"] * shape["D"] * 2
    tokens = np.arange(3, 19)
    for s in LAYOUTS:
        for d in LAYOUTS:
            _, src = views(s, 0, False)
            _, dst = views(d, 1, True)
            for route in ("direct", "auto"):
                got = plan_copy(src, dst, tokens, tokens[::-1].copy(), route=route)
                assert got.bytes == tokens.size * shape["L"] * 2 * item, (s, d, route)
                assert got.descriptors <= tokens.size * shape["L"] * 2 * shape["H"]


def test_export_round_trip_and_damage():
    header = {"agent": "a", "n": 1}
    text = export.header_text(header)
    data = export.encode(text, [b"one", b"two"])
    assert export.decode(data) == (header, text, [b"one", b"two"])
    with pytest.raises(kv.ExportError, match="exported is damaged: its checksum does not match"):
        export.decode(data[:-1])
    flipped = bytearray(data)
    flipped[len(export.MAGIC) + 10] ^= 1
    with pytest.raises(kv.ExportError, match="damaged"):
        export.decode(bytes(flipped))
    with pytest.raises(kv.ExportError, match="exported is not a kvnumba export"):
        export.decode(b"\x00" * 100)
    with pytest.raises(TypeError, match="exported must be the bytes Agent.export returned, got str"):
        export.decode("text")
    import hashlib
    import struct

    future = bytearray(data[:-32])
    struct.pack_into("<H", future, len(export.MAGIC), 3)
    future = bytes(future) + hashlib.sha256(bytes(future)).digest()
    with pytest.raises(kv.ExportError, match="export format version 3; this kvnumba reads version 2"):
        export.decode(future)


def test_mla_and_kv_only_layouts_are_known():
    assert KV_ONLY <= set(LAYOUTS)


def _script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "remote_descriptors.py"
    spec = importlib.util.spec_from_file_location("remote_descriptors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_descriptor_table_script_quick(capsys):
    """scripts/remote_descriptors.py --quick: the baselines and one row per layout pair, each at most per
    page per layer (4 layers x K/V x 16 pages = 128) and never more than the direct route."""
    _script().main(["--quick"])
    out = capsys.readouterr().out
    assert "| vLLM NixlConnector: one per (layer, K/V, block) | 128 x 1 KiB | 128 x 1 KiB |" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.count(" | ") == 7 and "x" in line.split(" | ")[2]]
    assert len(rows) == 8 * 8
    for row in rows:
        for kvnumba_cell, direct in ((row[2], row[3]), (row[5], row[6])):
            count = int(kvnumba_cell.split(" x ")[0])
            assert count <= 128 and count <= int(direct), row
