"""Where one item (one token's K or V of one layer) lives in each memory layout.

Every layout has the same address signature, so the kernel factory can pair any two:

    address(base, layer, layout_dim, token, item_size, head, heads, page_size) -> int

``base`` is the buffer's address (for the table layout, the address of a uint64 table of
per-layer base addresses). ``layout_dim`` is in bytes. A token's item may be split into ``heads``
equal chunks, copied head by head; ``head`` picks one. With ``heads == 1`` the head terms vanish,
so the same functions serve whole-item and head-by-head copies (the seed's ``per_head_lf`` is
``LAYER_FIRST`` here, with ``heads > 1``).

Integer expressions follow the seed term for term (transfer.cu, ``get_global_offset_*``), so
addresses agree even on unusual arguments.
"""
import enum

from .jit import device_function
from .memory import load_i64


class Layout(str, enum.Enum):
    """The layouts of one K (or V, or MLA) buffer. Accepts its value as a string: ``Layout("pf")``."""

    LAYER_FIRST = "lf"  # one buffer per layer: token t at base + t * item_size
    LAYER_TABLE = "lf_tbl"  # the same, per-layer bases read from a uint64 table on the device
    PAGE_FIRST = "pf"  # one buffer: token t, layer l at base + t * layout_dim + l * item_size
    PAGE_HEAD = "ph"  # one buffer shaped [pages, heads, page_size, layers, head_bytes]

    @classmethod
    def _missing_(cls, value):
        names = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown layout {value!r}: expected one of {names}")


# Each layout's address is split into three parts so kernels compute each once, where it changes:
#   address = layer_base(base, layer, ...) + token_offset(token, ...) + head * head_stride(...)
# The layer part includes the buffer's base (or, for the table layout, is read from the table).


@device_function
def layer_first_layer_base(base, layer, layout_dim, item_size, heads):
    return base + layer * layout_dim


@device_function
def layer_table_layer_base(table, layer, layout_dim, item_size, heads):
    return load_i64(table + layer * 8)


@device_function
def page_first_layer_base(base, layer, layout_dim, item_size, heads):
    return base + layer * item_size


@device_function
def page_head_layer_base(base, layer, layout_dim, item_size, heads):
    return base + layer * item_size // heads  # layer within the token


@device_function
def item_token_offset(token, layout_dim, item_size, heads, page_size):  # layer-first and table
    return token * item_size


@device_function
def page_first_token_offset(token, layout_dim, item_size, heads, page_size):
    return token * layout_dim


@device_function
def page_head_token_offset(token, layout_dim, item_size, heads, page_size):
    return (token // page_size * page_size * layout_dim  # page
            + token % page_size * layout_dim // heads)  # token within the head's block


@device_function
def item_head_stride(layout_dim, item_size, heads, page_size):  # heads are adjacent in the item
    return item_size // heads


@device_function
def page_head_head_stride(layout_dim, item_size, heads, page_size):  # a head's block of the page
    return layout_dim // heads * page_size


class LayoutParts:
    """The three address parts of one layout (device functions)."""

    def __init__(self, layer_base, token_offset, head_stride):
        self.layer_base, self.token_offset, self.head_stride = layer_base, token_offset, head_stride


PARTS = {
    Layout.LAYER_FIRST: LayoutParts(layer_first_layer_base, item_token_offset, item_head_stride),
    Layout.LAYER_TABLE: LayoutParts(layer_table_layer_base, item_token_offset, item_head_stride),
    Layout.PAGE_FIRST: LayoutParts(page_first_layer_base, page_first_token_offset, item_head_stride),
    Layout.PAGE_HEAD: LayoutParts(page_head_layer_base, page_head_token_offset, page_head_head_stride),
}


def _composed(parts):
    layer_base, token_offset, head_stride = parts.layer_base, parts.token_offset, parts.head_stride

    @device_function
    def address(base, layer, layout_dim, token, item_size, head, heads, page_size):
        return (layer_base(base, layer, layout_dim, item_size, heads)
                + token_offset(token, layout_dim, item_size, heads, page_size)
                + head * head_stride(layout_dim, item_size, heads, page_size))

    return address


# Whole addresses, one function per layout (for reading and teaching; kernels use PARTS):
#   address(base, layer, layout_dim, token, item_size, head, heads, page_size) -> int
layer_first_address = _composed(PARTS[Layout.LAYER_FIRST])
layer_table_address = _composed(PARTS[Layout.LAYER_TABLE])
page_first_address = _composed(PARTS[Layout.PAGE_FIRST])
page_head_address = _composed(PARTS[Layout.PAGE_HEAD])

ADDRESS_FUNCTIONS = {
    Layout.LAYER_FIRST: layer_first_address,
    Layout.LAYER_TABLE: layer_table_address,
    Layout.PAGE_FIRST: page_first_address,
    Layout.PAGE_HEAD: page_head_address,
}
