"""The NumPy reference of ``kv.copy`` with quantised views (``kv.Fp8View``, ``kv.Nvfp4View``) over NumPy buffers;
the formats themselves are their codecs' (``kvnumba.quant.fp8``: FP8, byte for byte in its docstring;
``kvnumba.quant.nvfp4``: vLLM's NVFP4 pages). ``quantise`` and ``dequantise`` are FP8's, under the names this
module has always had.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .quant.fp8 import dequantise, quantise

__all__ = ["copy", "dequantise", "quantise"]


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
