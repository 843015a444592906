"""The NVFP4 codec as vLLM stores its KV cache (``kv_cache_dtype="nvfp4"``), and its NumPy reference.

Pages
-----
A layer's cache is a uint8 tensor ``(blocks, 2, block_size, heads, D/2 + D/16)`` (vLLM's
``nvfp4_kv_cache_full_dim``: 72 at ``D = 128``), NHD or HND by its strides (HND: the heads' stride is larger
than the tokens'). The last axis only sizes the page: a token's codes and scales are not next to each other.
Each page holds K then V, and each side is a data region then a scale region (vLLM's
``nvfp4_split_data_scale``, ``csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu``)::

    [K_data | K_scale | V_data | V_scale]
    data:  heads x block_size x D/2 bytes   NHD: (token * heads + head) * D/2,  HND: (head * block_size + token) * D/2
    scale: heads x block_size x D/16 bytes  NHD: (token * heads + head) * D/16, HND: (head * block_size + token) * D/16

A head's ``D/2`` data bytes hold two e2m1 codes a byte, element ``2j`` in the low nibble of byte ``j`` and
``2j + 1`` in its high nibble (``pack_fp4``: ``cvt.rn.satfinite.e2m1x2.f32 d, b, a`` puts ``a``, the first, low).
Its ``D/16`` scale bytes are e4m3 (e4m3fn bits), one per 16 elements. A per-tensor float32 ``global_scale``
(the checkpoint's ``k_scale`` or ``v_scale``) multiplies every block scale; it lives beside the cache. The
V scales are linear, as vLLM writes them on SM12x; SM100's 4-token swizzle of V scales is refused.

Quantising (``reshape_and_cache_nvfp4_kernel`` with ``cvt_warp_fp16_to_fp4``,
``csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh``; the default scale search), per 16 elements ``x``
of bfloat16 or float16, in float32:

- ``s = 1 / global_scale`` (IEEE division: vLLM's ``1.0f / *k_scale_ptr``);
- ``vmax`` = the largest ``|x|``, NaN ignored (``__hmax``), NaN if all are NaN; infinities count;
- ``sf = s * (vmax * RCP6)``, ``RCP6`` = float32(1/6) (vLLM: ``rcp.approx.ftz(6.0f)``); stored as e4m3,
  rounded to nearest even and saturated (``satfinite``: infinity gives 448, NaN the NaN code ``0x7F``);
- ``out = rcp(float(sf) * rcp(s))`` where ``float(sf) != 0``, else 0; ``rcp(a)`` = float32 ``1 / a`` with
  subnormal inputs and results flushed to zero (vLLM: ``rcp.approx.ftz``, which may differ from it by an ulp);
- a code: ``x * out`` rounded to nearest even onto e2m1's grid (0, 0.5, 1, 1.5, 2, 3, 4, 6), saturated at 6,
  with its sign (so ``-0`` is ``0x8``); NaN gives ``0x7`` (``satfinite``: e2m1 has no NaN).

Dequantising: ``e2m1(c) * s`` with ``s = float(sf) * global_scale`` (each product rounded to nearest even in
float32; so a block is FP8 dequantisation of the e4m3 codes of its e2m1 values, exact, with scale ``s``), then
into bfloat16 (float16: overflow to infinity); a NaN (a NaN scale code) gives the canonical quiet NaN with the
code's sign.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .codec import Codec, ScaleHome
from .fp8 import CANONICAL_NAN, PLAIN_DTYPES, as_plain, plain_dtype

GROUP = 16  # elements per scale
RCP6 = np.float32(1) / np.float32(6)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)  # magnitudes of codes 0..7
LAYOUTS = ("NHD", "HND")


def full_dim(head_dim: int) -> int:
    """The cache tensor's last axis for heads of ``head_dim``: ``D/2 + D/16`` (vLLM's ``nvfp4_kv_cache_full_dim``)."""
    return head_dim // 2 + head_dim // GROUP


def head_dim_of(full: int) -> int:
    """``D`` of a cache whose last axis is ``full`` (``9 D / 16``); ``ValueError`` where there is none."""
    if full <= 0 or full % 9:
        raise ValueError(f"an NVFP4 cache's last axis is D/2 + D/16 bytes (72 for D = 128), got {full}")
    return full // 9 * 16


def _rcp(a: np.ndarray) -> np.ndarray:
    """float32 ``1 / a``, subnormal inputs and results flushed to zero (``rcp.approx.ftz``)."""
    a = np.asarray(a, np.float32)
    tiny = np.float32(np.finfo(np.float32).tiny)
    with np.errstate(all="ignore"):
        r = np.float32(1) / np.where(np.abs(a) < tiny, np.copysign(np.float32(0), a), a)
    return np.where(np.abs(r) < tiny, np.copysign(np.float32(0), r), r).astype(np.float32)


def _e4m3(values: np.ndarray) -> np.ndarray:
    """e4m3fn bits of non-negative float32 ``values``, to nearest even, saturated; NaN -> ``0x7F``."""
    clipped = np.clip(np.nan_to_num(values, nan=0.0), 0, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where(np.isnan(values), np.uint8(0x7F), clipped).astype(np.uint8)


def _e2m1(p: np.ndarray) -> np.ndarray:
    """e2m1 codes of float32 ``p``, to nearest even (vLLM's ``round_to_nearest_e2m1`` thresholds), saturated."""
    a = np.abs(p)
    index = ((a > 0.25).astype(np.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5)
             + (a > 5)).astype(np.uint8)
    codes = (np.signbit(p).astype(np.uint8) << 3) | index
    return np.where(np.isnan(p), np.uint8(7), codes).astype(np.uint8)


def _global(global_scale: Any) -> np.float32:
    value = np.float32(global_scale)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"global_scale must be a finite float32 above 0, got {global_scale!r}")
    return value


def quantise(x: Any, global_scale: Any = 1.0, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(data uint8 [..., D/2], scales uint8 [..., D/16])`` of ``x`` (bfloat16 or float16 ``[..., D]``, ``D`` a
    multiple of 16, or uint16 bit patterns with ``dtype=``) under ``global_scale`` (see the module docstring)."""
    x = as_plain(x, dtype)
    if x.ndim == 0 or x.shape[-1] == 0 or x.shape[-1] % GROUP:
        raise ValueError(f"x's last axis must be a multiple of {GROUP} elements, got shape {x.shape}")
    s = np.float32(1) / _global(global_scale)
    wide = x.astype(np.float32).reshape(x.shape[:-1] + (-1, GROUP))
    with np.errstate(all="ignore"):
        vmax = np.where(np.isnan(wide), -np.inf, np.abs(wide)).max(axis=-1).astype(np.float32)
        vmax = np.where(np.isneginf(vmax), np.float32(np.nan), vmax).astype(np.float32)
        sf = (s * (vmax * RCP6).astype(np.float32)).astype(np.float32)
        scales = _e4m3(sf)
        sf_value = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        out = np.where(sf_value != 0, _rcp((sf_value * _rcp(s)).astype(np.float32)), np.float32(0)).astype(np.float32)
        codes = _e2m1((wide * out[..., None]).astype(np.float32)).reshape(x.shape[:-1] + (-1, 2))
    data = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)
    return data, scales


def dequantise(data: Any, scales: Any, global_scale: Any = 1.0, dtype: str = "bfloat16") -> np.ndarray:
    """bfloat16 (or float16) ``[..., D]`` of ``data`` (uint8 ``[..., D/2]``) and ``scales`` (uint8 e4m3 bits
    ``[..., D/16]``) under ``global_scale`` (see the module docstring)."""
    name = plain_dtype(dtype)
    data, scales = np.asarray(data), np.asarray(scales)
    for label, array in (("data", data), ("scales", scales)):
        if array.dtype != np.uint8:
            raise TypeError(f"{label} must be uint8, got {array.dtype.name}")
    if data.ndim == 0 or data.shape[:-1] != scales.shape[:-1] or data.shape[-1] != 8 * scales.shape[-1]:
        raise ValueError(f"data [..., D/2] and scales [..., D/16] do not fit: {data.shape} and {scales.shape}")
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(data.shape[:-1] + (-1, GROUP))
    sign = np.where(codes & 8, np.float32(-1), np.float32(1))
    sf = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[..., None]
    with np.errstate(all="ignore"):
        p = (sign * E2M1[codes & 7] * (sf * _global(global_scale)).astype(np.float32)).astype(np.float32)
        out = p.astype(PLAIN_DTYPES[name]).view(np.uint16)
    nan = ((codes.astype(np.uint16) & 8) << 12) | CANONICAL_NAN[name]
    out = np.where(np.isnan(p), nan, out).astype(np.uint16)
    return out.reshape(data.shape[:-1] + (-1,)).view(PLAIN_DTYPES[name])


def regions(cache: np.ndarray, heads: int, block_size: int, head_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Writable NumPy views of one layer's pages (``cache``: its uint8 tensor, page ``p`` at ``p *
    cache.strides[0]``): data ``[pages, 2, block_size, heads, D/2]`` and scales ``[pages, 2, block_size,
    heads, D/16]``, wherever ``layout`` puts them."""
    d, s = head_dim // 2, head_dim // GROUP
    side = block_size * heads * (d + s)
    pages = cache.shape[0]
    span = (pages - 1) * cache.strides[0] + 2 * side
    flat = np.lib.stride_tricks.as_strided(cache, shape=(span,), strides=(1,))

    def region(offset: int, width: int) -> np.ndarray:
        inner = (heads * width, width) if layout == "NHD" else (width, block_size * width)
        return np.lib.stride_tricks.as_strided(flat[offset:], shape=(pages, 2, block_size, heads, width),
                                               strides=(cache.strides[0], side) + inner + (1,))

    return region(0, d), region(heads * block_size * d, s)


class Nvfp4Codec(Codec):
    """vLLM's NVFP4 KV cache (see the module docstring)."""

    name, family, code_bits, group, scales = "nvfp4", "nvfp4", 4, GROUP, ScaleHome.PAGE
    scale_dtype = np.uint8  # e4m3fn bits
    kernels = "kvnumba.kernels.nvfp4"

    def quantise(self, x: Any, global_scale: Any = 1.0, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        return quantise(x, global_scale, dtype)

    def dequantise(self, data: Any, scales: Any, global_scale: Any = 1.0, dtype: str = "bfloat16") -> np.ndarray:
        return dequantise(data, scales, global_scale, dtype)


NVFP4 = Nvfp4Codec()

__all__ = ["E2M1", "GROUP", "LAYOUTS", "NVFP4", "Nvfp4Codec", "dequantise", "full_dim", "head_dim_of", "quantise",
           "regions"]
