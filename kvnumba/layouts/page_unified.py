"""``PageUnified``: SGLang's page-unified host pool, K and V of every layer of a page in one array."""
from __future__ import annotations

from typing import Any, ClassVar, SupportsIndex

import numpy as np

from ..arrays import shape_of
from ..kernels import layouts
from ..types import ArrayLike
from .base import Allocate, CacheView, Geometry, Paged


class PageUnified(Paged):
    """SGLang's page-unified host pool: one buffer, each page one contiguous object, in SGLang's byte order.

    - MHA ``[T/P, G, L, 2, P, H/G, D]``: a page is cut into ``G`` head groups (read off the shape), each
      holding every layer, each layer its K (0) then its V (1) of the page's ``P`` tokens, ``H/G`` heads a
      token. One (page, group, layer) is one run of ``2 * P * (H/G) * D`` elements; with one head group a
      page's K (or V) of one layer is one run of ``P`` items, which the copy engines move whole.
    - MLA ``[T/P, L, P, D]``: a page holds every layer's ``P`` latent vectors.

    A buffer of any other shape gets a ``ValueError`` naming these. With ``G > 1`` a copy goes group by group
    (``LayoutParts.head_runs``); a layout that splits every head apart (``PageHead``, FlashInfer's HND) meets
    it only where each group is one head.
    """

    name, short_name = "page_unified", "pu"
    whole_tensor = False  # K and V live in one array: kv.convert reads and writes separate K and V tensors
    kv_pool = True
    _made: ClassVar[dict[tuple[int, int], layouts.LayoutParts]] = {}  # (kinds, groups) -> its arithmetic

    def __init__(self, buffer: ArrayLike, page_size: SupportsIndex | None = None) -> None:
        shape = shape_of(buffer, "PageUnified buffer")[0]
        mla = len(shape) == 4
        self.head_groups = 1 if mla or len(shape) != 7 else int(shape[1])
        self.parts = self.arithmetic(1 if mla else 2, max(self.head_groups, 1))
        self.head_split = self.parts.head_split
        super().__init__(buffer, None if mla else buffer, page_size)  # V: the same array, kind_offset on

    @classmethod
    def arithmetic(cls, kinds: int, groups: int) -> layouts.LayoutParts:
        """The address arithmetic of a pool of ``kinds`` (2: K and V; 1: MLA) and ``groups`` head groups,
        the two fixed as constants of its functions (a kernel per pool shape). Memoised."""
        made = cls._made.get((kinds, groups))
        if made is not None:
            return made

        def layer_base(base: int, layer: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
            return base + layer * kinds * page_size * (item_size // groups)  # a layer's K then V, in one group

        def token_offset(token: int, layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
            return token // page_size * layout_dim + token % page_size * (item_size // groups)  # dim: a page's bytes

        def group_stride(layout_dim: int, item_size: int, heads: int, page_size: int) -> int:
            return layout_dim // groups  # the next head group's block of the page (a copy goes by groups)

        def map_geometry(nbytes: int, item_size: int, layout_dim: int, page_size: int, heads: int) -> Any:
            """The staged kernel's maps see page-head's five dimensions, each head group a head:
            ``[group words, layers, groups, tokens of a page, pages]``, V's map at K's plus ``kind_offset``."""
            chunk = item_size // heads  # heads: a copy's runs, i.e. the groups
            pages = nbytes // layout_dim
            if heads != groups or chunk % 16 or layout_dim % 16 or pages == 0 or nbytes % layout_dim:
                return None
            sizes = (chunk // 8, layout_dim // (groups * kinds * page_size * chunk), groups, page_size, pages)
            return sizes, (kinds * page_size * chunk, layout_dim // groups, chunk, layout_dim), groups

        name = "pu" if kinds == 2 and groups == 1 else "pu_mla" if kinds == 1 else f"pu_g{groups}"
        made = layouts.LayoutParts(name, layer_base, token_offset,
                                   layouts.item_head_stride if groups == 1 else group_stride,
                                   head_split=groups > 1, head_runs=groups if groups > 1 else None,
                                   title="page-unified", page_dim=True, head_major=kinds == 2,
                                   map_geometry=map_geometry if kinds == 2 else None)  # MLA: the register kernel loads
        cls._made[(kinds, groups)] = made
        return made

    @classmethod
    def parts_named(cls, name: str) -> layouts.LayoutParts | None:
        if name in ("pu", "pu_mla"):
            return cls.arithmetic(2 if name == "pu" else 1, 1)
        if name.startswith("pu_g") and name[4:].isdigit() and int(name[4:]) > 1:
            return cls.arithmetic(2, int(name[4:]))
        return None

    def shape(self, buffer: Any) -> Geometry:
        shape, size, dtype = shape_of(buffer, "PageUnified")
        if len(shape) == 4:  # MLA: [T/P, L, P, D]
            pages, layers, page, dim = shape
            item = dim * size
            return Geometry(layers, pages * page, page, 1, item, layers * page * item, dtype)
        if len(shape) != 7 or shape[3] != 2 or shape[1] < 1:
            raise ValueError("PageUnified: the buffer is [T/P, G, L, 2, P, H/G, D] (SGLang's page-unified order: "
                             f"head groups, layers, K and V, tokens, heads of a group, dim) or [T/P, L, P, D] for "
                             f"MLA, got {shape}")
        pages, groups, layers, _, page, per_group, dim = shape
        heads = groups * per_group
        item = heads * dim * size
        return Geometry(layers, pages * page, page, max(heads, 1), item, 2 * layers * page * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        """One head group's pool (``[T/P, 1, L, 2, P, H, D]``; MLA ``[T/P, L, P, D]`` for a flat item)."""
        return cls.pool_shape(layers, tokens, page_size, item, 1, len(item) == 1)

    @staticmethod
    def pool_shape(layers: int, tokens: int, page_size: int, item: tuple[int, ...], groups: int, mla: bool
                   ) -> tuple[int, ...]:
        """A pool of ``groups`` head groups holding K and V (or, ``mla``, one latent) of items ``item``."""
        if mla:
            return (tokens // page_size, layers, page_size, item[-1])
        heads = item[0] if len(item) == 2 else 1
        return (tokens // page_size, groups, layers, 2, page_size, heads // groups, item[-1])

    @staticmethod
    def pool_pictures(pool: Any) -> list[Any]:
        """A pool's K and V as views ``(L, T // P, P, G, H/G, D)``, or its MLA tensor ``(L, T // P, P, D)``."""
        if pool.ndim == 4:
            return [np.swapaxes(pool, 0, 1)]
        return [np.transpose(pool[:, :, :, kind], (2, 0, 3, 1, 4, 5)) for kind in (0, 1)]

    def kind_offset(self, which: str) -> int:
        g = self.geometry
        return g.page_size * (g.item_bytes // self.head_groups) if which == "v" else 0  # V follows K in a layer

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """SGLang's pool order with the remote's head groups (its layout's ``head_runs``), layers ``0 .. last
        copied``: each (page, group, layer) of the remote lands as one run."""
        g = remote.geometry
        kept, groups = int(layers[-1]) + 1, remote.parts.head_runs or 1
        if remote.mla:
            return cls(allocate((pages, kept, g.page_size, g.item_bytes)))
        return cls(allocate((pages, groups, kept, 2, g.page_size, g.heads // groups, g.item_bytes // g.heads)))

    def like(self, k: Any, v: Any = None) -> CacheView:
        return type(self)(k, **self._options())

    def layer_items(self, which: str, layer: int) -> Any:
        return self.pool_pictures(np.asarray(self.k))[int(which == "v" and not self.mla)][layer]  # [T/P, P, *item]


PageUnified.parts = PageUnified.arithmetic(2, 1)  # the class's own: one head group of K and V (an instance: its shape's)
