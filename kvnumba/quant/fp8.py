"""The FP8 codecs (``E4M3``, ``E5M2``): one byte per element and one float32 scale per (token, layer, K/V, head),
kept in an array of their own; the format defined once, with ``ml_dtypes``, and its NumPy reference
(``quantise``, ``dequantise``); the kernels (``kvnumba.kernels.fp8``) read the constants here and match it bit
for bit.

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

``quantise``/``dequantise`` work on arrays whose last axis is a head's ``D`` elements; ``kv.copy`` with
``kv.Fp8View`` s over NumPy buffers is ``kvnumba.quant_reference.copy``.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .codec import Codec, ScaleHome


class Fp8Codec(Codec):
    """One FP8 format: its constants, and the reference (see the module docstring)."""

    family, code_bits, group, scale_dtype, scales = "fp8", 8, 0, np.float32, ScaleHome.ARRAY
    kernels = "kvnumba.kernels.fp8"

    def __init__(self, name: str, dtype: Any, max_value: float, max_code: int, nan_code: int, exponent_bits: int,
                 mantissa_bits: int, bias: int, ieee: bool, special_from: int) -> None:
        self.name, self.dtype, self.max_value = name, dtype, max_value  # dtype: the ml_dtypes type
        self.max_code, self.nan_code = max_code, nan_code  # codes of +FMT_MAX and of a NaN (| 0x80: negative)
        self.exponent_bits, self.mantissa_bits, self.bias = exponent_bits, mantissa_bits, bias
        # The device side's facts (kvnumba.kernels.fp8): ``ieee``, the top exponent holds infinities and NaNs
        # (else only the all-ones magnitude is NaN); ``special_from``, the first magnitude that the GPU's packed
        # conversions do not take (NaN, and for an IEEE format infinity)
        self.ieee, self.special_from = ieee, special_from

    def quantise(self, x: Any, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        return quantise(x, self.name, dtype)

    def dequantise(self, codes: Any, scales: Any, dtype: str = "bfloat16") -> np.ndarray:
        return dequantise(codes, scales, dtype, self.name)


E4M3 = Fp8Codec("e4m3", ml_dtypes.float8_e4m3fn, 448.0, 0x7E, 0x7F, 4, 3, 7, False, 0x7F)
E5M2 = Fp8Codec("e5m2", ml_dtypes.float8_e5m2, 57344.0, 0x7B, 0x7E, 5, 2, 15, True, 0x7C)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}

PLAIN_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
CANONICAL_NAN = {"bfloat16": 0x7FC0, "float16": 0x7E00}


def fp8_format(fmt: Any) -> Fp8Codec:
    """The format named ``fmt`` (``"e4m3"`` or ``"e5m2"``, or the codec itself); ``ValueError`` otherwise."""
    if isinstance(fmt, Fp8Codec):
        return fmt
    found = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if found is None:
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2', got {fmt!r}")
    return found


def plain_dtype(dtype: Any) -> str:
    """``"bfloat16"`` or ``"float16"`` for a dtype (NumPy, ml_dtypes, torch or its name); ``TypeError``
    otherwise."""
    name = str(getattr(dtype, "name", dtype)).removeprefix("torch.")
    if name in ("bfloat16", "float16"):
        return name
    if name == "half":
        return "float16"
    raise TypeError(f"an FP8 cache quantises bfloat16 or float16 values, got dtype {dtype!r}")


def as_plain(x: Any, dtype: str | None) -> np.ndarray:
    """``x`` as bfloat16/float16 values: their own dtype, or uint16 bit patterns viewed as ``dtype``."""
    x = np.asarray(x)
    if x.dtype.name in PLAIN_DTYPES:
        if dtype is not None and plain_dtype(dtype) != x.dtype.name:
            raise TypeError(f"x is {x.dtype.name} but dtype={dtype!r}")
        return x
    if x.dtype.itemsize == 2 and x.dtype.kind in "ui":
        if dtype is None:
            raise TypeError(f"x holds {x.dtype.name} bit patterns: say which dtype they are (dtype='bfloat16' or "
                            "'float16')")
        return x.view(PLAIN_DTYPES[plain_dtype(dtype)])
    raise TypeError(f"x must be bfloat16 or float16 (or uint16 bit patterns with dtype=), got {x.dtype.name}")


def quantise(x: Any, fmt: str = "e4m3", dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(codes uint8 [..., D], scales float32 [..., 1])`` of ``x`` (bfloat16 or float16 ``[..., D]``, or
    uint16 bit patterns with ``dtype=``), one scale per head: the last axis (see the module docstring)."""
    f = fp8_format(fmt)
    x = as_plain(x, dtype)
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
    nan_code = (magnitude > 0x7C) if f.ieee else (magnitude == 0x7F)
    out = np.where(nan_code | np.isnan(product), sign | CANONICAL_NAN[name], out).astype(np.uint16)
    return out.view(PLAIN_DTYPES[name])


__all__ = ["CANONICAL_NAN", "E4M3", "E5M2", "FORMATS", "PLAIN_DTYPES", "Fp8Codec", "dequantise",
           "fp8_format", "plain_dtype", "quantise"]
