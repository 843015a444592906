"""vLLM's paged caches, one array per layer read through tables of block addresses: ``VllmFlashAttn`` (the
flash-attention backend's) and ``VllmFlashInfer`` (FlashInfer's, NHD or HND).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

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
    """Per-layer paged caches read through tables of K and V block addresses (vLLM, FlashInfer). ``AXES`` says,
    per ``layout`` option, where a layer's array keeps K/V (2), its blocks, a block's tokens and the heads; D
    is last."""

    per_layer = True
    paged = True
    whole_tensor = False
    AXES: ClassVar[dict[str | None, tuple[int, int, int, int]]]
    layout: str | None = None

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

    def shape(self, caches: Any) -> Geometry:
        name, (kv, blocks, block, heads) = type(self).__name__, self.AXES[self.layout]
        infos = [array_info(c, f"{name} caches[{i}]") for i, c in enumerate(caches)]
        shape = infos[0].shape
        if len(shape) != 5 or shape[kv] != 2 or any(i.shape != shape for i in infos):
            words = dict(zip((kv, blocks, block, heads, 4), ("2", "num_blocks", "block_size", "H", "D")))
            raise ValueError(f"{name}: every layer is [{', '.join(words[a] for a in range(5))}], got {shape}")
        item = shape[heads] * shape[4] * dtype_bytes(infos[0])
        between = shape[block] * item * (2 if kv > blocks else 1)  # the bytes from one block to the next
        return Geometry(len(infos), shape[blocks] * shape[block], shape[block], shape[heads], item, between,
                        infos[0].dtype)

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """Arrays only for the layers copied, each ``pages`` blocks in the remote's order (its ``layout``)."""
        g, options = remote.geometry, remote.origin.options
        shape = [0] * 5
        for axis, size in zip((*cls.AXES[options.get("layout")], 4), (2, pages, g.page_size, *raw_item(g))):
            shape[axis] = size
        return cls(per_layer(lambda: allocate(tuple(shape)), layers, g.layers), **options)

    def like(self, caches: Any, v: Any = None) -> CacheView:
        return type(self)(caches, **self._options())

    def layer_items(self, which: str, layer: int) -> Any:
        kv, blocks, block, heads = self.AXES[self.layout]  # [blocks, P, H, D] of K (or V)
        return np.moveaxis(self.caches[layer], (kv, blocks, block, heads), (0, 1, 2, 3))[0 if which == "k" else 1]


class VllmFlashAttn(_Blocks):
    """vLLM's flash-attention cache: per layer ``[2, num_blocks, block_size, H, D]``, K at 0, V at 1."""

    name = "vllm_flash_attn"
    parts = BLOCKS
    AXES = {None: (0, 1, 2, 3)}

    def kind_offset(self, which: str) -> int:
        return self.geometry.tokens * self.geometry.item_bytes if which == "v" else 0  # V's half of the layer


class VllmFlashInfer(_Blocks):
    """FlashInfer's paged cache as vLLM keeps it: per layer ``[num_blocks, 2, block_size, H, D]`` ("NHD")
    or ``[num_blocks, 2, H, block_size, D]`` ("HND")."""

    name = "vllm_flash_infer"
    parts = BLOCKS  # NHD's; an HND view's is HEAD_MAJOR_BLOCKS
    AXES = {"NHD": (1, 0, 2, 3), "HND": (1, 0, 3, 2)}

    def __init__(self, caches: Sequence[ArrayLike], layout: Literal["NHD", "HND"] = "NHD") -> None:
        if layout not in ("NHD", "HND"):
            raise ValueError(f"VllmFlashInfer: layout must be 'NHD' or 'HND', got {layout!r}")
        self.layout = layout
        self.parts = BLOCKS if layout == "NHD" else HEAD_MAJOR_BLOCKS
        self.head_split = layout == "HND"
        super().__init__(caches)

    def _options(self) -> dict[str, Any]:
        return {"layout": self.layout}

    def kind_offset(self, which: str) -> int:
        return self.geometry.page_size * self.geometry.item_bytes if which == "v" else 0  # V's half of a block

    @classmethod
    def parts_named(cls, name: str) -> layouts.LayoutParts | None:
        return {p.name: p for p in (BLOCKS, HEAD_MAJOR_BLOCKS)}.get(name)
