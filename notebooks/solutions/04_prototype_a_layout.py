"""Solution to the exercise of notebooks/04_prototype_a_layout.ipynb: the layout ``[L, H, T/P, P, D]`` written
right, checked against the reference as the notebook checks it (``python notebooks/solutions/04_prototype_a_layout.py``;
tests/test_notebooks.py runs it, on the simulator at a tiny size)."""
import numpy as np

import kvnumba as kv
from kvnumba import reference
from kvnumba.testing import device_array as device, to_numpy


class HeadsThenPages(kv.CacheView):
    """[L, H, T/P, P, D]: each layer split by head first; a head's pages one after the other.

    A layer is ``layout_dim`` bytes; head ``h``'s part of it starts ``h x layout_dim / heads`` bytes in (the
    first attempt's ``item_size // heads`` put the heads side by side, as within one token's item, so heads
    of different tokens overwrote each other); within a head, token ``t`` is ``t x item_size / heads`` on.
    """

    head_split, paged = True, True

    @staticmethod
    def layer_base(base, layer, layout_dim, item_size, heads, page_size):
        return base + layer * layout_dim

    @staticmethod
    def token_offset(token, layout_dim, item_size, heads, page_size):
        return token * (item_size // heads)

    @staticmethod
    def head_stride(layout_dim, item_size, heads, page_size):
        return layout_dim // heads  # the solution: one head's share of the whole layer

    def shape(self, buffer):
        (layers, heads, pages, page, dim), itemsize, dtype = self.array(buffer)
        item = heads * dim * itemsize
        return kv.Geometry(layers, pages * page, page, heads, item, pages * page * item, dtype)

    def logical(self, buffer):
        return buffer.transpose(0, 2, 3, 1, 4)  # [L, T/P, P, H, D]

    @classmethod
    def buffer_shape(cls, layers, tokens, page_size, item):
        return (layers, item[0], tokens // page_size, page_size, item[1])


def check(L=2, T=32, P=4, H=2, D=8):
    rng = np.random.default_rng(0)
    k, v = (rng.integers(0, 2**16, (T, L, H, D), dtype=np.uint16) for _ in range(2))
    pool = kv.PageFirst(device(k), device(v))
    src, dst = rng.choice(T, 8, replace=False), rng.choice(T, 8, replace=False)
    shape = HeadsThenPages.buffer_shape(L, T, P, (H, D))
    got = HeadsThenPages(*(device(np.zeros(shape, np.uint16)) for _ in range(2)))
    want = HeadsThenPages(*(np.zeros(shape, np.uint16) for _ in range(2)))
    kv.copy(pool, got, device(src), device(dst), block_quota=2, num_warps_per_block=1)
    reference.copy(kv.PageFirst(k, v), want, src, dst)
    np.testing.assert_array_equal(to_numpy(got.k), want.k)
    np.testing.assert_array_equal(to_numpy(got.v), want.v)
    assert want.k.any()
    return got


if __name__ == "__main__":
    print(check(), "matches the reference, byte for byte")
