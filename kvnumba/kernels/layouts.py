"""Where one item (one token's K or V of one layer) lives in each memory layout.

A layout's address is split into three parts so kernels compute each once, where it changes:

    address = layer_base(base, layer, layout_dim, item_size, heads, page_size)
            + token_offset(token, layout_dim, item_size, heads, page_size)
            + head * head_stride(layout_dim, item_size, heads, page_size)

``base`` is the buffer's address, or, for a table layout, the address of a uint64 table of per-layer
base addresses. ``layout_dim`` is the layout's one free stride in bytes, ``page_size`` its page size in
tokens. A token's item may be copied in ``heads`` equal chunks; with ``heads == 1`` the head terms vanish.
The seed's four layouts follow its ``get_global_offset_*`` term for term; every other layout, a user's too,
declares three plain Python functions of this form in its view class (``kvnumba.layouts``).
"""
import enum

from .jit import device_function
from .memory import load_i64
from .params import NO_LIMIT


class Layout(str, enum.Enum):
    """The seed's layouts of one K (or V, or MLA) buffer. Accepts its value as a string: ``Layout("pf")``."""

    LAYER_FIRST = "lf"  # one buffer per layer: token t at base + t * item_size
    LAYER_TABLE = "lf_tbl"  # the same, per-layer bases read from a uint64 table on the device
    PAGE_FIRST = "pf"  # one buffer: token t, layer l at base + t * layout_dim + l * item_size
    PAGE_HEAD = "ph"  # one buffer shaped [pages, heads, page_size, layers, head_bytes]

    @classmethod
    def _missing_(cls, value):
        names = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown layout {value!r}: expected one of {names}")


class LayoutParts:
    """The three address parts of one layout, compiled as device functions, and what kind of layout it is.

    ``name`` keys the kernel cache and the tuned copy shapes; ``title`` names it in messages; ``table``:
    ``base`` is a uint64 table of per-layer addresses; ``head_split``: a token's heads are not adjacent (a
    copy goes head by head). ``token_limit(nbytes, item_size, layout_dim, last_layer, page_size, heads)``,
    where given, is the closed form of the token bound (``kvnumba.checks.bounds``; else it is searched for).
    ``head_runs``: for a head-split layout that keeps groups of heads together, how many runs it cuts a
    token's item into (None: one per head).
    """

    def __init__(self, name, layer_base, token_offset, head_stride, *, table=False, head_split=False,
                 title=None, token_limit=None, head_runs=None, unified=None):
        self.name, self.table, self.head_split, self.head_runs = name, table, head_split, head_runs
        self.title, self.token_limit = title or name, token_limit
        self.unified = unified  # (kinds, groups) of a page-unified pool: the staged kernel's tensor maps picture it
        self.py = (layer_base, token_offset, head_stride)  # the Python functions (bounds, reference checks)
        self.layer_base = device_function(layer_base)
        self.token_offset = device_function(token_offset)
        self.head_stride = device_function(head_stride)

    def one_layer(self):
        """The twin of a table layout for a copy of one layer: ``base`` is that layer's address
        (no table read); the token and head parts are this layout's. Memoised."""
        twin = getattr(self, "_one_layer", None)
        if twin is None:
            layer_base, token_offset, head_stride = self.py
            twin = LayoutParts(f"{self.name}@1", given_layer_base, token_offset, head_stride,
                               head_split=self.head_split, title=self.title,
                               token_limit=self.token_limit, head_runs=self.head_runs)
            self._one_layer = twin
        return twin

    def __repr__(self):
        return f"LayoutParts({self.name!r})"


def layer_first_layer_base(base, layer, layout_dim, item_size, heads, page_size):
    return base + layer * layout_dim  # layout_dim: the bytes of one layer (0 for one layer's buffer)


def table_layer_base(table, layer, layout_dim, item_size, heads, page_size):
    return load_i64(table + layer * 8)


def given_layer_base(base, layer, layout_dim, item_size, heads, page_size):  # base: the layer's own address
    return base


def page_first_layer_base(base, layer, layout_dim, item_size, heads, page_size):
    return base + layer * item_size  # a token slot holds every layer's item, layer by layer


def page_head_layer_base(base, layer, layout_dim, item_size, heads, page_size):
    return base + layer * item_size // heads  # layer within the token, in a head's block


def item_token_offset(token, layout_dim, item_size, heads, page_size):  # tokens back to back
    return token * item_size


def page_first_token_offset(token, layout_dim, item_size, heads, page_size):
    return token * layout_dim


def page_head_token_offset(token, layout_dim, item_size, heads, page_size):
    return (token // page_size * page_size * layout_dim  # page
            + token % page_size * layout_dim // heads)  # token within the head's block


def item_head_stride(layout_dim, item_size, heads, page_size):  # heads are adjacent in the item
    return item_size // heads


def page_head_head_stride(layout_dim, item_size, heads, page_size):  # a head's block of the page
    return layout_dim // heads * page_size


def layer_first_limit(nbytes, item_size, layout_dim, last_layer, page_size, heads):
    return max((nbytes - last_layer * layout_dim) // item_size, 0)  # end(t) = last * dim + (t + 1) * item


def table_limit(nbytes, item_size, layout_dim, last_layer, page_size, heads):
    return max(nbytes // item_size, 0)  # each layer its own buffer: end(t) = (t + 1) * item


def page_first_limit(nbytes, item_size, layout_dim, last_layer, page_size, heads):
    room = nbytes - (last_layer + 1) * item_size  # end(t) = t * dim + (last + 1) * item
    if room < 0:
        return 0
    return NO_LIMIT if layout_dim == 0 else room // layout_dim + 1


LAYER_FIRST = LayoutParts("lf", layer_first_layer_base, item_token_offset, item_head_stride, title="layer-first",
                          token_limit=layer_first_limit)
LAYER_TABLE = LayoutParts("lf_tbl", table_layer_base, item_token_offset, item_head_stride, table=True,
                          title="layer-first", token_limit=table_limit)
PAGE_FIRST = LayoutParts("pf", page_first_layer_base, page_first_token_offset, item_head_stride, title="page-first",
                         token_limit=page_first_limit)
PAGE_HEAD = LayoutParts("ph", page_head_layer_base, page_head_token_offset, page_head_head_stride, head_split=True,
                        title="page-head")  # not linear in the token: its bound is searched for

PARTS = {Layout.LAYER_FIRST: LAYER_FIRST, Layout.LAYER_TABLE: LAYER_TABLE, Layout.PAGE_FIRST: PAGE_FIRST,
         Layout.PAGE_HEAD: PAGE_HEAD}


def head_runs(parts, heads):
    """How many runs layout ``parts`` cuts a token's item of ``heads`` heads into: 1 where its heads are
    adjacent, ``heads`` for a head-split layout, its head groups for one that declares them. A copy goes
    by the larger of its two sides' (``kvnumba.plan.copy_plan.copy_heads``)."""
    if not parts.head_split:
        return 1
    return parts.head_runs or heads


def kv_layer_bases(parts, kinds):
    """``bases(k, v, layer, layout_dim, item_size, heads, page_size, offset) -> (K's, V's)``: a device function
    giving where a token's K and V items of ``layer`` start in buffers ``k`` and ``v`` of layout ``parts``
    (``offset``: the token's ``token_offset``); ``kinds == 1`` (MLA): ``v`` is not read, V's is K's."""
    layer_base = parts.layer_base

    @device_function
    def bases(k, v, layer, layout_dim, item_size, heads, page_size, offset):
        k_base = layer_base(k, layer, layout_dim, item_size, heads, page_size) + offset
        if kinds == 1:
            return k_base, k_base
        return k_base, layer_base(v, layer, layout_dim, item_size, heads, page_size) + offset

    return bases


def address(parts, base, layer, layout_dim, token, item_size, head, heads, page_size):
    """One item's address, whole (for reading and teaching; kernels use the parts where they change).
    Plain Python: ``base`` is a buffer's address (for a table layout, a layer's address)."""
    layer_base, token_offset, head_stride = parts.py
    layer_part = base if parts.table else layer_base(base, layer, layout_dim, item_size, heads, page_size)
    return (layer_part + token_offset(token, layout_dim, item_size, heads, page_size)
            + head * head_stride(layout_dim, item_size, heads, page_size))
