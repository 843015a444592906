"""One whole-cache tensor (K, V or MLA: every token of every layer) in a layout, read through its view class:
its dimensions, its shape in another layout, and its NumPy picture ``(L, T // P, P, *item)``, shared by
``kv.convert`` and the file converter.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, SupportsIndex

import numpy as np

from ..layouts import CacheView, picture, registered, view_class, view_name
from ..checks import validate

__all__ = ["Dims", "canonical_view", "converted_shape", "dims", "layout", "view_page_size"]


def layout(value: Any, argument: str = "layout", unified: bool = False) -> type[CacheView]:
    """The view class ``value`` names (``kvnumba.layouts.view_class``), one that holds a whole cache's K in
    one array, or (``unified``) a pool that holds K and V (``kv_pool``: ``kvnumba.convert.unified``);
    ``ValueError`` naming ``argument`` otherwise (a per-layer layout, an unknown name)."""
    cls = view_class(value, argument, among=[c for c in registered() if c.whole_tensor or (unified and c.kv_pool)])
    if cls.kv_pool:
        if unified:
            return cls
        raise ValueError(f"{argument}: {view_name(cls)} holds K and V in one array, not one tensor's shape: convert it "
                         "with kv.convert (a pool in, the pair (k, v) out, and back)")
    if not cls.whole_tensor:
        raise ValueError(f"{argument}: {view_name(cls)} keeps a cache in per-layer arrays (or address tables): a "
                         "conversion reads and writes one K (or V) tensor of every layer, or SGLang's page-unified pool; "
                         "use kv.copy between views")
    return cls


class Dims(NamedTuple):
    """What a shape says in a layout's terms."""

    layers: int
    tokens: int
    item: tuple[int, ...]  # the per-token shape, as the array has it
    token_axis: str  # where T was read, for messages: "shape (...) in page_first"


def _shaped(shape: tuple[int, ...]) -> np.ndarray:
    """A NumPy array of ``shape`` with no memory behind it (every element the same byte): view
    classes read geometry from it."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=(0,) * len(shape))


def dims(src: type[CacheView], shape: Sequence[int], page_size: int | None = None) -> Dims:
    """``L``, ``T`` and the item shape of an array of ``shape`` in layout ``src``, as its view reads them;
    ``ValueError`` if the shape is not the layout's, or its pages are not ``page_size`` tokens."""
    shape = tuple(int(n) for n in shape)
    view = picture(src, _shaped(shape))  # a whole-tensor view takes one array
    g = view.geometry
    if page_size is not None and src.paged and g.page_size != page_size:
        raise ValueError(f"{view_name(src)}: its page size is {g.page_size} (shape {shape}), "
                         f"page_size={page_size} was given")
    item = tuple(view.logical(view.k).shape[3:])  # the item as the array has it: (1, D) stays (1, D)
    return Dims(g.layers, g.tokens, item, f"shape {shape} in {view_name(src)}")


def converted_shape(shape: Sequence[int], src: Any, dst: Any, page_size: SupportsIndex | None = None
                    ) -> tuple[int, ...]:
    """The shape an array of ``shape`` in layout ``src`` has in layout ``dst``.

    Raises
    ------
    ValueError
        If a name is unknown, ``shape`` does not fit ``src``, ``page_size`` is missing where a layout is
        paged or does not divide T where ``dst`` pages tokens, or ``dst`` is page_head and items are not ``(H, D)``.
    """
    src, dst = layout(src, "src"), layout(dst, "dst")
    for lay in (src, dst):
        if lay.paged and page_size is None:
            raise ValueError(f"{view_name(lay)} needs page_size (tokens per page): pass page_size=")
    if page_size is not None:
        page_size = validate.integer("page_size", page_size, minimum=1)
    d = dims(src, shape, page_size)
    if dst.paged:
        assert page_size is not None
        if d.tokens % page_size:
            raise ValueError(f"{view_name(dst)} needs T divisible by page_size={page_size}: got T={d.tokens} "
                             f"({d.token_axis})")
    try:
        return tuple(dst.buffer_shape(d.layers, d.tokens, page_size if dst.paged else 1, d.item))
    except ValueError as err:
        raise ValueError(f"{err} ({d.token_axis})") from None


def view_page_size(src: type[CacheView], dst: type[CacheView], page_size: int | None) -> int:
    """The page size of the two canonical views of a conversion: the given one if either layout pages tokens,
    else 1."""
    return (page_size or 1) if (src.paged or dst.paged) else 1


def canonical_view(array: np.ndarray, lay: type[CacheView], page_size: int) -> np.ndarray:
    """A view of ``array`` (layout ``lay``) with axes ``(L, T // P, P, *item)``, ``P = page_size``: its view
    class's ``logical`` picture, regrouped into pages of ``P`` in place (a view, never a copy: the NumPy
    engine writes through it)."""
    logical = picture(lay, array).logical(array)
    layers, pages, page, *item = logical.shape
    if page == page_size:
        return logical
    out = logical.view()
    try:
        out.shape = (layers, pages * page // page_size, page_size, *item)
    except AttributeError:
        raise ValueError(f"{view_name(lay)}: its pages of {page} tokens do not fit pages of {page_size} "
                         "(convert between layouts of one page size)") from None
    return out
