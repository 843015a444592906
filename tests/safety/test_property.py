"""Property: any argument set, valid or not, either matches ``kvnumba.reference`` byte for byte or
raises TypeError/ValueError with every destination byte untouched; valid sets never raise."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvnumba.checks import guard
from tests.helpers.placement import host
from tests.helpers.safety_cases import OPS, build

pytestmark = pytest.mark.needs_target

# Scalar arguments a corruption may replace, and values to draw for them (valid ones included).
SCALARS = {
    "item_size": st.sampled_from([-8, 0, 4, 8, 12, 16, 24, 32, 64, 2**40]),
    "layer_id": st.integers(-2, 4),
    "src_layout_dim": st.sampled_from([-16, 0, 8, 16, 24, 32, 36, 48, 64, 512]),
    "dst_layout_dim": st.sampled_from([-16, 0, 8, 16, 24, 32, 36, 48, 64, 512]),
    "num_layers": st.integers(-1, 4),
    "page_size": st.integers(-1, 5),
    "head_num": st.integers(-1, 5),
    "block_quota": st.integers(-1, 2),
    "num_warps_per_block": st.integers(-1, 2),
}


@st.composite
def calls(draw):
    op = draw(st.sampled_from(OPS))
    headed = "ph" in op
    call = build(op, item_size=16 * draw(st.integers(1, 2)), num_layers=2, pool=8,
                 page_size=draw(st.sampled_from([1, 2, 4])) if headed else 1, head_num=2,
                 count=draw(st.integers(0, 8)), seed=draw(st.integers(0, 2**16)), idx_place="host",
                 src_place=draw(st.sampled_from(["device", "host"])),
                 dst_place=draw(st.sampled_from(["device", "host"])),
                 block_quota=draw(st.integers(1, 2)), num_warps_per_block=draw(st.integers(1, 2)), layer_id=1)
    kind = draw(st.sampled_from(["none", "scalar", "index", "index_dtype"]))
    override, ref_override = {}, {}
    if kind == "scalar":
        name = draw(st.sampled_from([n for n in SCALARS if n in call.kwargs]))
        override[name] = ref_override[name] = draw(SCALARS[name])
    elif kind in ("index", "index_dtype") and call.case.count:
        side = draw(st.sampled_from(["src_indices", "dst_indices"]))
        values = call.ref_kwargs[side].copy()
        position = draw(st.integers(0, len(values) - 1))
        others = set(np.delete(values, position).tolist()) if side == "dst_indices" else set()
        # Two items writing one destination slot race on a GPU (either may land, as in the seed):
        # corrupt a destination index only into a slot no other item writes.
        values[position] = draw(st.integers(-3, 20).filter(lambda v: v not in others))
        if kind == "index_dtype":
            values = values.astype(draw(st.sampled_from([np.int32, np.uint64, np.float64])))
        override[side], ref_override[side] = host(values), values
    return call, override, ref_override, kind


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_any_arguments_match_reference_or_raise_untouched(example):
    call, override, ref_override, kind = example
    guard.clear()
    try:
        call.run(**override)
    except (TypeError, ValueError):
        assert kind != "none", "a valid call raised"
        assert call.untouched(), "a rejected call wrote to a destination"
        return
    if call.case.count == 0:  # nothing to move (the reference would still build byte ranges of item_size)
        assert call.untouched()
        return
    call.run_reference(**ref_override)
    assert call.matches_reference()
    assert not guard.flag_set()
