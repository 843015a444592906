"""``direct_fill.token_parts``: the copy engine's token offsets by a loop compiled for the host equal the layout's
own function evaluated with NumPy (``sides.elementwise``), for every built-in layout; a function Numba cannot
compile answers None, and the caller's NumPy evaluation stands."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.kernels.layouts import PARTS
from kvnumba.plan import direct_fill
from kvnumba.plan.sides import elementwise

FUNCTIONS = {**{f"{layout.value}": parts.py[1] for layout, parts in PARTS.items()},
             "page_first_direct": kv.PageFirstDirect.token_offset,
             "page_unified_g2": kv.PageUnified.arithmetic(2, 2).py[1]}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("layout_dim, item_size, heads, page_size", [(4096, 512, 4, 16), (98304, 2048, 8, 64)])
def test_compiled_token_parts_equal_numpy(name, layout_dim, item_size, heads, page_size):
    function = FUNCTIONS[name]
    tokens = np.random.default_rng(7).integers(0, 1 << 20, 300).astype(np.int64)
    tokens[:3] = (0, page_size - 1, page_size)  # a page's first and last slot, the next page's first
    found = direct_fill.token_parts(function, tokens, layout_dim, item_size, heads, page_size)
    expected = elementwise(function, tokens, layout_dim, item_size, heads, page_size)
    assert found is not None and found.dtype == np.int64
    np.testing.assert_array_equal(found, expected)
    strided = tokens[::3]  # any view of the indices
    np.testing.assert_array_equal(direct_fill.token_parts(function, strided, layout_dim, item_size, heads, page_size),
                                  elementwise(function, strided, layout_dim, item_size, heads, page_size))


def test_a_function_numba_cannot_compile_answers_none():
    names = {0: "zero"}

    def token_offset(token, layout_dim, item_size, heads, page_size):  # a dict of str: not for Numba
        return len(names.get(0, "")) * 0 + token * item_size

    tokens = np.arange(5, dtype=np.int64)
    assert direct_fill.token_parts(token_offset, tokens, 0, 8, 1, 1) is None
    assert direct_fill.token_parts(token_offset, tokens, 0, 8, 1, 1) is None  # remembered
    np.testing.assert_array_equal(elementwise(token_offset, tokens, 0, 8, 1, 1), tokens * 8)


def test_tokens_other_than_int64_are_left_to_numpy():
    """Numba promotes uint64 with int64 to float64 where NumPy keeps uint64: only int64 tokens are compiled."""
    tokens = np.arange(4, dtype=np.uint64)
    assert direct_fill.token_parts(FUNCTIONS["page_first_direct"], tokens, 4096, 512, 1, 16) is None
