"""What an export's header may say: every field checked when the export is connected (``Agent.connect``).

An export's bytes are not to be trusted (anyone can edit a header and recompute its checksum), so ``read``
checks every field before anything is loaded into NIXL or planned, and raises ``ExportError`` naming the
one that is missing, of the wrong type, out of range or inconsistent. What a consistent forgery could still
claim is refused by the export's token (``kvnumba.remote.tokens``; docs/guides/remote.md, "Guarantees").
"""
from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from ..layouts import Geometry
from ..checks.validate import MAX_SIZE
from ..errors import ExportError
from ..kernels import layouts

ADDRESS_LIMIT = 2**63  # addresses and ends of ranges: the plans' int64 arithmetic
MEMORIES = ("DRAM", "VRAM")
MAX_DEVICE = 2**16


class Region(NamedTuple):
    """One NIXL registration of the exporter: ``(mem, device, address, nbytes, serial)``."""

    mem: str
    device: int
    address: int
    nbytes: int
    serial: int


class Header(NamedTuple):
    agent: str
    instance: int
    export: int
    token: int  # the token slot's address in the exporter
    nixl: str
    writable: bool  # whether the exporter lets a peer write the view
    regions: tuple[Region, ...]
    side: dict[str, Any]  # the side's fields, checked (``Side.from_header`` reads them)


def read(header: Any, blobs: list[bytes], name: str = "exported") -> Header:
    """The checked header of an export whose blobs are ``blobs``; ``ExportError`` naming the field otherwise."""
    f = _Fields(name)
    top = f.mapping(header, "its header")
    agent = f.text(f.get(top, "agent"), "agent")
    instance = f.integer(f.get(top, "instance"), "instance", 1, ADDRESS_LIMIT)
    export_id = f.integer(f.get(top, "export"), "export", 1, ADDRESS_LIMIT)
    token = f.integer(f.get(top, "token"), "token", 1, ADDRESS_LIMIT - 8)
    if token % 8:
        raise ExportError(f"{name}: token = 0x{token:x} is not 8-byte aligned")
    nixl = f.text(f.get(top, "nixl"), "nixl")
    writable = f.boolean(f.get(top, "writable"), "writable")
    regions = tuple(_region(f, item, f"regions[{i}]") for i, item in
                    enumerate(f.sequence(f.get(top, "regions"), "regions", minimum=1)))
    if len(regions) != len(blobs):
        raise ExportError(f"{name}: it has {len(blobs)} blobs of NIXL metadata for {len(regions)} registered regions "
                          "(regions): one blob per region")
    digests = f.sequence(f.get(top, "blobs"), "blobs", length=len(blobs))
    for i, (digest, blob) in enumerate(zip(digests, blobs)):
        if digest != hashlib.sha256(blob).hexdigest():
            raise ExportError(f"{name}: blob {i} does not match its digest (blobs[{i}]): NIXL metadata that is not "
                              "the exporter's")
    side = _side(f, f.mapping(f.get(top, "side"), "side"))
    mem, device = side["mem"], side["device"]
    for i, (address, nbytes) in enumerate(side["buffers"]):
        if nbytes and not _inside(regions, mem, device, address, nbytes):
            raise ExportError(f"{name}: side.buffers[{i}] ({nbytes} bytes at 0x{address:x}, {mem} {device}) is not "
                              "in memory the export registered (regions)")
    if not _inside(regions, "DRAM", 0, token, 8):
        raise ExportError(f"{name}: token = 0x{token:x} is not in memory the export registered (regions)")
    return Header(agent, instance, export_id, token, nixl, writable, regions, side)


def check_reach(side: Any, name: str = "exported") -> None:
    """The first and last token of every layer of ``side`` (a ``Side``), every head, lie in the buffer
    the side says holds that layer; ``ExportError`` naming the layer otherwise. (Every copy also checks
    each of its descriptors: ``Agent.copy``.)"""
    g = side.geometry
    heads = layouts.head_runs(side.parts, g.heads)
    tokens = np.unique(np.array([0, g.tokens - 1], dtype=np.int64))
    layers = np.arange(g.layers, dtype=np.int64)
    address, buffer = side.items(tokens, layers, side.geometry.item_bytes, heads)
    starts, ends = side.buffer_ranges()
    chunk = g.item_bytes // heads
    outside = (address < starts[buffer]) | (address + chunk > ends[buffer])
    if outside.any():
        kind, layer, token, _ = (int(i) for i in np.argwhere(outside)[0])
        raise ExportError(f"{name}: token {int(tokens[token])} of layer {layer} ({'KV'[kind]}) would lie outside "
                          f"side.buffers[{int(buffer[kind, layer, token, 0])}]: side.bases, side.geometry and "
                          "side.buffers do not agree")


def _inside(regions: tuple[Region, ...], mem: str, device: int, address: int, nbytes: int) -> bool:
    return any(r.mem == mem and r.device == device and r.address <= address and address + nbytes <= r.address + r.nbytes
               for r in regions)


def _region(f: _Fields, item: Any, path: str) -> Region:
    values = f.sequence(item, path, length=5)
    mem = f.choice(values[0], f"{path}[0] (memory)", MEMORIES)
    device = f.integer(values[1], f"{path}[1] (device)", 0, MAX_DEVICE)
    address = f.integer(values[2], f"{path}[2] (address)", 0, ADDRESS_LIMIT)
    nbytes = f.integer(values[3], f"{path}[3] (bytes)", 1, ADDRESS_LIMIT - address)
    serial = f.integer(values[4], f"{path}[4] (serial)", 1, ADDRESS_LIMIT)
    return Region(mem, device, address, nbytes, serial)


def _side(f: _Fields, side: dict[str, Any]) -> dict[str, Any]:
    """The side's fields, each checked, in the form ``Side.from_header`` reads."""
    view_class = f.text(f.get(side, "class", "side."), "side.class")
    options = f.mapping(f.get(side, "options", "side."), "side.options")
    for key, value in options.items():
        if type(value) not in (int, str, bool, type(None)):
            raise ExportError(f"{f.name}: side.options[{key!r}] must be an integer, a string, a boolean or null, got "
                              f"{type(value).__name__}")
    parts = f.text(f.get(side, "parts", "side."), "side.parts")
    mla = f.boolean(f.get(side, "mla", "side."), "side.mla")
    g = f.mapping(f.get(side, "geometry", "side."), "side.geometry")
    sizes = {}
    for key, low in (("layers", 1), ("tokens", 1), ("heads", 1), ("item_bytes", 8), ("layout_dim", 0)):
        sizes[key] = f.integer(f.get(g, key, "side.geometry."), f"side.geometry.{key}", low, MAX_SIZE + 1)
    sizes["page_size"] = f.integer(f.get(g, "page_size", "side.geometry."), "side.geometry.page_size", 1,
                                   sizes["tokens"] + 1)  # a page is no longer than the view
    dtype = f.text(f.get(g, "dtype", "side.geometry."), "side.geometry.dtype")
    if sizes["item_bytes"] % 8 or sizes["item_bytes"] % sizes["heads"]:
        raise ExportError(f"{f.name}: side.geometry.item_bytes = {sizes['item_bytes']} is not a multiple of 8 bytes "
                          f"split into side.geometry.heads = {sizes['heads']} heads")
    geometry = Geometry(sizes["layers"], sizes["tokens"], sizes["page_size"], sizes["heads"], sizes["item_bytes"],
                        sizes["layout_dim"], dtype)
    kinds, layers = 1 if mla else 2, geometry.layers
    buffers = [tuple(f.integer(v, f"side.buffers[{i}][{j}]", 0, ADDRESS_LIMIT) for j, v in
                     enumerate(f.sequence(b, f"side.buffers[{i}]", length=2)))
               for i, b in enumerate(f.sequence(f.get(side, "buffers", "side."), "side.buffers", minimum=1))]
    for i, (address, nbytes) in enumerate(buffers):
        if address + nbytes > ADDRESS_LIMIT:
            raise ExportError(f"{f.name}: side.buffers[{i}] ends past 2**63")
    rows = {}
    for key, high in (("bases", ADDRESS_LIMIT), ("buffer_of", len(buffers))):
        table = f.sequence(f.get(side, key, "side."), f"side.{key}", length=kinds)
        rows[key] = [[f.integer(v, f"side.{key}[{k}][{layer}]", 0, high) for layer, v in
                      enumerate(f.sequence(row, f"side.{key}[{k}]", length=layers))] for k, row in enumerate(table)]
    for k in range(kinds):
        held = sum(buffers[b][1] for b in set(rows["buffer_of"][k]))
        needed = layers * geometry.tokens * geometry.item_bytes
        if needed > held:
            raise ExportError(f"{f.name}: side.geometry says {layers} layers x {geometry.tokens} tokens x "
                              f"{geometry.item_bytes} bytes = {needed} bytes of {'KV'[k]}, but its buffers "
                              f"(side.buffers) hold {held}")
    mem = f.choice(f.get(side, "mem", "side."), "side.mem", MEMORIES)
    device = f.integer(f.get(side, "device", "side."), "side.device", 0, MAX_DEVICE)
    return {"class": view_class, "options": options, "parts": parts, "mla": mla, "geometry": geometry,
            "bases": rows["bases"], "buffer_of": rows["buffer_of"], "buffers": buffers, "mem": mem, "device": device}


class _Fields:
    """The checks of one header's fields: each raises ``ExportError`` naming the field (``name``: the
    argument, ``exported``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _wrong(self, path: str, expected: str, value: Any) -> ExportError:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return ExportError(f"{self.name}: {path} must be {expected}, got {type(value).__name__} {shown}")

    def get(self, mapping: dict[str, Any], key: str, prefix: str = "") -> Any:
        if key not in mapping:
            raise ExportError(f"{self.name}: its header has no {prefix}{key}")
        return mapping[key]

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._wrong(path, "a JSON object", value)
        return value

    def sequence(self, value: Any, path: str, length: int | None = None, minimum: int = 0) -> list[Any]:
        if not isinstance(value, list):
            raise self._wrong(path, "a list", value)
        if length is not None and len(value) != length:
            raise ExportError(f"{self.name}: {path} must hold {length} entries, got {len(value)}")
        if len(value) < minimum:
            raise ExportError(f"{self.name}: {path} must hold at least {minimum} entries, got {len(value)}")
        return value

    def integer(self, value: Any, path: str, low: int, high: int) -> int:
        """An integer in ``[low, high)``."""
        if type(value) is not int:
            raise self._wrong(path, "an integer", value)
        if not low <= value < high:
            raise ExportError(f"{self.name}: {path} = {value} is out of range: expected {low} <= {path} < {high}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if type(value) is not bool:
            raise self._wrong(path, "true or false", value)
        return value

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value or len(value) > 512:
            raise self._wrong(path, "a non-empty string (at most 512 characters)", value)
        return value

    def choice(self, value: Any, path: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self._wrong(path, f"one of {', '.join(choices)}", value)
        return str(value)
