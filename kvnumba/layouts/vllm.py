"""vLLM's paged caches, one array per layer read through tables of block addresses: ``VllmFlashAttn`` (the
flash-attention backend's) and ``VllmFlashInfer`` (FlashInfer's, NHD or HND).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ..arrays import array_info, dtype_bytes, shape_of
from ..kernels import layouts
from ..types import ArrayLike
from .base import Allocate, CacheView, Geometry, per_layer, raw_item
from .buffers import layers_alike


# --- the address arithmetic: per-layer tables of paged blocks ----------------------------------------

def block_token_offset(token: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
    return token // page_size * layout_dim + token % page_size * item_size  # layout_dim: bytes between blocks


def head_major_block_token_offset(token: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
    return token // page_size * layout_dim + token % page_size * (item_size // heads)  # [block, ..., H, P, D]


def head_major_head_stride(layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
    return item_size // heads * page_size  # a head's page_size tokens


BLOCKS = layouts.LayoutParts("blocks", layouts.table_layer_base, block_token_offset, layouts.item_head_stride,
                             table=True, title="blocks")  # flash-attention's, and FlashInfer's NHD
HEAD_MAJOR_BLOCKS = layouts.LayoutParts("hnd_blocks", layouts.table_layer_base, head_major_block_token_offset,
                                        head_major_head_stride, table=True, head_split=True,
                                        title="head-major blocks")  # FlashInfer's HND


class _Blocks(CacheView):
    """Per-layer paged caches read through tables of K and V block addresses (vLLM, FlashInfer)."""

    per_layer = True
    paged = True
    whole_tensor = False

    def __init__(self, caches: Sequence[ArrayLike]) -> None:
        if not isinstance(caches, (list, tuple)) or not caches:
            raise TypeError(f"{type(self).__name__}: caches must be a non-empty list of per-layer arrays, "
                            f"got {type(caches).__name__}")
        self.caches = layers_alike(type(self).__name__, "caches", caches)  # a tuple the view owns
        self.geometry = self.shape(self.caches)
        self.itemsize = shape_of(self.caches[0], "caches[0]")[1]
        self.k = self.caches
        self.v = self.caches  # K and V share each layer's array; the tables tell them apart
        self._finish("caches")

    def like(self, caches: Any, v: Any = None) -> CacheView:
        return type(self)(caches, **self._options())

    def buffers(self, which: str) -> list[Any]:
        return list(self.caches)

    def layer_items(self, which: str, layer: int) -> Any:
        return self.logical_layer(self.caches[layer], which)

    def logical_layer(self, cache: Any, which: str) -> Any:
        """K's (or V's) blocks of one layer's ``cache`` as a NumPy view ``[blocks, P, H, D]``."""
        raise NotImplementedError


class VllmFlashAttn(_Blocks):
    """vLLM's flash-attention cache: per layer ``[2, num_blocks, block_size, H, D]``, K at 0, V at 1."""

    name = "vllm_flash_attn"
    parts = BLOCKS

    def shape(self, caches: Any) -> Geometry:
        infos = [array_info(c, f"VllmFlashAttn caches[{i}]") for i, c in enumerate(caches)]
        info = infos[0]
        if len(info.shape) != 5 or info.shape[0] != 2 or any(i.shape != info.shape for i in infos):
            raise ValueError(f"VllmFlashAttn: every layer is [2, num_blocks, block_size, H, D], got {info.shape}")
        _, blocks, block, heads, dim = info.shape
        item = heads * dim * dtype_bytes(info)
        return Geometry(len(infos), blocks * block, block, heads, item, block * item, info.dtype)

    def kind_offset(self, which: str) -> int:
        return self.geometry.tokens * self.geometry.item_bytes if which == "v" else 0  # V's half of the layer

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """Arrays only for the layers copied, each ``[2, pages, P, H, item/H]``."""
        g = remote.geometry
        shape = (2, pages, g.page_size, *raw_item(g))
        return cls(per_layer(lambda: allocate(shape), layers, g.layers))

    def logical_layer(self, cache: Any, which: str) -> Any:
        return cache[0 if which == "k" else 1]  # [blocks, P, H, D]


class VllmFlashInfer(_Blocks):
    """FlashInfer's paged cache as vLLM keeps it: per layer ``[num_blocks, 2, block_size, H, D]`` ("NHD")
    or ``[num_blocks, 2, H, block_size, D]`` ("HND")."""

    name = "vllm_flash_infer"
    parts = BLOCKS  # NHD's; an HND view's is HEAD_MAJOR_BLOCKS

    def __init__(self, caches: Sequence[ArrayLike], layout: Literal["NHD", "HND"] = "NHD") -> None:
        if layout not in ("NHD", "HND"):
            raise ValueError(f"VllmFlashInfer: layout must be 'NHD' or 'HND', got {layout!r}")
        self.layout = layout
        self.parts = BLOCKS if layout == "NHD" else HEAD_MAJOR_BLOCKS
        self.head_split = layout == "HND"
        super().__init__(caches)

    def _options(self) -> dict[str, Any]:
        return {"layout": self.layout}

    def shape(self, caches: Any) -> Geometry:
        infos = [array_info(c, f"VllmFlashInfer caches[{i}]") for i, c in enumerate(caches)]
        info = infos[0]
        if len(info.shape) != 5 or info.shape[1] != 2 or any(i.shape != info.shape for i in infos):
            raise ValueError(f"VllmFlashInfer: every layer is [num_blocks, 2, {'block_size, H' if self.layout == 'NHD' else 'H, block_size'}, D], got {info.shape}")
        blocks = info.shape[0]
        block, heads = (info.shape[2], info.shape[3]) if self.layout == "NHD" else (info.shape[3], info.shape[2])
        item = heads * info.shape[4] * dtype_bytes(info)
        return Geometry(len(infos), blocks * block, block, heads, item, 2 * block * item, info.dtype)

    def kind_offset(self, which: str) -> int:
        return self.geometry.page_size * self.geometry.item_bytes if which == "v" else 0  # V's half of a block

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """Arrays only for the layers copied, in the remote's order (NHD or HND)."""
        g, layout = remote.geometry, remote.origin.options.get("layout", "NHD")
        heads, per_head = raw_item(g)
        shape = (pages, 2, g.page_size, heads, per_head) if layout == "NHD" else (pages, 2, heads, g.page_size, per_head)
        return cls(per_layer(lambda: allocate(shape), layers, g.layers), layout=layout)

    @classmethod
    def parts_named(cls, name: str) -> layouts.LayoutParts | None:
        return {p.name: p for p in (BLOCKS, HEAD_MAJOR_BLOCKS)}.get(name)

    def logical_layer(self, cache: Any, which: str) -> Any:
        half = cache[:, 0 if which == "k" else 1]
        return half if self.layout == "NHD" else np.swapaxes(half, 1, 2)  # [blocks, P, H, D]
