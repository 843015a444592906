"""One side of a remote copy: the ``Side`` of ``kvnumba.plan.sides`` made from a local ``kv.CacheView``
(``of_view``) or from an export's header (``from_header``), so both ends are planned by the same code.

``bases[kind][layer]`` is the layer's address for a table layout, else the buffer's; ``buffer_of[kind][layer]``
the index in ``buffers`` (``(address, bytes)`` of each distinct buffer) holding that kind's layer.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ..arrays import array_info
from ..checks import validate
from ..checks.user_layouts import kind_offset as checked_kind_offset
from ..driver.target import SIMULATOR
from ..kernels import layouts
from ..layouts.base import CacheView, Geometry, declared
from ..plan.sides import KINDS, Side


class Origin(NamedTuple):
    """What an export says of the view a side came from."""

    view_class: str  # module:qualname of its class
    options: dict[str, Any]  # its constructor's options (page_size, layout, per_layer)
    mem: str  # NIXL's memory type: "DRAM" or "VRAM"
    device: int  # NIXL's device id (0 for host memory)

    @property
    def class_name(self) -> str:
        return self.view_class.rsplit(":", 1)[-1]


def _side(name: str, origin: Origin, parts: layouts.LayoutParts, geometry: Geometry, mla: bool,
          bases: list[list[int]], buffer_of: list[list[int]], buffers: list[tuple[int, int]]) -> Side:
    return Side(name=name, label=origin.class_name, parts=parts, mla=mla, layout_dim=geometry.layout_dim,
                page_size=geometry.page_size, tokens=geometry.tokens, geometry=geometry, bases=bases,
                buffer_of=buffer_of, buffers=buffers, origin=origin)


def of_view(view: CacheView, name: str) -> Side:
    """The side of a local view; ``TypeError`` naming ``name`` for what cannot be one."""
    if not isinstance(view, CacheView):
        raise TypeError(f"{name} must be a kvnumba cache view (kv.PageFirst, kv.VllmFlashAttn, ...) or a "
                        f"kvnumba.remote.RemoteView, got {type(view).__name__}")
    if view.raw_tables:
        raise TypeError(f"{name} is a kv.{type(view).__name__}: it holds raw addresses, and NIXL needs to know the memory "
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
        offset = checked_kind_offset(view, which, [i.nbytes for i in infos], name)  # the class's word, checked
        if parts.table:
            bases.append([i.ptr + offset for i in infos])
            buffer_of.append(index)
        else:
            bases.append([infos[0].ptr + offset] * g.layers)
            buffer_of.append([index[0]] * g.layers)
    if len(set(places)) != 1:
        raise ValueError(f"{name}: its buffers lie in different memories ({sorted(set(places))}); "
                         "a view's buffers must all be on one GPU, or all in host memory")
    mem, device = places[0]
    origin = Origin(_class_name(type(view)), view.export_options(), mem, device)
    return _side(name, origin, parts, g, view.mla, bases, buffer_of, buffers)


def header(side: Side) -> dict[str, Any]:
    """What an export carries of a side made by ``of_view`` (JSON-able)."""
    g, origin = side.geometry, side.origin
    assert side.bases is not None and side.buffer_of is not None
    return {"class": origin.view_class, "options": origin.options, "parts": side.parts.name, "mla": side.mla,
            "geometry": {a: getattr(g, a) for a in Geometry.__slots__},
            "bases": side.bases.tolist(), "buffer_of": side.buffer_of.tolist(),
            "buffers": [list(b) for b in side.buffers], "mem": origin.mem, "device": origin.device}


def from_header(side: dict[str, Any], name: str = "remote") -> Side:
    """The side an export describes: ``side`` is its header's ``side``, checked by
    ``kvnumba.remote.header.read`` (``ExportError`` here only for a user layout unknown in this process)."""
    origin = Origin(side["class"], side["options"], side["mem"], side["device"])
    return _side(name, origin, find_parts(side["parts"]), side["geometry"], side["mla"], side["bases"],
                 side["buffer_of"], [(int(a), int(n)) for a, n in side["buffers"]])


def check_writable(view: CacheView, name: str) -> None:
    """Every buffer of ``view`` (a local view a copy writes, or one exported writable) is writable as it is
    now; else the ``ValueError`` of a read-only destination, naming the buffer (``dst.k[2]``)."""
    for which in KINDS[:1] if view.mla else KINDS:
        buffers = view.buffers(which)
        for i, buffer in enumerate(buffers):
            info = array_info(buffer, f"{name}.{which}")
            if not info.writable:
                validate.writable(f"{name}.{which}" + (f"[{i}]" if view.per_layer else ""), info)


def _place(info: Any) -> tuple[str, int]:
    """NIXL's memory type and device id of an array (everything is host memory on the simulator)."""
    if SIMULATOR or not info.on_device:
        return "DRAM", 0
    return "VRAM", int(info.device)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def find_parts(name: str) -> layouts.LayoutParts:
    """The ``LayoutParts`` named ``name``: that of a ``CacheView`` subclass defined in this process (kvnumba's,
    or yours: import its module first). ``ExportError`` otherwise."""
    for cls in declared():
        found = cls.parts_named(name)
        if found is not None:
            return found
    from ..errors import ExportError

    raise ExportError(f"the export's layout {name!r} is not known here: it is a user layout (a kv.CacheView "
                      "subclass); import the module that defines it before connecting")


def find_class(name: str) -> type[CacheView] | None:
    """The view class named ``module:qualname`` if it is loaded in this process (never imports)."""
    for cls in declared():  # (CacheView itself makes no view: it has no arithmetic)
        if _class_name(cls) == name:
            return cls
    return None
