"""One side of a remote copy as plain numbers: where every item of a cache view lives.

A ``Side`` is made from a local ``kv.CacheView`` (``Side.of_view``) or from the header of an export
(``Side.from_header``), so both ends of a transfer are planned by the same code. It holds what a view's
public attributes say (its ``geometry``, its ``parts``: the three address functions of
``kvnumba.kernels.layouts``, its buffers) and nothing of the kernels.

An item's address is ``layer part + token part + head * head stride`` (``kvnumba.kernels.layouts``);
for a table layout the layer part is the layer's own address (what the table would hold). The address
functions are plain arithmetic, so they run on NumPy arrays of tokens at once.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..api import views
from ..arrays import array_info
from ..checks import validate
from ..driver.target import SIMULATOR
from ..kernels import layouts

KINDS = ("k", "v")

# Every layout of kvnumba.kernels.layouts by its name (user layouts are found among CacheView's subclasses).
_BUILT_IN_PARTS = {p.name: p for p in vars(layouts).values() if isinstance(p, layouts.LayoutParts)}


class Side:
    """Where a view's items live: geometry, address functions, per (K/V, layer) bases and buffers.

    ``bases[kind][layer]``: for a table layout, the layer's address; else the buffer's address (the
    same for every layer). ``buffer_of[kind][layer]``: the index in ``buffers`` (``(address, bytes)``
    of each distinct buffer) holding that kind's layer. ``mem`` is NIXL's memory type (``"DRAM"`` or
    ``"VRAM"``) and ``device`` its device id (0 for host memory).
    """

    def __init__(self, *, view_class: str, options: dict[str, Any], parts_name: str, geometry: views.Geometry,
                 mla: bool, bases: list[list[int]], buffer_of: list[list[int]], buffers: list[tuple[int, int]],
                 mem: str, device: int) -> None:
        self.view_class, self.options, self.parts_name = view_class, options, parts_name
        self.geometry, self.mla = geometry, mla
        self.bases = np.asarray(bases, dtype=np.int64)
        self.buffer_of = np.asarray(buffer_of, dtype=np.int64)
        self.buffers, self.mem, self.device = buffers, mem, device
        self.parts = find_parts(parts_name)

    @property
    def kinds(self) -> int:
        return 1 if self.mla else 2

    @property
    def head_split(self) -> bool:
        return bool(self.parts.head_split)

    @property
    def class_name(self) -> str:
        return self.view_class.rsplit(":", 1)[-1]

    # --- made from a view, or from an export's header ------------------------------------------------

    @classmethod
    def of_view(cls, view: views.CacheView, name: str) -> Side:
        """The side of a local view; ``TypeError`` naming ``name`` for what cannot be one."""
        if not isinstance(view, views.CacheView):
            raise TypeError(f"{name} must be a kvnumba cache view (kv.PageFirst, kv.VllmFlashAttn, ...) or a "
                            f"kvnumba.remote.RemoteView, got {type(view).__name__}")
        if isinstance(view, views.LayerTable):
            raise TypeError(f"{name} is a kv.LayerTable: it holds raw addresses, and NIXL needs to know the memory "
                            "it registers; use kv.LayerFirst over the same per-layer arrays")
        parts = view.parts
        assert parts is not None  # every view has its parts
        g = view.geometry
        kinds = KINDS[:1] if view.mla else KINDS
        buffers: list[tuple[int, int]] = []
        places: list[tuple[str, int]] = []
        bases, buffer_of = [], []
        for which in kinds:
            infos = [array_info(b, f"{name}.{which}") for b in view.buffers(which)]
            index = []
            for info in infos:
                key = (info.ptr, info.nbytes)
                if key not in buffers:
                    buffers.append(key)
                    places.append(_place(info))
                index.append(buffers.index(key))
            if parts.table:
                addresses = view.layer_addresses(which) if hasattr(view, "layer_addresses") else [i.ptr for i in infos]
                bases.append([int(a) for a in addresses])
                buffer_of.append(index)
            else:
                bases.append([infos[0].ptr] * g.layers)
                buffer_of.append([index[0]] * g.layers)
        if len(set(places)) != 1:
            raise ValueError(f"{name}: its buffers lie in different memories ({sorted(set(places))}); "
                             "a view's buffers must all be on one GPU, or all in host memory")
        mem, device = places[0]
        return cls(view_class=_class_name(type(view)), options=_options(view), parts_name=parts.name, geometry=g,
                   mla=view.mla, bases=bases, buffer_of=buffer_of, buffers=buffers, mem=mem, device=device)

    def header(self) -> dict[str, Any]:
        """What an export carries of this side (JSON-able)."""
        g = self.geometry
        return {"class": self.view_class, "options": self.options, "parts": self.parts_name, "mla": self.mla,
                "geometry": {a: getattr(g, a) for a in views.Geometry.__slots__},
                "bases": self.bases.tolist(), "buffer_of": self.buffer_of.tolist(),
                "buffers": [list(b) for b in self.buffers], "mem": self.mem, "device": self.device}

    @classmethod
    def from_header(cls, side: dict[str, Any]) -> Side:
        """The side an export describes: ``side`` is its header's ``side``, checked by
        ``kvnumba.remote.header.read`` (``ExportError`` here only for a user layout unknown in this process)."""
        return cls(view_class=side["class"], options=side["options"], parts_name=side["parts"],
                   geometry=side["geometry"], mla=side["mla"], bases=side["bases"], buffer_of=side["buffer_of"],
                   buffers=[(int(a), int(n)) for a, n in side["buffers"]], mem=side["mem"], device=side["device"])

    def buffer_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of ``buffers``, int64 arrays indexed like ``buffer_of``'s values."""
        ranges = np.array(self.buffers, dtype=np.int64).reshape(-1, 2)
        return ranges[:, 0], ranges[:, 0] + ranges[:, 1]

    # --- addresses ---------------------------------------------------------------------------------

    def layer_parts(self, layers: np.ndarray, heads: int) -> np.ndarray:
        """The layer part of every (kind, layer) of ``layers``, shaped ``(kinds, len(layers))``."""
        g = self.geometry
        layer_base = self.parts.py[0]
        if self.parts.table:
            return self.bases[:, layers]
        return np.array([[layer_base(int(self.bases[k, layer]), int(layer), g.layout_dim, g.item_bytes, heads,
                                     g.page_size) for layer in layers] for k in range(self.kinds)], dtype=np.int64)

    def items(self, tokens: np.ndarray, layers: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
        """Addresses and buffer indices of every chunk ``(kind, layer, token, head)`` of ``tokens``
        (int64 ``[N]``) over ``layers``, a chunk being an item split into ``heads`` equal parts; both
        shaped ``(kinds, len(layers), N, heads)``."""
        g = self.geometry
        _, token_offset, head_stride = self.parts.py
        offsets = _elementwise(token_offset, tokens, g.layout_dim, g.item_bytes, heads, g.page_size)
        stride = int(head_stride(g.layout_dim, g.item_bytes, heads, g.page_size))
        head_part = np.arange(heads, dtype=np.int64) * stride
        address = (self.layer_parts(layers, heads)[:, :, None, None] + offsets[None, None, :, None]
                   + head_part[None, None, None, :])
        buffer = np.broadcast_to(self.buffer_of[:, layers][:, :, None, None], address.shape)
        return address, buffer


def check_writable(view: views.CacheView, name: str) -> None:
    """Every buffer of ``view`` (a local view a copy writes, or one exported writable) is writable as it is
    now; else the ``ValueError`` of a read-only destination, naming the buffer (``dst.k[2]``)."""
    for which in KINDS[:1] if view.mla else KINDS:
        buffers = view.buffers(which)
        for i, buffer in enumerate(buffers):
            info = array_info(buffer, f"{name}.{which}")
            if not info.writable:
                validate.writable(f"{name}.{which}" + (f"[{i}]" if view.per_layer else ""), info)


def writable(view: views.CacheView) -> bool:
    """Whether every buffer of ``view`` is writable now (``check_writable`` would pass)."""
    try:
        check_writable(view, "view")
    except ValueError:
        return False
    return True


def _elementwise(function: Any, tokens: np.ndarray, *args: int) -> np.ndarray:
    """``function(token, *args)`` for every token: at once where its arithmetic takes arrays (every
    built-in layout's does), else token by token."""
    try:
        out = np.asarray(function(tokens, *args), dtype=np.int64)
        if out.shape == tokens.shape:
            return out
    except Exception:  # noqa: BLE001 - a user's function written for one integer: go token by token
        pass
    return np.array([function(int(t), *args) for t in tokens], dtype=np.int64)


def _place(info: Any) -> tuple[str, int]:
    """NIXL's memory type and device id of an array (everything is host memory on the simulator)."""
    if SIMULATOR or not info.on_device:
        return "DRAM", 0
    return "VRAM", int(info.device)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _options(view: views.CacheView) -> dict[str, Any]:
    options = {key: value for key, value in view._options().items() if isinstance(value, (int, str, type(None)))}
    if isinstance(view, views.LayerFirst):
        options["per_layer"] = view.per_layer
    return options


def find_parts(name: str) -> layouts.LayoutParts:
    """The ``LayoutParts`` named ``name``: a built-in layout, or that of a ``CacheView`` subclass defined
    in this process (import its module first). ``ExportError`` otherwise."""
    parts = _BUILT_IN_PARTS.get(name)
    if parts is not None:
        return parts
    for cls in _subclasses(views.CacheView):
        if cls.user_layout and cls.parts is not None and cls.parts.name == name:
            return cls.parts
    from ..errors import ExportError

    raise ExportError(f"the export's layout {name!r} is not known here: it is a user layout (a kv.CacheView "
                      "subclass); import the module that defines it before connecting")


def find_class(name: str) -> type[views.CacheView] | None:
    """The view class named ``module:qualname`` if it is loaded in this process (never imports)."""
    candidates: list[type[views.CacheView]] = [views.CacheView, *_subclasses(views.CacheView)]
    for cls in candidates:
        if _class_name(cls) == name:
            return cls
    return None


def _subclasses(cls: type[views.CacheView]) -> list[type[views.CacheView]]:
    found: list[type[views.CacheView]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found
