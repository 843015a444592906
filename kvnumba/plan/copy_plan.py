"""``kv.copy``'s two cache views read as the two sides of one transfer (``copy_sides``), for ``KernelPlan``.

The views are read through their public protocol (``kvnumba.layouts.CacheView``: ``geometry``, ``parts``,
``mla``, ``per_layer``, ``raw_tables``, ``buffers``, ``kind_offset``), so this module does not import them.
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple, SupportsIndex

import numpy as np

from ..arrays import ArrayInfo, array_info
from ..checks import validate
from ..checks.user_layouts import check_user_layout, kind_offset as checked_kind_offset
from ..kernels import layouts
from . import routes
from .device_tables import device_table
from .sides import Placement, Side, resolve_array, resolve_table, smaller


class CopySides(NamedTuple):
    """What ``kv.copy(src_view, dst_view, ..., layers)`` is, for ``KernelPlan``."""

    first_layer: int
    window: int  # layers one call moves
    num_layers: int
    item_size: int
    heads: int  # the heads the copy goes by
    src: Side
    dst: Side
    place: Placement
    engine: routes.EnginePlan | None  # the copy-engine route's arithmetic (plan.routes), or None
    no_engine: str  # why there is none ("" when there is one)


def copy_window(src: Any, dst: Any, layers: SupportsIndex | range | None,
                names: tuple[str, str] = ("src_view", "dst_view")) -> tuple[int, int]:
    """``(first_layer, count)`` that ``kv.copy(src, dst, ..., layers)`` copies: every layer for None (the views
    must have as many), else the layers named (an int, or a range with step 1). ``src``/``dst``: anything with a
    view's ``geometry``."""
    ls, ld = src.geometry.layers, dst.geometry.layers
    num_layers = min(ls, ld)
    if layers is None:
        if ls != ld:
            raise ValueError(f"the views' layer counts differ: {names[0]} has {ls}, {names[1]} {ld}; pass layers= "
                             f"to say which to copy (e.g. layers=range({num_layers}))")
        return 0, num_layers
    if isinstance(layers, range):
        if layers.step != 1 or len(layers) == 0:
            raise ValueError(f"layers must be a non-empty range with step 1, got {layers!r}")
        first, count = layers.start, len(layers)
    else:
        try:
            first, count = validate.integer("layers", layers, minimum=0, maximum=validate.MAX_SIZE), 1
        except TypeError:
            raise TypeError(f"layers must be None, an int or a range, got {type(layers).__name__}") from None
    if first < 0 or first + count > num_layers:
        raise ValueError(f"layers={layers!r} is out of range for views of {num_layers} layers")
    return first, count


def is_view(obj: Any) -> bool:
    """A cache view (an instance of a ``CacheView`` class: it carries its layout's ``LayoutParts``)."""
    return not isinstance(obj, type) and isinstance(getattr(obj, "parts", None), layouts.LayoutParts) \
        and hasattr(obj, "buffers")


def copy_sides(geometry: dict[str, Any], strict: bool) -> CopySides:
    """``kv.copy(src_view, dst_view, ..., layers)`` resolved into two sides (``strict``: raw tables' contents
    read again)."""
    src, dst = geometry["src_view"], geometry["dst_view"]
    for name, view in (("src_view", src), ("dst_view", dst)):
        if not is_view(view):
            raise TypeError(f"{name} must be a kvnumba cache view (kv.PageFirst, kv.LayerFirst, ...), "
                            f"got {type(view).__name__}")
    heads = check_fit(src, dst)
    for view in (src, dst):  # a layout of the user's: checked for the heads this copy goes by
        check_user_layout(view, heads)
    first_layer, window = copy_window(src, dst, geometry.get("layers"))
    place = Placement()
    src_side = view_side(place, "src_view", src, False, first_layer, window, strict)
    dst_side = view_side(place, "dst_view", dst, True, first_layer, window, strict)
    engine, no_engine = _engine(src, dst, src_side, dst_side, heads)
    return CopySides(first_layer, window, min(src.geometry.layers, dst.geometry.layers), src.geometry.item_bytes,
                     heads, src_side, dst_side, place, engine, no_engine)


def _engine(src: Any, dst: Any, src_side: Side, dst_side: Side, heads: int) -> tuple[routes.EnginePlan | None, str]:
    for view, side in ((src, src_side), (dst, dst_side)):
        if view.user_layout:
            return None, f"{type(view).__name__} is a layout of your own (its arithmetic runs on the GPU only)"
        if side.bases is None or side.devices is None:
            return None, f"{view!r} holds layers whose memory kvnumba does not know"
        if side.device is None:
            return None, f"{view!r} holds layers in both host and GPU memory"
    return routes.EnginePlan(src_side, dst_side, src.geometry.item_bytes, heads), ""


def _parts(view: Any, window: int) -> layouts.LayoutParts:
    """The view's layout, or for a one-layer copy of a per-layer view its table-free twin (the layer's
    address is a kernel argument: no table read per item)."""
    if view.per_layer and window == 1:
        return view.parts.one_layer()
    return view.parts


def check_fit(src: Any, dst: Any, names: tuple[str, str] = ("src_view", "dst_view")) -> int:
    """The two sides fit one copy (kv.copy's rules, also kvnumba.remote's): both MLA or neither, the same
    item bytes and dtype (or one of them uint8), whole 8-byte words per head. Returns the heads the copy
    goes by (``copy_heads``); ``names`` name the sides in the errors."""
    gs, gd = src.geometry, dst.geometry
    s, d = names
    if src.mla != dst.mla:
        raise ValueError(f"{s} is {'MLA (no V)' if src.mla else 'K and V'} but {d} is "
                         f"{'MLA (no V)' if dst.mla else 'K and V'}")
    if gs.item_bytes != gd.item_bytes:
        raise ValueError(f"the views' items differ: {s} {gs.item_bytes} bytes, {d} {gd.item_bytes} bytes")
    if gs.dtype != gd.dtype and "uint8" not in (gs.dtype, gd.dtype):
        raise TypeError(f"the views' dtypes differ: {s} {gs.dtype}, {d} {gd.dtype} (a copy moves raw "
                        "bytes; view both as the same dtype, or as uint8)")
    heads = copy_heads(src, dst, names)
    if gs.item_bytes % (8 * heads):
        raise ValueError(f"an item of {gs.item_bytes} bytes split into {heads} heads is not a whole number of "
                         "8-byte words per head")
    return heads


def copy_heads(src: Any, dst: Any, names: tuple[str, str] = ("src_view", "dst_view")) -> int:
    """The heads a copy goes by: whole items, or head by head (or group by group) where a side splits its
    heads (``layouts.head_runs``); the views' items must have the same heads."""
    hs, hd = src.geometry.heads, dst.geometry.heads
    if hs != hd:
        tables = getattr(src, "raw_tables", False) or getattr(dst, "raw_tables", False)
        hint = "; a LayerTable takes heads=" if tables else ""
        raise ValueError(f"the views' heads differ: {names[0]} {hs}, {names[1]} {hd} (items of H heads are (H, D), a "
                         f"flat item (D,) has one head{hint})")
    rs, rd = layouts.head_runs(src.parts, hs), layouts.head_runs(dst.parts, hd)  # 1, H, or head groups
    if rs != rd and 1 not in (rs, rd):
        raise ValueError(f"{names[0]} cuts a token's {hs} heads into {rs} runs, {names[1]} into {rd}: a copy goes by "
                         "one of them (copy through a kv.LayerFirst view)")
    return max(rs, rd)


def view_side(place: Placement, name: str, view: Any, destination: bool, first_layer: int, window: int,
              strict: bool, align: int = 8, one_layer: bool = True) -> Side:
    """A view as one side of a copy of layers ``[first_layer, first_layer + window)``: its buffers (or raw
    tables) resolved (``align``: their alignment); ``one_layer``: one layer of a per-layer view goes by that
    layer's own address. The side does not hold the view: a cached plan must not keep its buffers alive."""
    g = view.geometry
    kinds = ("k",) if view.mla else ("k", "v")
    ptrs: list[int] = []
    bases: list[list[int]] | None = []
    devices: list[int] | None = []
    extents = None
    for which in kinds:
        label = f"{name}.{which}"
        if view.raw_tables:
            info, layers = resolve_table(place, label, getattr(view, which), g.layers, destination, strict)
            extents = smaller(layers.extents, extents)
            ptrs.append(info.ptr)
            if bases is not None and devices is not None and None not in layers.addresses \
                    and None not in layers.devices:
                bases.append(list(layers.addresses))
                devices.extend(layers.devices)
            else:
                bases = devices = None
            continue
        infos = [resolve_array(place, label + (f"[{i}]" if view.per_layer else ""), b, destination, align)
                 for i, b in enumerate(view.buffers(which))]
        if devices is not None:
            devices.extend(i.device for i in infos)
        copied = infos[first_layer:first_layer + window] if view.per_layer else infos  # the layers it reaches
        offset = checked_kind_offset(view, which, [i.nbytes for i in copied], name)  # the class's word, checked
        if not view.per_layer:
            ptrs.append(infos[0].ptr + offset)
            if bases is not None:
                bases.append([ptrs[-1]])
            continue
        addresses = [i.ptr + offset for i in infos]
        if bases is not None:
            bases.append(list(addresses))
        if window == 1 and one_layer:  # one layer: its address goes in directly, no table to read per item
            ptrs.append(addresses[first_layer])
            continue
        table = array_info(_address_table(view, addresses, infos), f"{label} table")
        place.guides.append((f"{name}'s {which} table", table.ptr, table.ptr + table.nbytes))
        ptrs.append(table.ptr)
    return Side(name=name, label=repr(view), parts=view.parts,
                kernel_parts=_parts(view, window) if one_layer else view.parts, mla=view.mla, layout_dim=g.layout_dim,
                page_size=g.page_size, tokens=g.tokens, geometry=g, ptrs=(ptrs[0], ptrs[1] if len(ptrs) > 1 else 0),
                bases=None if bases is None else _layer_bases(view, bases), extents=extents, devices=devices)


def _layer_bases(view: Any, bases: list[list[int]]) -> np.ndarray:
    layers = view.geometry.layers
    return np.array([b if len(b) == layers else b * layers for b in bases], dtype=np.int64)


# Per view, the uint64 tables of its layer addresses made for kernels (kept alive by the view, held weakly).
_address_tables: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], Any]] = weakref.WeakKeyDictionary()


def _address_table(view: Any, addresses: list[int], infos: list[ArrayInfo]) -> Any:
    tables = _address_tables.setdefault(view, {})
    key = tuple(addresses)
    table = tables.get(key)
    if table is None:
        table = tables[key] = device_table(np.array(addresses, dtype=np.uint64), infos)
    return table
