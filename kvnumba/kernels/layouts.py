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
    token's item into (None: one per head). ``page_dim``: ``layout_dim`` counts one page's bytes, not one token
    slot's (``slot_bytes``).

    ``map_geometry(nbytes, item_size, layout_dim, page_size, heads)``, where given, is how the staged load kernel's
    tensor maps see one source buffer (``kvnumba.plan.tensor_maps``): ``(sizes, strides, runs)``, five sizes
    (innermost: the 8-byte words of one run of a token's item) and four byte strides, or None where these
    sizes cannot be pictured. ``head_major``: its sizes are ``(run words, layers, runs, tokens of a page, pages)``
    (runs: heads or head groups); else ``(row words, rows, layers, tokens, 1)``.
    """

    def __init__(self, name, layer_base, token_offset, head_stride, *, table=False, head_split=False,
                 title=None, token_limit=None, head_runs=None, page_dim=False, map_geometry=None, head_major=False):
        self.name, self.table, self.head_split, self.head_runs = name, table, head_split, head_runs
        self.title, self.token_limit, self.page_dim = title or name, token_limit, page_dim
        self.map_geometry, self.head_major = map_geometry, head_major
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


MAX_BOX = 256  # the bulk-copy unit's box: at most 256 elements a dimension


def item_rows(item_size):
    """The fewest rows a box cuts a token's item into: each a multiple of 16 bytes, at most ``MAX_BOX`` words."""
    return next((r for r in range(1, item_size // 16 + 1)
                 if item_size % r == 0 and (item_size // r) % 16 == 0 and item_size // r // 8 <= MAX_BOX), None)


def _token_map(nbytes, item_size, layers, token_bytes):  # [row words, rows, layers, tokens, 1]
    rows = item_rows(item_size)
    tokens = nbytes // token_bytes
    if rows is None or tokens == 0 or nbytes % token_bytes:
        return None
    row = item_size // rows
    return (row // 8, rows, layers, tokens, 1), (row, item_size, token_bytes, token_bytes * tokens), rows


def layer_first_map(nbytes, item_size, layout_dim, page_size, heads):  # one layer's buffer
    return _token_map(nbytes, item_size, 1, item_size)


def page_first_map(nbytes, item_size, layout_dim, page_size, heads):
    if layout_dim % 16 or layout_dim < item_size:
        return None
    return _token_map(nbytes, item_size, layout_dim // item_size, layout_dim)


def page_head_map(nbytes, item_size, layout_dim, page_size, heads):
    """``[head words, layers, heads, tokens of a page, pages]``: heads before tokens, though a head's tokens are
    closer in memory, so that a box lands token-major, every token's heads together, as a destination keeps them."""
    chunk = item_size // heads
    page_bytes = page_size * layout_dim
    pages = nbytes // page_bytes
    if chunk % 16 or layout_dim % (16 * heads) or pages == 0 or nbytes % page_bytes:
        return None
    sizes = (chunk // 8, layout_dim // item_size, heads, page_size, pages)
    return sizes, (chunk, page_bytes // heads, layout_dim // heads, page_bytes), heads


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
                          token_limit=layer_first_limit, map_geometry=layer_first_map)
LAYER_TABLE = LayoutParts("lf_tbl", table_layer_base, item_token_offset, item_head_stride, table=True,
                          title="layer-first", token_limit=table_limit)
PAGE_FIRST = LayoutParts("pf", page_first_layer_base, page_first_token_offset, item_head_stride, title="page-first",
                         token_limit=page_first_limit, map_geometry=page_first_map)
PAGE_HEAD = LayoutParts("ph", page_head_layer_base, page_head_token_offset, page_head_head_stride, head_split=True,
                        title="page-head", map_geometry=page_head_map, head_major=True)  # its bound is searched for

PARTS = {Layout.LAYER_FIRST: LAYER_FIRST, Layout.LAYER_TABLE: LAYER_TABLE, Layout.PAGE_FIRST: PAGE_FIRST,
         Layout.PAGE_HEAD: PAGE_HEAD}


def head_runs(parts, heads):
    """How many runs layout ``parts`` cuts a token's item of ``heads`` heads into: 1 where its heads are
    adjacent, ``heads`` for a head-split layout, its head groups for one that declares them. A copy goes
    by the larger of its two sides' (``kvnumba.plan.copy_plan.copy_heads``)."""
    if not parts.head_split:
        return 1
    return parts.head_runs or heads


def slot_bytes(parts, layout_dim, page_size):
    """The bytes of one token slot of a buffer of layout ``parts`` (``layout_dim``, or a page's share of it)."""
    return layout_dim // page_size if parts.page_dim else layout_dim


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
