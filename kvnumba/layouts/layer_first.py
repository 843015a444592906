"""Layer-first caches, ``LayerFirst`` and ``LayerTable`` (raw tables of layer addresses), in the address
arithmetic of the seed's entry points (``kvnumba.kernels.layouts.LAYER_FIRST`` and ``LAYER_TABLE``)."""
from __future__ import annotations

from typing import Any, SupportsIndex

from ..arrays import array_info
from ..checks import validate
from ..kernels import layouts
from ..types import ArrayLike, CacheBuffer
from .base import Allocate, CacheView, Geometry, leading, per_layer, raw_item


class LayerFirst(CacheView):
    """``[L, T, *item]`` (one array), or a list of L ``[T, *item]`` arrays (read through a layer table)."""

    name, short_name = "layer_first", "lf"
    parts = layouts.LAYER_FIRST  # one [L, T, *item] array; a view of per-layer lists reads a table (LAYER_TABLE)

    def __init__(self, k: CacheBuffer, v: CacheBuffer | None = None) -> None:
        self.per_layer = isinstance(k, (list, tuple))
        self.parts = layouts.LAYER_TABLE if self.per_layer else layouts.LAYER_FIRST
        super().__init__(k, v)

    def shape(self, buffer: Any) -> Geometry:
        if isinstance(buffer, (list, tuple)):  # layers alike (CacheView.__init__ checked): layer 0 says
            (tokens,), heads, item, dtype = leading(buffer[0], 1, "LayerFirst", "[T, *item] per layer")
            return Geometry(len(buffer), tokens, 1, heads, item, 0, dtype)
        (layers, tokens), heads, item, dtype = leading(buffer, 2, "LayerFirst", "[L, T, *item]")
        return Geometry(layers, tokens, 1, heads, item, tokens * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        return (layers, tokens, *item)

    def logical(self, buffer: Any) -> Any:
        if isinstance(buffer, (list, tuple)):
            return [b[:, None] for b in buffer]  # per layer [T, 1, *item]
        return buffer[:, :, None]  # [L, T, 1, *item]

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """Staged as per-layer lists (one array or not): arrays only for the layers copied."""
        g, item = remote.geometry, raw_item(remote.geometry)
        k = per_layer(lambda: allocate((pages * g.page_size, *item)), layers, g.layers)
        v = None if remote.mla else per_layer(lambda: allocate((pages * g.page_size, *item)), layers, g.layers)
        return cls(k, v)

    def export_options(self) -> dict[str, Any]:
        return {**super().export_options(), "per_layer": self.per_layer}


class LayerTable(CacheView):
    """Raw per-layer address tables, as the seed takes them: uint64 ``[L]`` arrays of layer-first
    ``[T, item]`` addresses. ``tokens`` and ``item_size`` (bytes) say what each layer holds; the layers'
    sizes are found as for the seed's tables (``kvnumba.checks.tables``)."""

    name = "layer_table"
    whole_tensor = False
    parts = layouts.LAYER_TABLE
    raw_tables = True

    def __init__(self, k: ArrayLike, v: ArrayLike | None = None, *, tokens: SupportsIndex, item_size: SupportsIndex,
                 heads: SupportsIndex = 1) -> None:
        self.tokens = validate.integer("tokens", tokens, minimum=1, maximum=validate.MAX_SIZE)
        self.heads_given = validate.integer("heads", heads, minimum=1, maximum=validate.MAX_SIZE)
        self.item_size = validate.item_size(item_size, self.heads_given)
        super().__init__(k, v)

    def _options(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "item_size": self.item_size, "heads": self.heads_given}

    def shape(self, table: Any) -> Geometry:
        info = array_info(table, "LayerTable")
        if len(info.shape) != 1 or info.dtype not in ("uint64", "int64"):
            raise ValueError(f"LayerTable: a table is a uint64 [L] array of addresses, got {info.dtype} {info.shape}")
        return Geometry(info.shape[0], self.tokens, 1, self.heads_given, self.item_size, 0, "uint8")

    def logical(self, table: Any) -> Any:
        raise TypeError("LayerTable holds raw addresses: the reference needs the arrays (use LayerFirst)")
