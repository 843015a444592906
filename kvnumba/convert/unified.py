"""SGLang's page-unified pool in a conversion: K and V of a whole cache in one array (``kv.PageUnified``), MHA
``[T/P, G, L, 2, P, H/G, D]`` or MLA ``[T/P, L, P, D]``, converted to and from K and V (MLA: one tensor), or
regrouped into other head groups.

Each side is read as NumPy pictures over one index space ``(L, T // P, P, *item)``: a whole tensor's
canonical view (``kvnumba.convert.shapes``), a pool's K and V as ``(L, T // P, P, G, H/G, D)``. Splitting
``H`` into ``(G, H/G)`` is a view; only a pool-to-pool regrouping reads its source through a copy.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..layouts import CacheView, picture
from ..checks import validate
from .shapes import _shaped, canonical_view, converted_shape, dims

__all__ = ["Pictures", "Planned", "pictures", "planned", "put"]


class Planned(NamedTuple):
    """A conversion that involves a pool: its output shapes (one pool, K and V, or one MLA tensor)."""

    shapes: list[tuple[int, ...]]
    mla: bool


def _pool_dims(pool: type[CacheView], shape: tuple[int, ...], page_size: int | None
               ) -> tuple[int, int, int, tuple[int, ...], bool]:
    """``(L, T, P, item, mla)`` of a pool of ``shape``; ``ValueError`` for a shape that is not a pool's, or
    pages that are not ``page_size`` tokens."""
    g = picture(pool, _shaped(shape)).geometry
    if page_size is not None and g.page_size != page_size:
        raise ValueError(f"page_unified: its page size is {g.page_size} (shape {shape}), page_size={page_size} "
                         "was given")
    mla = len(shape) == 4
    return g.layers, g.tokens, g.page_size, (shape[-1],) if mla else (g.heads, shape[-1]), mla


def _groups(head_groups: Any, heads: int, mla: bool) -> int:
    groups = validate.integer("head_groups", 1 if head_groups is None else head_groups, minimum=1)
    if mla and groups != 1:
        raise ValueError(f"head_groups={groups}: an MLA pool [T/P, L, P, D] has no head groups (leave head_groups "
                         "out, or 1)")
    if heads % groups:
        raise ValueError(f"head_groups={groups} does not divide the H={heads} heads of an item: a pool's head "
                         "groups hold H / head_groups heads each")
    return groups


def planned(shapes: Sequence[Sequence[int]], src: type[CacheView], dst: type[CacheView], page_size: int | None,
            head_groups: Any = None, argument: str = "array") -> Planned:
    """The outputs of a conversion from or to a pool, the inputs' ``shapes`` checked: one pool from
    ``src`` page_unified; K and V (two tensors of one shape) or one MLA tensor into ``dst`` page_unified.
    ``ValueError`` naming ``argument`` for inputs of the wrong count or shape, ``head_groups`` for a count
    that is not ``dst``'s or does not divide H, ``page_size`` where it is missing or disagrees."""
    shapes = [tuple(int(n) for n in s) for s in shapes]
    pool: Any = src if src.kv_pool else dst  # its shapes and pictures: the pool class's (kvnumba.layouts)
    if page_size is None:
        raise ValueError("page_unified needs page_size (tokens per page): pass page_size=")
    page_size = validate.integer("page_size", page_size, minimum=1)
    if head_groups is not None and not dst.kv_pool:
        raise ValueError("head_groups applies to dst='page_unified' (a pool's head groups); leave it out")
    if src.kv_pool:
        if len(shapes) != 1:
            raise ValueError(f"{argument}: src='page_unified' reads one pool (K and V in one array), got "
                             f"{len(shapes)} arrays")
        layers, tokens, _, item, mla = _pool_dims(src, tuple(shapes[0]), page_size)
        if dst.kv_pool:
            groups = _groups(head_groups, item[0] if not mla else 1, mla)
            return Planned([pool.pool_shape(layers, tokens, page_size, item, groups, mla)], mla)
        # a pool's MLA bytes are page_first_direct's; its K and V each hold a layer_first tensor's items
        one = converted_shape(shapes[0], "pfd", dst, page_size) if mla else \
            converted_shape((layers, tokens, *item), "lf", dst, page_size)
        return Planned([one] if mla else [one, one], mla)
    if len(shapes) not in (1, 2):
        raise ValueError(f"{argument}: dst='page_unified' takes K and V as a pair (k, v), or one MLA tensor; got "
                         f"{len(shapes)} arrays")
    if len(shapes) == 2 and shapes[0] != shapes[1]:
        raise ValueError(f"{argument}: K and V must have one shape, got {shapes[0]} and {shapes[1]}")
    d = dims(src, shapes[0], page_size if src.paged else None)
    if d.tokens % page_size:
        raise ValueError(f"page_unified needs T divisible by page_size={page_size}: got T={d.tokens} ({d.token_axis})")
    mla = len(shapes) == 1
    if mla and not (len(d.item) == 1 or d.item[0] == 1):
        raise ValueError(f"{argument}: one tensor makes an MLA pool, of items (D,) or (1, D); items {d.item} "
                         f"({d.token_axis}) have heads: pass K and V as a pair (k, v)")
    heads = 1 if mla or len(d.item) == 1 else d.item[0]
    groups = _groups(head_groups, heads, mla)
    return Planned([pool.pool_shape(d.layers, d.tokens, page_size, d.item, groups, mla)], mla)


class Pictures(NamedTuple):
    """The NumPy pictures of a conversion: ``sources[i]`` goes into ``destinations[i]`` (K, then V)."""

    sources: list[np.ndarray]
    destinations: list[np.ndarray]


def pictures(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], src: type[CacheView],
             dst: type[CacheView], page_size: int) -> Pictures:
    """Views of ``inputs`` (layout ``src``) and ``outputs`` (layout ``dst``) pairing K with K and V with V."""
    def side(arrays: Sequence[np.ndarray], lay: type[CacheView]) -> list[np.ndarray]:
        if lay.kv_pool:
            pool: Any = lay
            return list(pool.pool_pictures(arrays[0]))
        return [canonical_view(a, lay, page_size) for a in arrays]

    return Pictures(side(inputs, src), side(outputs, dst))


def _viewed(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``array`` as a view of ``shape`` (the same elements, items in head order), or None where its strides
    do not allow one (a pool's head groups merged back into heads)."""
    if array.shape == shape:
        return array
    out = array.view()
    try:
        out.shape = shape
    except AttributeError:
        return None
    return out


def put(source: np.ndarray, destination: np.ndarray) -> None:
    """``destination[...] = source``, items matched in head order: through a view of one side where one
    exists (a head axis split into groups), else through a copy of the source (pool to pool)."""
    as_source = _viewed(destination, source.shape)
    if as_source is not None:
        as_source[...] = source
        return
    as_destination = _viewed(source, destination.shape)
    destination[...] = np.reshape(source, destination.shape) if as_destination is None else as_destination
