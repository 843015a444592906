"""Property test: random layouts, sizes and indices, kvnumba against the reference."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cases import ENTRY_POINTS, Case, run_case

pytestmark = pytest.mark.needs_target


@st.composite
def cases(draw):
    op = draw(st.sampled_from(list(ENTRY_POINTS)))
    headed = "ph" in op
    head_num = draw(st.sampled_from([1, 2, 4])) if headed else 1
    item_size = 8 * head_num * draw(st.integers(1, 12))
    page_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    pages = draw(st.integers(1, 6))
    pool = page_size * pages * 2
    paged = draw(st.booleans())
    count = page_size * draw(st.integers(0, pages)) if paged else draw(st.integers(0, pool))
    return Case(
        op,
        item_size=item_size,
        num_layers=draw(st.integers(1, 4)),
        page_size=page_size,
        head_num=head_num,
        pool=pool,
        count=count,
        paged=paged,
        dtype=draw(st.sampled_from(["fp16", "bf16", "fp32", "int8"])),
        block_quota=draw(st.integers(1, 3)),
        num_warps_per_block=draw(st.integers(1, 3)),
        src_place=draw(st.sampled_from(["device", "host"])),
        dst_place=draw(st.sampled_from(["device", "host"])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_cases_match_reference(case):
    run_case(case)
