"""``bounds.first_outside``, the host index check's answer: the compiled pass (int64 values) and the vectorised
one (anything else) give the same position, the first value outside ``[low, high)``, or None."""
import numpy as np
import pytest

from kvnumba.checks import bounds

CASES = [
    ([3, 5, -1, 9], 0, 10, 2),
    ([3, 5, -1, 9], -1, 10, None),
    ([3, 5, -1, 9], 0, 9, 2),
    ([3, 12, -1, 9], 0, 10, 1),
    ([], 0, 1, None),
    ([0, 2**63 - 1], 0, 2**64, None),  # a bound past int64: the vectorised pass
    ([7, 2**63 - 1], 0, 2**63 - 1, 1),
]


@pytest.mark.parametrize("values, low, high, expected, dtype", [
    (*case, dtype) for case in CASES for dtype in (np.int64, np.uint64, np.int32)
    if all(np.can_cast(np.min_scalar_type(v), dtype) for v in case[0])])  # values the dtype holds
def test_first_outside_agrees_for_every_dtype(values, low, high, expected, dtype):
    assert bounds.first_outside(np.array(values, dtype=dtype), low, high) == expected


def test_first_outside_of_a_strided_view():
    values = np.array([1, 99, 2, 98, 300], np.int64)
    assert bounds.first_outside(values[::2], 0, 100) == 2 and bounds.first_outside(values[1::2], 0, 100) is None
