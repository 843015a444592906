"""Every inner-loop shape (kvnumba.kernels.warp_copy.CopyShape) is correct, not only the ones tuned in.

The tuning table picks one shape per kernel; the others must stay correct so the table can change.
"""
import itertools

import pytest

from tests.helpers.cases import Case, run_case
from kvnumba.kernels.warp_copy import CopyShape

pytestmark = pytest.mark.needs_target

SHAPES = [CopyShape(words, wide, paired) for words, wide, paired in itertools.product((1, 2, 4), (False, True), (False, True))]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op,item_size", [("transfer_kv_per_layer_pf_lf", 1152), ("transfer_kv_all_layer_lf_ph", 96),
                                          ("transfer_kv_per_layer_mla", 40)])
def test_shape_matches_reference(forced_copy_shape, shape, op, item_size):
    forced_copy_shape(shape)
    heads = 2 if "ph" in op else 1
    run_case(Case(op, item_size=item_size, head_num=heads, page_size=2, count=6, num_warps_per_block=1))
