"""Cache views over random data, for kv.copy's tests: every built-in layout (and a user-defined one),
with the same buffers in NumPy for ``kvnumba.reference.copy`` and placed for kvnumba (device or
pinned host memory, Numba or torch arrays)."""
import numpy as np

import kvnumba as kv
from tests.helpers.placement import PLACE, TORCH_PLACE, to_numpy

POISON = 0xA5


class HeadMajorPages(kv.CacheView):
    """A layout kvnumba does not have: ``[L, T/P, H, P, D]`` (layer-major, pages split by head)."""

    head_split = True
    paged = True

    @staticmethod
    def layer_base(base, layer, layout_dim, item_size, heads, page_size):
        return base + layer * layout_dim  # layout_dim: the bytes of one layer

    @staticmethod
    def token_offset(token, layout_dim, item_size, heads, page_size):
        return token // page_size * page_size * item_size + token % page_size * (item_size // heads)

    @staticmethod
    def head_stride(layout_dim, item_size, heads, page_size):
        return page_size * (item_size // heads)

    def shape(self, buffer):
        (layers, pages, heads, page, dim), itemsize, dtype = self.array(buffer)
        item = heads * dim * itemsize
        return kv.Geometry(layers, pages * page, page, heads, item, pages * page * item, dtype)

    def logical(self, buffer):
        return np.swapaxes(buffer, 2, 3)  # [L, T/P, P, H, D]

    @classmethod
    def buffer_shape(cls, layers, tokens, page_size, item):
        heads, dim = item
        return (layers, tokens // page_size, heads, page_size, dim)


# name -> (numpy shape of one K buffer from (L, T, P, H, D)), view from (k, v), per-layer list?, MLA-able?
LAYOUTS = {
    "LayerFirst": (lambda L, T, P, H, D: (L, T, H, D), kv.LayerFirst, False, True),
    "LayerFirstList": (lambda L, T, P, H, D: (L, T, H, D), kv.LayerFirst, True, True),
    "PageFirst": (lambda L, T, P, H, D: (T, L, H, D), kv.PageFirst, False, True),
    "PageFirstDirect": (lambda L, T, P, H, D: (T // P, L, P, H, D), kv.PageFirstDirect, False, True),
    "PageHead": (lambda L, T, P, H, D: (T // P, H, P, L, D), kv.PageHead, False, True),
    "VllmFlashAttn": (lambda L, T, P, H, D: (L, 2, T // P, P, H, D), kv.VllmFlashAttn, True, False),
    "FlashInferNHD": (lambda L, T, P, H, D: (L, T // P, 2, P, H, D),
                      lambda caches: kv.VllmFlashInfer(caches, layout="NHD"), True, False),
    "FlashInferHND": (lambda L, T, P, H, D: (L, T // P, 2, H, P, D),
                      lambda caches: kv.VllmFlashInfer(caches, layout="HND"), True, False),
    "PageUnified": (lambda L, T, P, H, D: (T // P, 1, L, 2, P, H, D), kv.PageUnified, False, True),
    "HeadMajorPages": (lambda L, T, P, H, D: (L, T // P, H, P, D), HeadMajorPages, False, True),
}
KV_ONLY = {"VllmFlashAttn", "FlashInferNHD", "FlashInferHND"}  # no MLA form
UNIFIED = {"PageUnified"}  # one array holds K and V (MLA: its K alone)


def unified_mla(shape):
    """A page-unified pool's MLA shape ``[T/P, L, P, D]`` from its MHA one ``[T/P, G, L, 2, P, H/G, D]``."""
    return (shape[0], shape[2], shape[4], shape[6])


def make_view(name, L, T, P, H, D, rng, poison, mla, place=None):
    """``(numpy view, kvnumba view)`` of layout ``name`` over the same random (or poisoned) data."""
    shape_of, make, per_layer, _ = LAYOUTS[name]
    shape = shape_of(L, T, P, H if not mla else 1, D)
    if name in UNIFIED and mla:
        shape = unified_mla(shape)

    def data():
        if poison:
            return np.full(shape, POISON * 257, np.uint16)  # every byte 0xA5
        return rng.integers(0, 2**16, shape, dtype=np.uint16)

    def build(arrays):
        if name in KV_ONLY:
            return make(list(arrays[0]))
        if name in UNIFIED:
            return make(arrays[0])
        k = arrays[0]
        v = None if mla else arrays[1]
        if per_layer:
            k = list(k)
            v = None if v is None else list(v)
        return make(k, v) if v is not None else make(k)

    arrays = [data() for _ in range(1 if (mla or name in KV_ONLY or name in UNIFIED) else 2)]
    np_view = build(arrays)
    if place is None:
        return np_view, np_view
    placed = [_place(a, place, per_layer or name in KV_ONLY) for a in arrays]
    return np_view, build(placed)


def _place(array, place, per_layer):
    where, framework = place
    put = (TORCH_PLACE if framework == "torch" else PLACE)[where]
    if per_layer:
        return [put(layer) for layer in array]
    return put(array)


def view_bytes(view):
    """Every buffer of a (placed) view, as NumPy bytes, in a fixed order."""
    out = []
    for which in ("k", "v"):
        if getattr(view, which) is None:
            continue
        for buffer in view.buffers(which):
            out.append(to_numpy(buffer).view(np.uint8).reshape(-1))
        if view.v is view.k:
            break  # vLLM/FlashInfer, page-unified: K and V share their arrays
    return out


def assert_same_bytes(got, want, poison, what):
    """Every buffer's bytes of a copy (``got``) equal the reference's (``want``), each a list of NumPy byte arrays
    (``view_bytes``); returns how many bytes the reference moved (its bytes that are not ``poison``)."""
    moved = 0
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w, err_msg=what)
        moved += int((w != poison).sum())
    return moved
