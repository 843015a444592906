"""The NumPy reference for KV caches in FP8: the format, defined once, with ``ml_dtypes``; the kernels
(``kvnumba.kernels.fp8``, ``kvnumba.kernels.fp8_copy``) match it bit for bit.

Format
------
A quantised cache is a codes view and a scales view of the same view class (``kv.Fp8View``):

- codes: one byte per element (uint8 buffers holding FP8 bit patterns: ``"e4m3"`` is e4m3fn, 1 sign,
  4 exponent (bias 7), 3 mantissa bits, no infinities, NaN ``S.1111.111``, largest finite 448 = ``0x7E``;
  ``"e5m2"`` is IEEE-like, 1 sign, 5 exponent (bias 15), 2 mantissa bits, largest finite 57344 =
  ``0x7B``), items ``(H, D)`` (MLA: ``(D,)`` or ``(1, D)``), laid out as the view's layout lays out
  items of ``H * D`` bytes;
- scales: one float32 (4 bytes, little-endian IEEE binary32) per token, layer, K/V and head, items
  ``(H, 1)`` (MLA: ``(1,)`` or ``(1, 1)``), in the same layout: items of ``H * 4`` bytes.

Per head (``D`` elements ``x`` of a bfloat16 or float16 cache):

- ``amax`` = the largest ``|x|`` over the head's finite elements, in float32 (NaN and ±inf ignored; 0
  when there is none);
- ``scale`` = ``float32(amax) / float32(FMT_MAX)`` rounded to nearest even, ``FMT_MAX`` = 448 (e4m3) or
  57344 (e5m2);
- ``code(x)``: NaN -> ``sign | NAN_CODE`` (e4m3 ``0x7F``, e5m2 ``0x7E``: ``0x7F``/``0xFF``, ``0x7E``/``0xFE``);
  ±inf -> ``sign | MAX_CODE`` (e4m3 ``0x7E``, e5m2 ``0x7B``); else, when ``scale == 0`` (an all-zero
  head), ``0x00``; else ``fp8(float32(x) * inv)`` with ``inv = float32(1) / scale`` (both rounded to
  nearest even in float32), or ``fp8(float32(x) / scale)`` for the scales whose ``inv`` overflows to inf
  (below ``2**-128``); ``fp8`` rounds the float32 to nearest even, clamped to ±``FMT_MAX`` (so never inf
  or NaN), then rounded to nearest even into FP8 (subnormals kept; ``-0`` is ``0x80``). A product, not a
  quotient, so that a kernel pays one multiplication an element (as vLLM's FP8 quantisation does).

Dequantised (to bfloat16 or float16), per element:

- a NaN code (e4m3: ``c & 0x7F == 0x7F``; e5m2: ``c & 0x7F > 0x7C``) -> the canonical quiet NaN with the
  code's sign (bfloat16 ``0x7FC0``/``0xFFC0``, float16 ``0x7E00``/``0xFE00``);
- else ``p = float32(decode(c)) * scale`` rounded to nearest even in float32; if ``p`` is NaN (an e5m2
  infinity times a zero scale) the same canonical NaN with the code's sign; else ``p`` rounded to
  nearest even into bfloat16 (float16: overflow to ±inf).

``quantise``/``dequantise`` work on arrays whose last axis is a head's ``D`` elements; ``copy`` is
``kv.copy`` for views of which one or both are ``Fp8View`` s, over NumPy buffers.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .kernels.fp8_format import CANONICAL_NAN, FORMATS, PLAIN_DTYPES, Fp8Format, fp8_format, plain_dtype


def _as_plain(x: Any, dtype: str | None) -> tuple[np.ndarray, str]:
    x = np.asarray(x)
    if x.dtype.name in PLAIN_DTYPES:
        if dtype is not None and plain_dtype(dtype) != x.dtype.name:
            raise TypeError(f"x is {x.dtype.name} but dtype={dtype!r}")
        return x, x.dtype.name
    if x.dtype.itemsize == 2 and x.dtype.kind in "ui":
        if dtype is None:
            raise TypeError(f"x holds {x.dtype.name} bit patterns: say which dtype they are (dtype='bfloat16' or "
                            "'float16')")
        name = plain_dtype(dtype)
        return x.view(PLAIN_DTYPES[name]), name
    raise TypeError(f"x must be bfloat16 or float16 (or uint16 bit patterns with dtype=), got {x.dtype.name}")


def quantise(x: Any, fmt: str = "e4m3", dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(codes uint8 [..., D], scales float32 [..., 1])`` of ``x`` (bfloat16 or float16 ``[..., D]``, or
    uint16 bit patterns with ``dtype=``), one scale per head: the last axis (see the module docstring)."""
    f = fp8_format(fmt)
    x, _ = _as_plain(x, dtype)
    wide = x.astype(np.float32)
    finite = np.isfinite(wide)
    magnitude = np.where(finite, np.abs(wide), np.float32(0))
    amax = magnitude.max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,), np.float32)
    scales = (amax.astype(np.float32) / np.float32(f.max_value)).astype(np.float32)
    safe = np.where(scales == 0, np.float32(1), scales)
    with np.errstate(all="ignore"):
        inverse = (np.float32(1) / safe).astype(np.float32)
        finite_x = np.where(finite, wide, np.float32(0))
        quotient = np.where(np.isfinite(inverse), finite_x * inverse, finite_x / safe).astype(np.float32)
    quotient = np.clip(quotient, np.float32(-f.max_value), np.float32(f.max_value))
    codes = quotient.astype(f.dtype).view(np.uint8).copy()
    sign = np.signbit(wide).astype(np.uint8) << 7
    codes[np.broadcast_to(scales == 0, codes.shape) & finite] = 0
    codes = np.where(np.isinf(wide), sign | f.max_code, codes)
    codes = np.where(np.isnan(wide), sign | f.nan_code, codes).astype(np.uint8)
    return codes, scales


def dequantise(codes: Any, scales: Any, dtype: str = "bfloat16", fmt: str = "e4m3") -> np.ndarray:
    """bfloat16 (or float16) values of ``codes`` (uint8 ``[..., D]``) times ``scales`` (float32 ``[..., 1]``,
    broadcast over the last axis); see the module docstring."""
    f = fp8_format(fmt)
    name = plain_dtype(dtype)
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must be uint8 FP8 bit patterns, got {codes.dtype.name}")
    scales = np.asarray(scales, dtype=np.float32)
    with np.errstate(all="ignore"):
        product = (codes.view(f.dtype).astype(np.float32) * scales).astype(np.float32)
        out = product.astype(PLAIN_DTYPES[name]).view(np.uint16).copy()
    sign = (codes.astype(np.uint16) & 0x80) << 8
    magnitude = codes & 0x7F
    nan_code = (magnitude == 0x7F) if fmt == "e4m3" else (magnitude > 0x7C)
    out = np.where(nan_code | np.isnan(product), sign | CANONICAL_NAN[name], out).astype(np.uint16)
    return out.view(PLAIN_DTYPES[name])


# --- kv.copy with FP8 views -----------------------------------------------------------------------

def _heads(items: np.ndarray, heads: int) -> np.ndarray:
    """``[n, *item]`` as ``[n, H, last]``."""
    return items.reshape(items.shape[0], heads, -1)


def _gather(view: Any, which: str, layer: int, tokens: np.ndarray) -> np.ndarray:
    items = np.asarray(view.layer_items(which, layer))  # [pages, P, *item]
    page = items.shape[1]
    return items[tokens // page, tokens % page]


def _scatter(view: Any, which: str, layer: int, tokens: np.ndarray, values: np.ndarray) -> None:
    items = view.layer_items(which, layer)
    page = items.shape[1]
    items[tokens // page, tokens % page] = values.reshape((len(tokens),) + items.shape[2:]).view(items.dtype)


def copy(src_view: Any, dst_view: Any, src_indices: Any, dst_indices: Any, layers: Any = None) -> None:
    """``kv.copy`` where one or both views are ``kv.Fp8View`` s, over NumPy buffers, from each view's NumPy
    picture (``CacheView.logical``): a plain view -> an FP8 view quantises, FP8 -> plain dequantises, FP8 ->
    FP8 copies codes and scales. Destinations are written in place."""
    from .api.fp8_views import Fp8View, plan_window, plain_dtype_of

    src_indices = np.asarray(src_indices, dtype=np.int64)
    dst_indices = np.asarray(dst_indices, dtype=np.int64)
    first, count = plan_window(src_view, dst_view, layers)
    if len(src_indices) == 0:
        return
    src_q, dst_q = isinstance(src_view, Fp8View), isinstance(dst_view, Fp8View)
    fp8 = src_view if src_q else dst_view
    heads = fp8.heads
    for which in ("k",) if fp8.mla else ("k", "v"):
        for layer in range(first, first + count):
            if src_q and dst_q:
                for part in ("codes", "scales"):
                    values = _gather(getattr(src_view, part), which, layer, src_indices)
                    _scatter(getattr(dst_view, part), which, layer, dst_indices, values)
            elif dst_q:
                name = plain_dtype_of(src_view, dst_view)
                values = _heads(_gather(src_view, which, layer, src_indices), heads).view(np.uint16)
                codes, scales = quantise(values, dst_view.fmt, name)
                _scatter(dst_view.codes, which, layer, dst_indices, codes)
                _scatter(dst_view.scales, which, layer, dst_indices, scales)
            else:
                name = plain_dtype_of(dst_view, src_view)
                codes = _heads(_gather(src_view.codes, which, layer, src_indices), heads)
                scales = _heads(_gather(src_view.scales, which, layer, src_indices), heads)
                values = dequantise(codes, scales, name, src_view.fmt)
                _scatter(dst_view, which, layer, dst_indices, values.view(np.uint16))
