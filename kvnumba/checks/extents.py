"""Every byte a copy of a view can touch lies in the buffer its pointer came from, whatever the view's class
says: the safety net under every plan (``plan.copy_plan.view_side``) and every export (``remote.sides``).

A plan adds ``view.kind_offset(which)`` to a buffer's address and lets the kernel (or the copy engine)
reach ``layer part + token part + head part`` beyond it. So for each kind the offset must be a non-negative
integer and ``offset + hull`` lie within the buffer, the hull being the span of the layout's arithmetic
over every layer, token and head: from (0, 0, 0) to (L-1, T-1, H-1) for kvnumba's own view classes, whose
parts grow with each; evaluated at every layer and token for any other class (``checks.user_layouts``).
The hull is remembered per view (weakly); the offset is checked on every plan, since the pointers get it.
"""
from __future__ import annotations

import weakref
from typing import Any

from ..kernels import layouts
from .user_layouts import _bases, head_stride_of, layer_span, token_span

# view -> (heads, lo, hi): bytes [lo, hi) from a buffer's address (a table layout: from each layer's own)
_hulls: weakref.WeakKeyDictionary[Any, tuple[int, int, int]] = weakref.WeakKeyDictionary()


def copy_heads_of(view: Any) -> int:
    """The runs a copy of ``view`` cuts a token's item into, as far as its own bytes go (``layouts.head_runs``):
    its heads or head groups where it splits them, else one (a copy by more runs of a layout that keeps a
    token's heads together touches the same bytes)."""
    return layouts.head_runs(view.parts, view.geometry.heads)


def hull(view: Any) -> tuple[int, int]:
    """``[lo, hi)``: the bytes a copy of ``view`` can touch, from its buffer's address (for a per-layer view,
    from each layer's own address), before ``kind_offset``."""
    heads = copy_heads_of(view)
    known = _hulls.get(view)
    if known is not None and known[0] == heads:
        return known[1], known[2]
    lo, hi = (_corners if type(view).built_in else _everywhere)(view, heads)
    _hulls[view] = (heads, lo, hi)
    return lo, hi


def _corners(view: Any, heads: int) -> tuple[int, int]:
    g = view.geometry
    layer_base, token_offset, head_stride = view.parts.py
    dim, item, page = g.layout_dim, g.item_bytes, g.page_size
    stride = int(head_stride(dim, item, heads, page))
    first = int(token_offset(0, dim, item, heads, page))
    last = int(token_offset(g.tokens - 1, dim, item, heads, page)) + (heads - 1) * stride + item // heads
    if not view.parts.table:
        first += int(layer_base(0, 0, dim, item, heads, page))
        last += int(layer_base(0, g.layers - 1, dim, item, heads, page))
    return first, last


def _everywhere(view: Any, heads: int) -> tuple[int, int]:
    """The parts' extremes as the check at construction found them (``checks.user_layouts``: every layer and
    token), summed."""
    stride = head_stride_of(view, heads)
    t_lo, _, t_hi, _, _ = token_span(view, heads)
    chunk = view.geometry.item_bytes // heads
    lo, hi = t_lo + min(0, (heads - 1) * stride), t_hi + max(0, (heads - 1) * stride) + chunk
    if not view.parts.table:
        l_lo, _, l_hi, _, _ = layer_span(view, heads, _bases(view.k)[0])
        lo, hi = lo + l_lo, hi + l_hi
    return lo, hi


def kind_offset(view: Any, which: str, nbytes: list[int], label: str) -> int:
    """``view.kind_offset(which)``, checked: an integer >= 0 that keeps every byte a copy can touch inside
    each of the kind's buffers (``nbytes``: their sizes, one per layer for a per-layer view). ``TypeError`` /
    ``ValueError`` naming the view (``label``) otherwise."""
    name = type(view).__name__
    offset = view.kind_offset(which)
    if isinstance(offset, bool) or not hasattr(offset, "__index__"):
        raise TypeError(f"{label}: {name}.kind_offset({which!r}) gave {offset!r} ({type(offset).__name__}); it must "
                        "be an integer number of bytes")
    offset = int(offset.__index__())
    if offset < 0 or offset % 8:
        raise ValueError(f"{label}: {name}.kind_offset({which!r}) gave {offset}; it must be a non-negative multiple "
                         "of 8 bytes")
    lo, hi = hull(view)
    for i, size in enumerate(nbytes):
        if offset + lo < 0 or offset + hi > size:
            where = f"{which}[{i}]" if len(nbytes) > 1 else which
            raise ValueError(f"{label}: {name} with kind_offset({which!r}) = {offset} reaches bytes "
                             f"[{offset + lo}, {offset + hi}) of {where}, which holds {size} bytes: a copy would "
                             "touch memory outside the buffer")
    return offset
