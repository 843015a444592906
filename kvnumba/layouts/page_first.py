"""Page-first caches, every layer of a token (or page) together: ``PageFirst`` ``[T, L, *item]`` (SGLang's host
pool; its arithmetic is the seed's ``kvnumba.kernels.layouts.PAGE_FIRST``) and ``PageFirstDirect``
``[T/P, L, P, *item]`` (SGLang's memcpy-path host pool: one page of one layer contiguous).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import shape_of
from ..kernels import layouts
from .base import CacheView, Geometry, Paged, item_of


class PageFirst(CacheView):
    """``[T, L, *item]``: every layer of a token side by side (SGLang's host pool)."""

    name, short_name = "page_first", "pf"
    parts = layouts.PAGE_FIRST

    def shape(self, buffer: Any) -> Geometry:
        shape, size, dtype = shape_of(buffer, "PageFirst")
        if len(shape) < 3:
            raise ValueError(f"PageFirst: a buffer is [T, L, *item], got {shape}")
        heads, item = item_of(shape[2:], size, "PageFirst")
        return Geometry(shape[1], shape[0], 1, heads, item, shape[1] * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        return (tokens, layers, *item)

    def logical(self, buffer: Any) -> Any:
        return np.swapaxes(buffer, 0, 1)[:, :, None]


class PageFirstDirect(Paged):
    """``[T/P, L, P, *item]``: one page of one layer contiguous (SGLang's memcpy-path host pool)."""

    name, short_name = "page_first_direct", "pfd"

    @staticmethod
    def layer_base(base: int, layer: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
        return base + layer * item_size * page_size  # a page holds every layer's page_size items

    @staticmethod
    def token_offset(token: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
        return token // page_size * page_size * layout_dim + token % page_size * item_size  # dim = L * item

    head_stride = staticmethod(layouts.item_head_stride)

    def shape(self, buffer: Any) -> Geometry:
        shape, size, dtype = shape_of(buffer, "PageFirstDirect")
        if len(shape) < 4:
            raise ValueError(f"PageFirstDirect: a buffer is [T/P, L, P, *item], got {shape}")
        pages, layers, page = shape[:3]
        heads, item = item_of(shape[3:], size, "PageFirstDirect")
        return Geometry(layers, pages * page, page, heads, item, layers * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        return (tokens // page_size, layers, page_size, *item)

    def logical(self, buffer: Any) -> Any:
        return np.swapaxes(buffer, 0, 1)
