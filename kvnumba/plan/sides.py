"""One end of a copy, as plain numbers: the one ``Side`` every plan uses, and the checks that make one.

A ``Side`` is made from an entry point's arguments (``plan.seed_args``), a cache view (``plan.copy_plan``) or
an export (``remote.sides``), and planned by the same code: the kernel plan reads ``limit`` and ``describe``;
the copy-engine route and ``kvnumba.remote`` read ``items`` (every chunk's address, on the host). Every buffer
and table of a plan goes through ``resolve_array`` or ``resolve_table``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arrays import ArrayInfo, array_info
from ..checks import bounds, pinned, validate
from ..checks.devices import one_device
from ..checks.tables import TableLayers, table_layers
from ..kernels.layouts import LayoutParts
from ..kernels.params import NO_LIMIT
from . import direct_fill

KINDS = ("k", "v")


class Side:
    """One end of a copy.

    ``ptrs``: the kernel's K and V addresses (a buffer, a table of layer addresses, or one layer's own).
    ``bases``: int64 ``[kinds, layers]``, each layer's own address for a table layout, the buffer's for
    the others (None where some are unknown: raw tables). ``nbytes``: the smaller of K's and V's bytes;
    ``extents``: the same per layer, for table sides (None entries: unknown). ``tokens``: its token slots
    where its shapes say (views), else None. ``devices``: the device (or ``HOST``) of each of its buffers,
    None where unknown. ``buffers``/``buffer_of``: each distinct buffer's ``(address, bytes)`` and, per (kind,
    layer), which one holds it; ``origin``: what an export says of its view (``kvnumba.remote``).
    ``kernel_parts``: the layout the kernel is built for, where it differs from ``parts`` (one layer of a
    per-layer view, ``LayoutParts.one_layer``). A rebound plan shares its sides: it launches with its
    template's addresses.
    """

    __slots__ = ("name", "label", "parts", "kernel_parts", "mla", "layout_dim", "page_size", "tokens", "geometry",
                 "ptrs", "bases", "nbytes", "extents", "devices", "buffers", "buffer_of", "origin")

    def __init__(self, *, name: str, parts: LayoutParts, mla: bool, layout_dim: int, page_size: int,
                 ptrs: tuple[int, int] = (0, 0), label: str | None = None, tokens: int | None = None,
                 geometry: Any = None, bases: Any = None, nbytes: int | None = None,
                 extents: tuple[int | None, ...] | None = None, devices: list[int] | None = None,
                 buffers: Sequence[tuple[int, int]] = (), buffer_of: Any = None, origin: Any = None,
                 kernel_parts: LayoutParts | None = None) -> None:
        self.name, self.label, self.parts, self.mla = name, label, parts, mla
        self.kernel_parts = kernel_parts or parts
        self.layout_dim, self.page_size, self.tokens, self.geometry = layout_dim, page_size, tokens, geometry
        self.ptrs, self.nbytes, self.extents, self.devices = ptrs, nbytes, extents, devices
        self.bases = None if bases is None else np.asarray(bases, dtype=np.int64)
        self.buffers = list(buffers)
        self.buffer_of = None if buffer_of is None else np.asarray(buffer_of, dtype=np.int64)
        self.origin = origin

    @property
    def kinds(self) -> int:
        return 1 if self.mla else 2

    @property
    def layers(self) -> int:
        """Its layer count, where its layers' addresses are known (else 0)."""
        return 0 if self.bases is None else int(self.bases.shape[1])

    @property
    def head_split(self) -> bool:
        return bool(self.parts.head_split)

    @property
    def device(self) -> int | None:
        """The one device of its memory (``HOST`` for host memory), or None where mixed or unknown."""
        places = set(self.devices or ())
        return places.pop() if len(places) == 1 else None

    def limit(self, item_size: int, heads: int, first_layer: int, num_layers: int) -> tuple[int, int | None]:
        """Exclusive token limit for layers ``[first_layer, first_layer + num_layers)`` (its bytes by its
        layout's arithmetic, and its token count where known), and the bytes it came from (None: unknown)."""
        if self.extents is not None:
            window = self.extents[first_layer:first_layer + num_layers]
            nbytes = None if any(e is None for e in window) else min(window)  # type: ignore[type-var]
        else:
            nbytes = self.nbytes
        limit = NO_LIMIT if nbytes is None else bounds.token_limit(
            self.kernel_parts, nbytes, item_size, self.layout_dim, first_layer, num_layers, self.page_size, heads)
        if self.tokens is not None:
            limit = min(limit, self.tokens)
        return limit, nbytes

    def describe(self, item_size: int, nbytes: int | None, first_layer: int, num_layers: int) -> str:
        if self.label is not None:
            return f"{self.name} ({self.label})"
        if nbytes is None:
            return f"{self.name} (raw layer tables: layer sizes unknown)"
        if self.parts.table:
            return f"{self.name} ({self.parts.title} layers of {nbytes} bytes, item_size={item_size})"
        extra = ""
        if self.parts.name in ("pf", "ph"):  # the layouts whose layout_dim a call passes
            extra = f", layout_dim={self.layout_dim}" + (f", layer {first_layer}" if num_layers == 1 else "")
        return f"{self.name} ({self.parts.title}, {nbytes} bytes, item_size={item_size}{extra})"

    def layer_parts(self, layers: np.ndarray, item_size: int, heads: int) -> np.ndarray:
        """The layer part of every (kind, layer) of ``layers``, shaped ``(kinds, len(layers))``."""
        if self.bases is None:
            raise ValueError(f"{self.name}: its layers' addresses are unknown")
        if self.parts.table:
            return self.bases[:, layers]
        layer_base, dim, page = self.parts.py[0], self.layout_dim, self.page_size
        layers = np.asarray(layers, dtype=np.int64)
        return np.stack([elementwise(lambda layer, base=int(self.bases[k, 0]): layer_base(base, layer, dim, item_size,
                                                                                          heads, page), layers)
                         for k in range(self.kinds)])

    def token_offsets(self, tokens: np.ndarray, item_size: int, heads: int) -> np.ndarray:
        """Every token's token part (int64, like ``tokens``): compiled for the host where Numba can
        (``direct_fill.token_parts``), else with NumPy."""
        function = self.parts.py[1]
        found = direct_fill.token_parts(function, tokens, self.layout_dim, item_size, heads, self.page_size)
        if found is None:
            return elementwise(function, tokens, self.layout_dim, item_size, heads, self.page_size)
        return found

    def can_step(self, nbytes: int, item_size: int, heads: int) -> bool:
        """Whether two of its tokens can lie ``nbytes`` apart (a run of chunks of ``nbytes`` needs that on both
        sides). Built-in token parts are ``A * (t // P) + B * (t % P)``, so any two lie a multiple of
        ``gcd(A, B)`` apart: ``nbytes`` not such a multiple cannot be a step. True where the form does not hold."""
        page = max(self.page_size, 1)
        if page > 1 << 14:
            return True  # no claim
        sample = np.arange(3 * page + 1, dtype=np.int64)
        found = self.token_offsets(sample, item_size, heads)
        across, within = int(found[page]), int(found[1]) if page > 1 else 0
        if not np.array_equal(found, across * (sample // page) + within * (sample % page)):
            return True  # not of that form: no claim
        step = np.gcd(across, within)
        return bool(nbytes % step == 0) if step else nbytes == 0

    def head_stride(self, item_size: int, heads: int) -> int:
        return int(self.parts.py[2](self.layout_dim, item_size, heads, self.page_size))

    def addresses(self, tokens: np.ndarray, layers: np.ndarray, item_size: int, heads: int) -> np.ndarray:
        """The address of every chunk ``(kind, layer, token, head)`` of ``tokens`` (int64 ``[N]``) over ``layers``,
        a chunk being an item split into ``heads`` equal parts; shaped ``(kinds, len(layers), N, heads)``."""
        head_part = np.arange(heads, dtype=np.int64) * self.head_stride(item_size, heads)
        return (self.layer_parts(layers, item_size, heads)[:, :, None, None]
                + self.token_offsets(tokens, item_size, heads)[None, None, :, None] + head_part[None, None, None, :])

    def items(self, tokens: np.ndarray, layers: np.ndarray, item_size: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
        """``addresses``, and the index in ``buffers`` of the buffer holding each chunk (the same shape)."""
        if self.buffer_of is None:
            raise ValueError(f"{self.name}: its buffers are not listed")
        address = self.addresses(tokens, layers, item_size, heads)
        return address, np.broadcast_to(self.buffer_of[:, layers][:, :, None, None], address.shape)

    def buffer_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of ``buffers``, int64 arrays indexed like ``buffer_of``'s values."""
        ranges = np.array(self.buffers, dtype=np.int64).reshape(-1, 2)
        return ranges[:, 0], ranges[:, 0] + ranges[:, 1]


def elementwise(function: Any, tokens: np.ndarray, *args: int) -> np.ndarray:
    """``function(token, *args)`` for every token: at once where its arithmetic takes arrays, else token by
    token (a layout of your own written for one integer)."""
    try:
        out = np.asarray(function(tokens, *args), dtype=np.int64)
        if out.shape == tokens.shape:
            return out
    except Exception:  # noqa: BLE001 - a user's function written for one integer: go token by token
        pass
    return np.array([function(int(t), *args) for t in tokens], dtype=np.int64)


class Placement:
    """What resolving a plan's buffers found: where each lies, the byte ranges a call may write
    (``destinations``), the tables the kernel reads (``guides``), and whether any is a raw table or torch's."""

    def __init__(self) -> None:
        self.placed: list[tuple[str, int]] = []
        self.destinations: list[tuple[str, int, int]] = []
        self.guides: list[tuple[str, int, int]] = []
        self.tables = False  # a layer table: with checks on, every call reads its contents again
        self.raw = False  # a raw table (no kv.layer_table record)
        self.torch = False

    def device(self) -> int:
        return one_device(self.placed)


def resolve_array(place: Placement, label: str, obj: Any, destination: bool, align: int = 8) -> ArrayInfo:
    """A buffer: described, ``align``-byte aligned (8: the kernels' words; 4: FP8 codes and scales), reachable
    by the GPU (pinned if in host memory), and writable if it is a destination; recorded in ``place``."""
    info = array_info(obj, label)
    if info.ptr % align:
        if align == 8:
            validate.aligned(label, info)
        raise ValueError(f"{label} must be {align}-byte aligned, its address is {info.ptr:#x}")
    pinned.require(label, info)
    if destination:
        validate.writable(label, info)
        place.destinations.append((label, info.ptr, info.ptr + info.nbytes))
    place.placed.append((label, info.device))
    place.torch = place.torch or info.is_torch
    return info


def resolve_table(place: Placement, label: str, obj: Any, num_layers: int, destination: bool,
                  strict: bool) -> tuple[ArrayInfo, TableLayers]:
    """A uint64 table of ``num_layers`` layer addresses: checked, its layers looked up (``checks.tables``:
    ``strict`` reads its contents again), each writable if it is a destination; recorded in ``place``."""
    info = validate.layer_table(label, obj, num_layers)
    pinned.require(label, info)
    layers = table_layers(label, info, num_layers, strict)
    place.tables = True
    place.raw = place.raw or layers.raw
    place.torch = place.torch or info.is_torch
    place.placed.append((label, info.device))
    place.placed.extend((f"{label}[{i}]", d) for i, d in enumerate(layers.devices) if d is not None)
    place.guides.append((label, info.ptr, info.ptr + info.nbytes))
    if destination:  # the table is only read; the layers it points to are written
        for i, (ok, address, extent) in enumerate(zip(layers.writable, layers.addresses, layers.extents)):
            if ok is False:
                raise ValueError(f"{label}[{i}] is a read-only layer; a destination must be writable")
            if address is not None and extent is not None:
                place.destinations.append((f"{label}[{i}]", address, address + extent))
    return info, layers


def smaller(a: tuple[int | None, ...], b: tuple[int | None, ...] | None) -> tuple[int | None, ...]:
    """Per layer, the smaller of two tables' extents (None where either is unknown)."""
    if b is None:
        return a
    return tuple(None if x is None or y is None else min(x, y) for x, y in zip(a, b))

