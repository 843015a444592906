"""``kv.copy``'s plan: two cache views read as the two sides of one kernel transfer.

``read_copy`` checks that the views fit one copy, resolves their buffers and tables to the addresses
the kernel takes and says what bounds each side's tokens; ``KernelPlan`` (``kernel_plan``) builds the
plan from that description. The views are read through their public protocol (``geometry``, ``parts``,
``mla``, ``head_split``, ``per_layer``, ``raw_tables``, ``buffers``; ``kvnumba.api.views.CacheView``),
so this module does not import the view classes.
"""
from __future__ import annotations

from typing import Any, NamedTuple, SupportsIndex

import numpy as np

from ..arrays import HOST, ArrayInfo, array_info
from ..checks import pinned, validate
from ..checks.devices import one_device
from ..checks.tables import table_layers
from ..kernels import layouts
from . import routes
from .device_tables import device_table


class ViewSide:
    """One side of a copy for ``KernelPlan``: a view's token bound and words for errors. It does not
    hold the view: a cached plan must not keep a view's buffers alive (the cache finds it by the view's
    identity, held weakly)."""

    def __init__(self, name: str, view: Any, extents: tuple[Any, ...] | None) -> None:
        # extents: per layer, the bytes of the smaller of K and V, or None where unknown (raw tables)
        self.name, self.extents = name, extents
        self.tokens, self.label = view.geometry.tokens, repr(view)

    def limit(self, plan: Any, first_layer: int, num_layers: int) -> tuple[int, int | None]:
        tokens = self.tokens
        if self.extents is None:  # shapes say it all
            return tokens, tokens
        window = self.extents[first_layer:first_layer + num_layers]
        if any(e is None for e in window):
            return tokens, None
        return min(tokens, min(window) // plan.item_size), min(window)

    def describe(self, plan: Any, info: Any, first_layer: int, num_layers: int) -> str:
        return f"{self.name} ({self.label})"


class CopyLayout(NamedTuple):
    """What ``kv.copy(src_view, dst_view, ..., layers)`` is, for ``KernelPlan.for_copy``."""

    first_layer: int
    window: int  # layers one call moves
    num_layers: int
    item_size: int
    heads: int  # the heads the copy goes by
    raw_tables: bool
    tables: bool  # a view is a LayerTable: with checks on, every call reads its tables again
    device: int
    uses_torch: bool
    src: ViewSide
    dst: ViewSide
    destinations: list  # (name, start, end) of every byte range a call may write
    guides: list  # (name, start, end) of the tables the kernel reads
    kernel_sides: tuple  # what KernelPlan._finish takes: parts, MLA, pointers, (layout_dim, page_size) per side
    engine: routes.EnginePlan | None  # the copy-engine route's arithmetic (plan.routes), or None
    no_engine: str  # why there is none ("" when there is one)


def _window(layers: SupportsIndex | range | None, num_layers: int, where: str = "layers") -> tuple[int, int]:
    """``(first_layer, count)`` of ``layers``: None (all), an int, or a range with step 1."""
    if layers is None:
        return 0, num_layers
    if isinstance(layers, range):
        if layers.step != 1 or len(layers) == 0:
            raise ValueError(f"{where} must be a non-empty range with step 1, got {layers!r}")
        first, count = layers.start, len(layers)
    else:
        try:
            first, count = validate.integer(where, layers, minimum=0, maximum=validate.MAX_SIZE), 1
        except TypeError:
            raise TypeError(f"{where} must be None, an int or a range, got {type(layers).__name__}") from None
    if first < 0 or first + count > num_layers:
        raise ValueError(f"{where}={layers!r} is out of range for views of {num_layers} layers")
    return first, count


def copy_window(src: Any, dst: Any, layers: SupportsIndex | range | None,
                names: tuple[str, str] = ("src_view", "dst_view")) -> tuple[int, int]:
    """``(first_layer, count)`` that ``kv.copy(src, dst, ..., layers)`` copies: every layer for None, which
    the views must then have the same number of; else the layers named, which both views must have.
    ``src``/``dst``: anything with a view's ``geometry`` (kvnumba.remote's sides too); ``names`` name them."""
    ls, ld = src.geometry.layers, dst.geometry.layers
    if layers is None and ls != ld:
        raise ValueError(f"the views' layer counts differ: {names[0]} has {ls}, {names[1]} {ld}; pass layers= to "
                         f"say which to copy (e.g. layers=range({min(ls, ld)}))")
    return _window(layers, min(ls, ld))


def _is_view(obj: Any) -> bool:
    """A cache view (an instance of a ``CacheView`` class: it carries its layout's ``LayoutParts``)."""
    return not isinstance(obj, type) and isinstance(getattr(obj, "parts", None), layouts.LayoutParts) \
        and hasattr(obj, "buffers")


def read_copy(geometry: dict[str, Any], strict: bool) -> CopyLayout:
    """``kv.copy(src_view, dst_view, ..., layers)`` described: the views checked against each other, their
    buffers and tables resolved (``strict``: raw tables' contents read again)."""
    src, dst = geometry["src_view"], geometry["dst_view"]
    for name, view in (("src_view", src), ("dst_view", dst)):
        if not _is_view(view):
            raise TypeError(f"{name} must be a kvnumba cache view (kv.PageFirst, kv.LayerFirst, ...), "
                            f"got {type(view).__name__}")
    gs, gd = src.geometry, dst.geometry
    heads = check_fit(src, dst)
    for view in (src, dst):  # a layout of the user's: checked for the heads this copy goes by
        view._check_user_arithmetic(heads)
    first_layer, window = copy_window(src, dst, geometry.get("layers"))

    placed: list[tuple[str, int]] = []
    destinations: list[tuple[str, int, int]] = []
    guides: list[tuple[str, int, int]] = []
    raw = False
    sides = []
    for name, view, destination in (("src_view", src, False), ("dst_view", dst, True)):
        resolved = _resolve(name, view, destination, placed, destinations, guides, first_layer, window, strict)
        raw = raw or resolved.raw
        sides.append((resolved, ViewSide(name, view, resolved.extents)))
    uses_torch = any(type(b).__module__.startswith("torch") for v in (src, dst) for which in ("k", "v")
                     if getattr(v, which) is not None for b in v.buffers(which))
    (src_resolved, src_side), (dst_resolved, dst_side) = sides
    kernel_sides = (_parts(src, window), _parts(dst, window), src.mla, src_resolved.ptrs, dst_resolved.ptrs,
                    (gs.layout_dim, gs.page_size), (gd.layout_dim, gd.page_size))
    engine, no_engine = _engine(src, dst, src_resolved, dst_resolved, heads)
    return CopyLayout(first_layer, window, min(gs.layers, gd.layers), gs.item_bytes, heads, raw,
                      src.raw_tables or dst.raw_tables, one_device(placed), uses_torch, src_side, dst_side, destinations,
                      guides, kernel_sides, engine, no_engine)


def _engine(src: Any, dst: Any, src_resolved: Resolved, dst_resolved: Resolved,
            heads: int) -> tuple[routes.EnginePlan | None, str]:
    """The copy-engine form of the copy (``plan.routes``), or None and why not."""
    sides = []
    for view, resolved in ((src, src_resolved), (dst, dst_resolved)):
        if view.user_layout:
            return None, f"{type(view).__name__} is a layout of your own (its arithmetic runs on the GPU only)"
        if resolved.devices is None:
            return None, f"{view!r} holds layers whose memory kvnumba does not know"
        places = set(resolved.devices)
        if len(places) != 1:
            return None, f"{view!r} holds layers in both host and GPU memory"
        device = places.pop()
        g = view.geometry
        sides.append(routes.engine_side(view.parts, g.layout_dim, g.page_size, g.item_bytes, heads,
                                        resolved.ptrs[:1] if view.mla else resolved.ptrs,
                                        resolved.layer_addresses, g.layers, None if device == HOST else device))
    return routes.EnginePlan(sides[0], sides[1], src.geometry.item_bytes, heads), ""


def _parts(view: Any, window: int) -> layouts.LayoutParts:
    """The view's layout, or for a one-layer copy of a per-layer view its table-free twin (the layer's
    address is a kernel argument): the per-item table read costs a per-layer load ~8% on an H200."""
    if view.per_layer and window == 1:
        return view.parts.one_layer()
    return view.parts


def check_fit(src: Any, dst: Any, names: tuple[str, str] = ("src_view", "dst_view")) -> int:
    """The two sides fit one copy (kv.copy's rules, also kvnumba.remote's): both MLA or neither, the same
    item bytes and dtype (or one of them uint8), whole 8-byte words per head. Returns the heads the copy
    goes by (``copy_heads``). ``src``/``dst``: anything with a view's ``geometry``, ``mla`` and
    ``head_split``; ``names`` name them in the errors."""
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
    """The heads a copy goes by: the views' items must have the same heads (a flat item ``(D,)`` has one);
    a copy moves whole items, or head by head where a side splits its heads."""
    hs, hd = src.geometry.heads, dst.geometry.heads
    if hs != hd:
        tables = getattr(src, "raw_tables", False) or getattr(dst, "raw_tables", False)
        hint = "; a LayerTable takes heads=" if tables else ""
        raise ValueError(f"the views' heads differ: {names[0]} {hs}, {names[1]} {hd} (items of H heads are (H, D), a "
                         f"flat item (D,) has one head{hint})")
    return hs if src.head_split or dst.head_split else 1


class Resolved(NamedTuple):
    """One view as a copy uses it (``_resolve``)."""

    ptrs: tuple[int, int]  # the kernel's K and V addresses (buffers, tables, or one layer's)
    extents: tuple[int | None, ...] | None  # per layer, the smaller of K and V's bytes (None: from shapes)
    raw: bool  # it holds raw tables (read again with checks on)
    layer_addresses: list[list[int]] | None  # per kind, each layer's address (per-layer views, raw tables)
    devices: list[int] | None  # the devices (or HOST) of its memory; None where unknown


def _resolve(name: str, view: Any, destination: bool, placed: list[tuple[str, int]],
             destinations: list[tuple[str, int, int]], guides: list[tuple[str, int, int]], first_layer: int,
             window: int, strict: bool) -> Resolved:
    """A view's kernel-side addresses, per-layer extents and whether it holds raw tables, and what the
    copy-engine route needs (each layer's address, the memory's devices); records devices, destination
    ranges and table ranges."""
    extents, raw = None, False
    kinds = ("k",) if view.mla else ("k", "v")
    if view.raw_tables:
        ptrs, all_extents = [], []
        table_addresses: list[list[int]] | None = []
        table_devices: list[int] | None = []
        for which in kinds:
            table_name = f"{name}.{which}"
            info = validate.layer_table(table_name, getattr(view, which), view.geometry.layers)
            pinned.require(table_name, info)
            layers = table_layers(table_name, info, view.geometry.layers, strict)
            raw = raw or layers.raw
            placed.append((table_name, info.device))
            placed.extend((f"{table_name}[{i}]", d) for i, d in enumerate(layers.devices) if d is not None)
            guides.append((table_name, info.ptr, info.ptr + info.nbytes))
            if destination:
                for i, (ok, address, extent) in enumerate(zip(layers.writable, layers.addresses, layers.extents)):
                    if ok is False:
                        raise ValueError(f"{table_name}[{i}] is a read-only layer; a destination must be writable")
                    if address is not None and extent is not None:
                        destinations.append((f"{table_name}[{i}]", address, address + extent))
            ptrs.append(info.ptr)
            all_extents.append(layers.extents)
            if table_addresses is not None and table_devices is not None and None not in layers.addresses \
                    and None not in layers.devices:
                table_addresses.append(list(layers.addresses))
                table_devices.extend(layers.devices)
            else:
                table_addresses = table_devices = None
        extents = tuple(None if any(e[i] is None for e in all_extents) else min(e[i] for e in all_extents)
                        for i in range(view.geometry.layers))
        return Resolved((ptrs[0], ptrs[1] if len(ptrs) > 1 else 0), extents, raw, table_addresses, table_devices)
    ptrs = []
    layer_addresses: list[list[int]] | None = [] if view.per_layer else None
    devices: list[int] = []
    for which in kinds:
        infos = [array_info(b, f"{name}.{which}") for b in view.buffers(which)]
        for i, info in enumerate(infos):
            label = f"{name}.{which}" + (f"[{i}]" if view.per_layer else "")
            if info.ptr & 7:
                validate.aligned(label, info)
            pinned.require(label, info)
            placed.append((label, info.device))
            devices.append(info.device)
            if destination:
                validate.writable(label, info)
                destinations.append((label, info.ptr, info.ptr + info.nbytes))
        if view.per_layer:
            addresses = view.layer_addresses(which) if hasattr(view, "layer_addresses") else [i.ptr for i in infos]
            if layer_addresses is not None:
                layer_addresses.append(list(addresses))
            if window == 1:  # one layer: its address goes in directly, no table to read per item
                ptrs.append(addresses[first_layer])
                continue
            table = _address_table(addresses, infos, view)
            info = array_info(table, f"{name}.{which} table")
            guides.append((f"{name}'s {which} table", info.ptr, info.ptr + info.nbytes))
            ptrs.append(info.ptr)
        else:
            ptrs.append(infos[0].ptr)
    return Resolved((ptrs[0], ptrs[1] if len(ptrs) > 1 else 0), None, False, layer_addresses, devices)


def _address_table(addresses: list[int], infos: list[ArrayInfo], view: Any) -> Any:
    """A uint64 table of ``addresses`` where the kernel reads it (on the layers' device), kept alive by
    ``view`` (one per view and address list)."""
    cache = view.__dict__.setdefault("_tables", {})
    key = tuple(addresses)
    table = cache.get(key)
    if table is None:
        table = cache[key] = device_table(np.array(addresses, dtype=np.uint64), infos)
    return table
