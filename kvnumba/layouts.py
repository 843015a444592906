"""Where one item (one token's K or V of one layer) lives in each memory layout.

Every address function has the same signature, so the kernel factory can pair any two:

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

from ._target import device_function
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


@device_function
def layer_first_address(base, layer, layout_dim, token, item_size, head, heads, page_size):
    return base + layer * layout_dim + token * item_size + item_size // heads * head


@device_function
def layer_table_address(table, layer, layout_dim, token, item_size, head, heads, page_size):
    return load_i64(table + layer * 8) + token * item_size + item_size // heads * head


@device_function
def page_first_address(base, layer, layout_dim, token, item_size, head, heads, page_size):
    return base + token * layout_dim + layer * item_size + item_size // heads * head


@device_function
def page_head_address(base, layer, layout_dim, token, item_size, head, heads, page_size):
    return (
        base
        + token // page_size * page_size * layout_dim  # page
        + layout_dim // heads * head * page_size  # head within the page
        + token % page_size * layout_dim // heads  # token within the head
        + layer * item_size // heads  # layer within the token
    )


ADDRESS_FUNCTIONS = {
    Layout.LAYER_FIRST: layer_first_address,
    Layout.LAYER_TABLE: layer_table_address,
    Layout.PAGE_FIRST: page_first_address,
    Layout.PAGE_HEAD: page_head_address,
}
