"""The NumPy reference of ``kv.copy`` with quantised views (``kv.Fp8View``, ``kv.Nvfp4View``) over NumPy buffers;
the formats themselves are their codecs' (``kvnumba.quant.fp8``: FP8, byte for byte in its docstring;
``kvnumba.quant.nvfp4``: vLLM's NVFP4 pages). ``quantise`` and ``dequantise`` are FP8's, under the names this
module has always had.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .quant import nvfp4
from .quant.fp8 import dequantise, quantise

__all__ = ["copy", "dequantise", "quantise"]


# --- kv.copy with quantised views -----------------------------------------------------------------------

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
    """``kv.copy`` where one or both views are ``kv.Fp8View`` s (or ``kv.Nvfp4View`` s), over NumPy buffers, from
    each view's NumPy picture (``CacheView.logical``; an NVFP4 cache's ``layer_regions``): a plain view -> a
    quantised view quantises, quantised -> plain dequantises, quantised -> quantised copies codes and scales.
    Destinations are written in place."""
    from .api.fp8_views import Fp8View, plan_window, plain_dtype_of
    from .api.nvfp4_views import Nvfp4View

    src_indices = np.asarray(src_indices, dtype=np.int64)
    dst_indices = np.asarray(dst_indices, dtype=np.int64)
    first, count = plan_window(src_view, dst_view, layers)
    if len(src_indices) == 0:
        return
    if isinstance(src_view, Nvfp4View) or isinstance(dst_view, Nvfp4View):
        return _nvfp4_copy(src_view, dst_view, src_indices, dst_indices, range(first, first + count))
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


def _nvfp4_copy(src_view: Any, dst_view: Any, src_indices: np.ndarray, dst_indices: np.ndarray,
                layers: range) -> None:
    """``copy`` with an ``Nvfp4View`` on a side (``kvnumba.quant.nvfp4``'s format)."""
    from .api.fp8_views import plain_dtype_of
    from .api.nvfp4_views import Nvfp4View

    src_q, dst_q = isinstance(src_view, Nvfp4View), isinstance(dst_view, Nvfp4View)
    nv = src_view if src_q else dst_view
    s_page, s_slot = src_indices // src_view.geometry.page_size, src_indices % src_view.geometry.page_size
    d_page, d_slot = dst_indices // dst_view.geometry.page_size, dst_indices % dst_view.geometry.page_size
    for layer in layers:
        src_parts = src_view.layer_regions(layer) if src_q else None
        dst_parts = dst_view.layer_regions(layer) if dst_q else None
        for kind, which in enumerate(("k", "v")):
            scale = nv.k_scale if kind == 0 else nv.v_scale
            if src_parts is not None and dst_parts is not None:
                for src_part, dst_part in zip(src_parts, dst_parts):
                    dst_part[d_page, kind, d_slot] = src_part[s_page, kind, s_slot]
            elif dst_parts is not None:
                name = plain_dtype_of(src_view, dst_view)
                values = _heads(_gather(src_view, which, layer, src_indices), nv.heads).view(np.uint16)
                data, scales = nvfp4.quantise(values, scale, name)
                dst_parts[0][d_page, kind, d_slot] = data
                dst_parts[1][d_page, kind, d_slot] = scales
            elif src_parts is not None:
                name = plain_dtype_of(dst_view, src_view)
                values = nvfp4.dequantise(src_parts[0][s_page, kind, s_slot], src_parts[1][s_page, kind, s_slot],
                                          scale, name)
                _scatter(dst_view, which, layer, dst_indices, values.view(np.uint16))
