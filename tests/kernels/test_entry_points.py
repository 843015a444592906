"""Every entry point against the NumPy reference, poisoned destinations, over the edges.

Runs on the simulator (CI) and on a real GPU with the same cases.
"""
import pytest

from tests.helpers.cases import ENTRY_POINTS, Case, run_case

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset

OPS = list(ENTRY_POINTS)
HEADED = [op for op in OPS if "ph" in op]
DIRECTIONS = [("device", "device"), ("host", "device"), ("device", "host")]


@pytest.mark.parametrize("src_place,dst_place", DIRECTIONS, ids=["d2d", "h2d", "d2h"])
@pytest.mark.parametrize("op", OPS)
def test_directions(op, src_place, dst_place):
    run_case(Case(op, src_place=src_place, dst_place=dst_place, head_num=2 if op in HEADED else 1, page_size=4))


# item sizes: the smallest, odd multiples of 8 (8-byte path), 16-byte multiples, MLA's 1152, a 2 KiB MHA item.
@pytest.mark.parametrize("item_size,dtype", [(8, "int8"), (24, "fp32"), (40, "bf16"), (96, "fp16"),
                                             (1152, "bf16"), (2048, "fp16")])
@pytest.mark.parametrize("op", OPS)
def test_item_sizes_and_dtypes(op, item_size, dtype):
    heads = 1 if op not in HEADED else (2 if item_size % 16 == 0 else 1)
    run_case(Case(op, item_size=item_size, dtype=dtype, head_num=heads, page_size=2, count=6, num_layers=2))


@pytest.mark.parametrize("count", [1, 2, 33])
@pytest.mark.parametrize("op", OPS)
def test_token_counts(op, count):
    # 33 tokens over 2 blocks of 1 warp: 17 items per warp, the last warp's share ragged.
    run_case(Case(op, count=count, pool=64, num_warps_per_block=1, block_quota=2))


@pytest.mark.parametrize("page_size", [1, 2, 16, 64])
@pytest.mark.parametrize("op", OPS)
def test_paged_indices(op, page_size):
    run_case(Case(op, page_size=page_size, pool=128, count=page_size * 2, paged=True, item_size=16,
                  head_num=2 if op in HEADED else 1))


@pytest.mark.parametrize("head_num", [1, 2, 4, 8])
@pytest.mark.parametrize("op", HEADED)
def test_page_head_heads(op, head_num):
    run_case(Case(op, head_num=head_num, item_size=8 * head_num * 3, page_size=8, pool=32, count=8, num_layers=3))


@pytest.mark.parametrize("op", OPS)
def test_seed_default_launch_shape(op):
    # block_quota=2, 32 warps: the seed's defaults, 2048 simulated threads.
    run_case(Case(op, block_quota=2, num_warps_per_block=32, count=70, pool=96))


@pytest.mark.parametrize("op", ["transfer_kv_per_layer", "transfer_kv_all_layer_lf_pf", "transfer_kv_per_layer_ph_lf"])
def test_last_page_and_big_pool(op):
    # The last token slots of a large pool: addresses far from the base, the very last page.
    case = Case(op, pool=4096, count=16, page_size=16, paged=False, item_size=16, num_layers=2)
    case.seed = 7
    run_case(case)
    tail = Case(op, pool=4096, count=16, page_size=16, paged=True, item_size=16, seed=3)
    run_case(tail)


@pytest.mark.parametrize("op", OPS)
def test_no_tokens_is_a_no_op(op):
    run_case(Case(op, count=0))


def test_layer_id_is_last_layer():
    run_case(Case("transfer_kv_per_layer_pf_lf", num_layers=5, layer_id=4))
    run_case(Case("transfer_kv_per_layer_ph_lf", num_layers=5, layer_id=4, head_num=2, page_size=4))


@pytest.mark.gpu  # torch tensors on a GPU: the fast per-call path
@pytest.mark.parametrize("src_place,dst_place", DIRECTIONS, ids=["d2d", "h2d", "d2h"])
@pytest.mark.parametrize("op", OPS)
def test_torch_tensors_take_the_fast_path(op, src_place, dst_place):
    pytest.importorskip("torch")
    for count, seed in ((1, 0), (33, 1), (64, 2)):  # one item, a ragged last warp, whole pages
        run_case(Case(op, src_place=src_place, dst_place=dst_place, head_num=2 if op in HEADED else 1, page_size=4,
                      count=count, pool=96, seed=seed, block_quota=2, num_warps_per_block=2), framework="torch")
