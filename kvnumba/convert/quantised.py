"""Quantised (FP8) cache files: ``kvnumba convert --dtype`` and ``kv.convert(path, ..., dtype=)`` quantise a
file's bfloat16/float16 cache into FP8 with its scales, dequantise such a file back, or (without ``--dtype``)
convert its layout keeping it quantised.

File format
-----------
A ``.safetensors`` file (``.npy``/``.npz`` have no float8 dtype). For every tensor ``X`` of the cache (whatever
the input names them), in the output's layout:

- ``X``: the codes, ``F8_E4M3`` (``fp8_e4m3``: e4m3fn) or ``F8_E5M2`` (``fp8_e5m2``), X's shape;
- ``X_scales``: ``F32``, X's shape with its last axis 1: one scale per token, layer and head;
- ``__metadata__``: the input's, plus ``"kvnumba.fp8": "e4m3"`` (or ``"e5m2"``) and ``"kvnumba.fp8_dtype":
  "bfloat16"`` (or ``"float16"``: the dtype that was quantised).

The last axis of every layout is one head's ``D`` elements, quantised together as ``kvnumba.quant.fp8`` defines
it: element ``i`` of a head is ``decode(X[..., i]) * X_scales[..., 0]``, so a reader needs nothing of kvnumba.

``dtype``: ``"fp8_e4m3"``/``"fp8_e5m2"`` quantise every tensor (bfloat16 or float16; a file already in that
format is only re-laid out, one in the other is refused); ``"bfloat16"``/``"float16"`` dequantise every ``X``
(a plain input of that dtype is only re-laid out); None re-lays out every tensor as it is. Each tensor is
converted whole, in memory, when the writer reaches it.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..quant.fp8 import FORMATS, PLAIN_DTYPES
from ..quant.fp8 import dequantise, quantise
from .inputs import Item, Source

__all__ = ["DTYPES", "FORMAT_KEY", "PLAIN_KEY", "SCALES_SUFFIX", "checked_dtype", "transformed"]

DTYPES = ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4")  # what dtype= / --dtype take (nvfp4:
# kvnumba.convert.nvfp4_pages)
SCALES_SUFFIX = "_scales"
FORMAT_KEY = "kvnumba.fp8"  # __metadata__: "e4m3" or "e5m2"
PLAIN_KEY = "kvnumba.fp8_dtype"  # __metadata__: "bfloat16" or "float16", the dtype quantised


def checked_dtype(dtype: Any) -> str | None:
    """``dtype`` if it is one of ``DTYPES`` (or None); ``ValueError`` naming it otherwise."""
    if dtype is None or (isinstance(dtype, str) and dtype in DTYPES):
        return dtype
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _format_of(dtype: np.dtype) -> str | None:
    """``"e4m3"`` or ``"e5m2"`` for those float8 dtypes, else None."""
    for name, f in FORMATS.items():
        if dtype == np.dtype(f.dtype):
            return name
    return None


def _pairs(source: Source) -> dict[str, tuple[Item, Item, str]]:
    """``{name: (codes, scales, fmt)}`` for every float8 tensor of ``source`` with its float32 ``name_scales``."""
    by_name = {item.name: item for item in source.items}
    found = {}
    for item in source.items:
        fmt = _format_of(item.dtype)
        scales = by_name.get(item.name + SCALES_SUFFIX)
        if (fmt is not None and scales is not None and scales.dtype == np.float32
                and tuple(scales.shape) == tuple(item.shape[:-1]) + (1,)):
            found[item.name] = (item, scales, fmt)
    return found


def transformed(source: Source, dtype: str | None, in_path: str) -> Source:
    """``source`` as the output holds it for ``dtype`` (see the module docstring): the same items, or quantised /
    dequantised ones (read when the writer reaches them); ``ValueError`` naming the tensor that cannot be."""
    dtype = checked_dtype(dtype)
    if dtype is None:
        return source
    pairs = _pairs(source)
    if dtype.startswith("fp8_"):
        fmt = dtype.removeprefix("fp8_")
        if pairs:
            held = {pair[2] for pair in pairs.values()}
            if held == {fmt}:
                return source
            raise ValueError(f"{in_path} is quantised as fp8_{'/fp8_'.join(sorted(held))}, not {dtype}: convert it "
                             "to bfloat16 first (--dtype bfloat16)")
        return _quantised(source, fmt, in_path)
    if not pairs:
        for item in source.items:
            if item.dtype != np.dtype(PLAIN_DTYPES[dtype]):
                raise ValueError(f"{in_path}[{item.name}]: --dtype {dtype} dequantises a quantised file (float8 "
                                 f"tensors X with float32 X{SCALES_SUFFIX}), or keeps {dtype} tensors; this one is "
                                 f"{item.dtype}")
        return source
    return _dequantised(source, pairs, dtype, in_path)


def _quantised(source: Source, fmt: str, in_path: str) -> Source:
    names = {item.name for item in source.items}
    plain = set()
    items = []
    for item in source.items:
        if item.dtype.name not in PLAIN_DTYPES:
            raise ValueError(f"{in_path}[{item.name}]: fp8_{fmt} quantises bfloat16 or float16 tensors, this one is "
                             f"{item.dtype}")
        if not item.shape:
            raise ValueError(f"{in_path}[{item.name}]: a scalar has no heads to quantise")
        if item.name + SCALES_SUFFIX in names:
            raise ValueError(f"{in_path}: the quantised file would hold two tensors named "
                             f"{item.name + SCALES_SUFFIX!r} (the scales of {item.name!r}, and the input's own)")
        plain.add(item.dtype.name)
        codes, scales = _one_at_a_time(item.load, lambda x: quantise(x, fmt))
        fp8 = np.dtype(FORMATS[fmt].dtype)
        items += [Item(item.name, item.shape, fp8, lambda codes=codes, fp8=fp8: codes().view(fp8)),
                  Item(item.name + SCALES_SUFFIX, tuple(item.shape[:-1]) + (1,), np.dtype(np.float32), scales)]
    metadata = dict(source.metadata or {}, **{FORMAT_KEY: fmt})
    if plain:
        metadata[PLAIN_KEY] = "/".join(sorted(plain))
    return Source(items, source.compressed, metadata)


def _dequantised(source: Source, pairs: dict[str, tuple[Item, Item, str]], dtype: str, in_path: str) -> Source:
    scale_names = {scales.name for _, scales, _ in pairs.values()}
    items = []
    for item in source.items:
        if item.name in scale_names:
            continue
        if item.name not in pairs:
            raise ValueError(f"{in_path}[{item.name}]: --dtype {dtype} dequantises float8 tensors with their "
                             f"float32 {item.name + SCALES_SUFFIX}; this one is {item.dtype}"
                             + ("" if _format_of(item.dtype) is None else " without its scales"))
        codes, scales, fmt = pairs[item.name]

        def load(codes: Item = codes, scales: Item = scales, fmt: str = fmt) -> np.ndarray:
            return dequantise(np.asarray(codes.load()).view(np.uint8), scales.load(), dtype, fmt)

        items.append(Item(item.name, item.shape, np.dtype(PLAIN_DTYPES[dtype]), load))
    metadata = {k: v for k, v in (source.metadata or {}).items() if k not in (FORMAT_KEY, PLAIN_KEY)}
    return Source(items, source.compressed, metadata or None)


def _one_at_a_time(load: Callable[[], Any], split: Callable[[Any], tuple[np.ndarray, np.ndarray]]
                   ) -> tuple[Callable[[], np.ndarray], Callable[[], np.ndarray]]:
    """Two loaders of ``split(load())``'s two parts, computed once for both (and dropped once both were read)."""
    held: list[Any] = []

    def part(i: int) -> Callable[[], np.ndarray]:
        def read() -> np.ndarray:
            if not held:
                held.extend([*split(np.asarray(load())), 0])
            value = held[i]
            held[2] += 1
            if held[2] == 2:
                held.clear()
            return value
        return read

    return part(0), part(1)
