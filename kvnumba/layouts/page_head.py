"""``PageHead`` ``[T/P, H, P, L, D]``: a page split by head (the seed's ``kvnumba.kernels.layouts.PAGE_HEAD``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import shape_of
from ..kernels import layouts
from .base import Geometry, Paged


class PageHead(Paged):
    """``[T/P, H, P, L, D]``: a page split by head, each head's block holding every layer."""

    name, short_name = "page_head", "ph"
    parts = layouts.PAGE_HEAD
    head_split = True

    def shape(self, buffer: Any) -> Geometry:
        shape, size, dtype = shape_of(buffer, "PageHead")
        if len(shape) != 5:
            raise ValueError(f"PageHead: a buffer is [T/P, H, P, L, D], got {shape}")
        pages, heads, page, layers, dim = shape
        item = heads * dim * size
        return Geometry(layers, pages * page, page, heads, item, layers * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        if len(item) != 2:
            raise ValueError(f"page_head needs a per-token item of shape (H, D) to find H: got item shape {item}")
        heads, dim = item
        return (tokens // page_size, heads, page_size, layers, dim)

    def logical(self, buffer: Any) -> Any:
        return np.transpose(buffer, (3, 0, 2, 1, 4))  # [L, T/P, P, H, D]
