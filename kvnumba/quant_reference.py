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


def _read(view: Any, nv: bool, which: str, layer: int, kind: int, tokens: np.ndarray) -> tuple[Any, Any]:
    """A quantised view's codes and scales of ``tokens`` in one layer and kind: an FP8 view's ``[n, H, ...]``,
    an NVFP4 cache's rows of its regions (``Nvfp4View.layer_regions``)."""
    if nv:
        page, slot = tokens // view.page_size, tokens % view.page_size
        data, scales = view.layer_regions(layer)
        return data[page, kind, slot], scales[page, kind, slot]
    return (_heads(_gather(view.codes, which, layer, tokens), view.heads),
            _heads(_gather(view.scales, which, layer, tokens), view.heads))


def _write(view: Any, nv: bool, which: str, layer: int, kind: int, tokens: np.ndarray, parts: Any) -> None:
    """``parts`` (codes and scales, as ``_read`` gives them) written at ``tokens`` of a quantised view."""
    if nv:
        page, slot = tokens // view.page_size, tokens % view.page_size
        for region, values in zip(view.layer_regions(layer), parts):
            region[page, kind, slot] = values
    else:
        for part, values in zip((view.codes, view.scales), parts):
            _scatter(part, which, layer, tokens, values)


def copy(src_view: Any, dst_view: Any, src_indices: Any, dst_indices: Any, layers: Any = None) -> None:
    """``kv.copy`` where one or both views are ``kv.Fp8View`` s (or ``kv.Nvfp4View`` s), over NumPy buffers, from
    each view's NumPy picture (``CacheView.logical``; an NVFP4 cache's ``layer_regions``): a plain view -> a
    quantised view quantises, quantised -> plain dequantises, quantised -> quantised copies codes and scales.
    Destinations are written in place."""
    from .api.fp8_views import Fp8View
    from .api.nvfp4_views import Nvfp4View
    from .plan.copy_plan import copy_window
    from .plan.fp8_plan import plain_dtype_of

    src_indices = np.asarray(src_indices, dtype=np.int64)
    dst_indices = np.asarray(dst_indices, dtype=np.int64)
    first, count = copy_window(src_view, dst_view, layers)
    if len(src_indices) == 0:
        return
    src_q, dst_q = (isinstance(view, (Fp8View, Nvfp4View)) for view in (src_view, dst_view))
    quantised = src_view if src_q else dst_view
    nv, heads = isinstance(quantised, Nvfp4View), quantised.heads
    for layer in range(first, first + count):
        for kind, which in enumerate(("k",) if quantised.mla else ("k", "v")):
            scale = (quantised.k_scale, quantised.v_scale)[kind] if nv else None
            if src_q:
                parts = _read(src_view, nv, which, layer, kind, src_indices)
            else:
                name = plain_dtype_of(src_view, dst_view)
                values = _heads(_gather(src_view, which, layer, src_indices), heads).view(np.uint16)
                parts = nvfp4.quantise(values, scale, name) if nv else quantise(values, dst_view.fmt, name)
            if dst_q:
                _write(dst_view, nv, which, layer, kind, dst_indices, parts)
            else:
                name = plain_dtype_of(dst_view, src_view)
                codes, scales = parts
                if nv:
                    values = nvfp4.dequantise(codes, scales, scale, name)
                else:
                    values = dequantise(codes, scales, name, src_view.fmt)
                _scatter(dst_view, which, layer, dst_indices, values.view(np.uint16))
