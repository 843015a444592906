"""Page-first caches, every layer of a token (or page) together: ``PageFirst`` (the seed's ``PAGE_FIRST``
arithmetic) and ``PageFirstDirect``."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import layouts
from .base import CacheView, Geometry, Paged, leading


class PageFirst(CacheView):
    """``[T, L, *item]``: every layer of a token side by side (SGLang's host pool)."""

    name, short_name = "page_first", "pf"
    parts = layouts.PAGE_FIRST

    def shape(self, buffer: Any) -> Geometry:
        (tokens, layers), heads, item, dtype = leading(buffer, 2, "PageFirst", "[T, L, *item]")
        return Geometry(layers, tokens, 1, heads, item, layers * item, dtype)

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
        (pages, layers, page), heads, item, dtype = leading(buffer, 3, "PageFirstDirect", "[T/P, L, P, *item]")
        return Geometry(layers, pages * page, page, heads, item, layers * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        return (tokens // page_size, layers, page_size, *item)

    def logical(self, buffer: Any) -> Any:
        return np.swapaxes(buffer, 0, 1)
