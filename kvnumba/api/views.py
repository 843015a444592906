"""Cache views: buffers plus a layout plus geometry, the two sides of ``kv.copy`` (its plan:
``kvnumba.plan.copy_plan``).

A view holds one cache's K and V buffers (``v=None``: MLA, one latent vector per token, no V) and
knows, from their shapes, its T tokens, L layers, H heads and item bytes. T is the number of token
slots, P the page (or block) size; token ``t`` of a paged layout lives in page ``t // P``, slot
``t % P``.

=========================================  =============================================================
view                                       one K (or V) buffer
=========================================  =============================================================
``LayerFirst(k, v=None)``                  ``[L, T, *item]``, or a list of L per-layer ``[T, *item]``
``LayerTable(k, v=None, tokens, item)``    uint64 tables of L layer addresses, as the seed takes them
``PageFirst(k, v=None)``                   ``[T, L, *item]``
``PageFirstDirect(k, v=None, page_size)``  ``[T/P, L, P, *item]`` (``page_size`` optional: checked)
``PageHead(k, v=None, page_size)``         ``[T/P, H, P, L, D]``
``PageUnified(buffer, page_size=None)``    K and V in one ``[T/P, G, L, 2, P, H/G, D]`` (SGLang's order; MLA
                                           ``[T/P, L, P, D]``)
``VllmFlashAttn(caches)``                  per layer ``[2, num_blocks, P, H, D]``: K at 0, V at 1
``VllmFlashInfer(caches, layout="NHD")``   per layer ``[num_blocks, 2, P, H, D]`` (NHD) or
                                           ``[num_blocks, 2, H, P, D]`` (HND)
=========================================  =============================================================

The view classes are kvnumba's one layout vocabulary: each built-in one has a string name (``name``:
``"layer_first"``, ``"page_first"``, ...; ``short_name``: ``"lf"``, ``"pf"``, ...), read by ``view_class`` and
given back by ``view_name`` (``NAMES`` holds them all); ``kv.convert`` and ``kvnumba convert`` take a class or
its name. The kernels' address arithmetic for a view is its ``parts`` (``kvnumba.kernels.layouts``).

``item`` is ``(H, D)``, or ``(D,)`` / ``(1, D)`` for MLA. A new layout is a subclass of ``CacheView``
with its address arithmetic as three plain Python functions (``kvnumba.kernels.layouts``' form),
its geometry from a buffer's shape, and a NumPy view for the reference (see ``CacheView``).
"""
from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, SupportsIndex

import numpy as np

from ..arrays import array_info, dtype_bytes, shape_of
from ..checks import validate
from ..kernels import layouts
from ..types import ArrayLike, CacheBuffer
from ..checks.user_layouts import check_user_layout
from .view_buffers import Held, hold, layers_alike


_BUILT_IN: list[type[CacheView]] = []  # kvnumba's own view classes, in the order they are declared


class CacheView:
    """Base class of cache views (see the module docstring).

    A subclass for a new layout defines, as plain Python (kvnumba compiles them for the GPU):

    - ``layer_base(base, layer, layout_dim, item_size, heads, page_size)``,
      ``token_offset(token, layout_dim, item_size, heads, page_size)`` and
      ``head_stride(layout_dim, item_size, heads, page_size)``: the byte address of token ``token``,
      layer ``layer``, head ``h`` is ``layer_base + token_offset + h * head_stride`` from the
      buffer's address ``base`` (static methods);
    - ``head_split = True`` if a token's heads are not adjacent in memory;
    - ``shape(buffer) -> Geometry``: its layers, tokens, page size, heads and ``layout_dim`` (the one
      free stride its address arithmetic uses), read from a buffer's shape, raising ``ValueError``
      for a shape that is not the layout's;
    - ``logical(buffer) -> ndarray``: a NumPy view of the buffer shaped ``[L, T // P, P, *item]``,
      for ``kvnumba.reference`` (it must be a view, not a copy: the reference writes through it).

    With only that, the layout gets kernels to and from every other layout (``kv.copy``), bounds
    checks, reference checking, ``kv.convert`` and ``kvnumba convert``.

    A view describes its buffers as they were when it was made, and holds them
    (``kvnumba.api.view_buffers``): a per-layer list is copied into a tuple it owns; NumPy arrays cannot
    be resized while it lives; the data pointer and size of each torch tensor (CuPy array, other
    ``__cuda_array_interface__`` array) are compared again on every ``kv.copy`` for the layers it
    copies (``check_unchanged``), which raises ``ValueError`` naming the view and the buffer if one was
    given new memory in place (``resize_``, ``set_``, ``.data =``): make a new view then. A view
    class of your own (not kvnumba's) has its arithmetic evaluated at construction at every layer and
    token, with the heads a copy can use: every byte it can reach must lie in its buffer, K and V each.
    """

    name: ClassVar[str | None] = None  # a kvnumba view's string name ("page_first"): see NAMES and view_class
    short_name: ClassVar[str | None] = None  # its short name, where it has one ("pf")
    whole_tensor = True  # one array holds all of a cache's K (or V): kv.convert reads and writes this layout
    head_split = False
    paged = False  # its shapes have a page axis (kv.convert then needs page_size)
    per_layer = False  # k is a list of per-layer arrays (the kernel reads a table of their addresses)
    raw_tables = False  # k and v are raw uint64 tables of layer addresses (LayerTable)
    parts: layouts.LayoutParts | None = None  # LayoutParts, made from the three functions of a subclass

    user_layout = False  # True for a subclass that brings its own address arithmetic
    built_in = True  # one of kvnumba's views (its arithmetic follows its shapes: not checked at run time)
    _held: Held | None  # what kv.copy compares of its buffers per call (kvnumba.api.view_buffers)
    _kept: list[Any]  # what keeps the memory of its other buffers from moving
    flagged: tuple[Any, ...]  # NumPy arrays whose writable flag a plan of this view reads again (arrays.flagged)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A layout is declared by its class: three address functions (and ``head_split``, ``per_layer``) make
        its ``LayoutParts``; one of kvnumba's own with a ``name`` joins ``BUILT_IN`` (and ``NAMES``)."""
        super().__init_subclass__(**kwargs)
        cls.built_in = cls.__module__ == __name__
        names = ("layer_base", "token_offset", "head_stride")
        if any(n in cls.__dict__ for n in names):  # new arithmetic: compile it (missing parts inherited)
            functions = [getattr(cls, n, None) for n in names]
            if any(f is None for f in functions):
                raise TypeError(f"{cls.__name__} must define layer_base, token_offset and head_stride")
            key = (cls.short_name or cls.name) if cls.built_in else f"{cls.__module__}.{cls.__qualname__}"
            cls.parts = layouts.LayoutParts(key, *functions, head_split=cls.head_split, table=cls.per_layer,
                                            title=(cls.name or cls.__name__).replace("_", "-"))
            cls.user_layout = not cls.built_in
        if cls.built_in and cls.name is not None and "name" in cls.__dict__:
            _BUILT_IN.append(cls)

    def __init__(self, k: CacheBuffer, v: CacheBuffer | None = None) -> None:
        name = type(self).__name__
        if isinstance(k, (list, tuple)) or isinstance(v, (list, tuple)):
            if not isinstance(k, (list, tuple)) or not isinstance(v, (list, tuple, type(None))):
                raise TypeError(f"{name}: k and v must both be lists of per-layer arrays, or both arrays; got "
                                f"{type(k).__name__} and {type(v).__name__}")
            k = layers_alike(name, "k", k)  # a tuple the view owns: the caller's list may change
            v = None if v is None else layers_alike(name, "v", v)
        self.k, self.v = k, v
        self.geometry = self.shape(k)
        self.itemsize = self.array(k[0] if isinstance(k, tuple) else k)[1]
        if v is not None:
            other = self.shape(v)
            if other.dtype != self.geometry.dtype:
                raise TypeError(f"{name}: v is {other.dtype} but k is {self.geometry.dtype}: K and V must have the "
                                "same dtype")
            if other != self.geometry:
                raise ValueError(f"{name}: v has the geometry {other}, k has {self.geometry}")
        if self.parts is None:
            raise TypeError(f"{name} defines no address arithmetic (layer_base, token_offset, head_stride)")
        _refuse_empty(self, "k")
        self._held, self._kept, self.flagged = hold(self)
        check_user_layout(self)

    def check_unchanged(self, name: str | None = None, layers: SupportsIndex | range | None = None) -> None:
        """Raise ``ValueError`` if a buffer of this view that ``layers`` copies (None: every layer; an
        int or a range: those) was given new memory in place since the view was made (``resize_``,
        ``set_``, ``.data =``): its data pointer or size in bytes differs. ``name`` names the view in
        the message (``"src_view"``). This is what ``kv.copy`` checks on every call: comparisons of
        recorded integers, for torch tensors (and CuPy, ``__cuda_array_interface__`` arrays) only; NumPy
        arrays cannot be resized while a view holds them."""
        held = self._held
        if held is not None and not held.unchanged(layers):
            changed = held.changed(layers)
            if changed:
                raise ValueError(f"{name or type(self).__name__} ({self!r}) changed in place since it was made (resize_, "
                                 f"set_, .data =): {'; '.join(changed)}; make a new view over the buffers as they "
                                 "are now")

    # --- what a subclass provides -------------------------------------------------------------------

    def shape(self, buffer: Any) -> Geometry:
        raise TypeError(f"{type(self).__name__} defines no shape(buffer): a view class reads its geometry from a "
                        "buffer's shape")

    def logical(self, buffer: Any) -> Any:
        raise TypeError(f"{type(self).__name__} defines no logical(buffer): the reference and kv.convert's NumPy "
                        "engine need its NumPy picture [L, T/P, P, *item]")

    # --- shared ---------------------------------------------------------------------------------------

    @staticmethod
    def array(buffer: Any, name: str = "k") -> tuple[tuple[int, ...], int, str]:
        """``(shape, itemsize, dtype name)`` of any array kvnumba takes (torch, CuPy, Numba, NumPy): what
        a ``shape`` method reads. ``TypeError`` naming ``name`` for something else."""
        return shape_of(buffer, name)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one buffer of this layout holding ``tokens`` tokens of ``layers`` layers, items
        shaped ``item`` (``(H, D)`` or ``(D,)``): what ``kv.convert`` allocates. A user layout defines it
        to be a conversion's destination."""
        raise TypeError(f"{cls.__name__} defines no buffer_shape: it cannot be kv.convert's destination (define "
                        "the classmethod buffer_shape(layers, tokens, page_size, item) to make it one)")

    def item_shape(self) -> tuple[int, ...]:
        """One token's item shape: ``(H, D)``, or ``(D,)`` with one head."""
        g = self.geometry
        per_head = g.item_bytes // g.heads // self.itemsize
        return (g.heads, per_head) if g.heads > 1 else (per_head,)

    @property
    def mla(self) -> bool:
        return self.v is None

    @classmethod
    def parts_named(cls, name: str) -> layouts.LayoutParts | None:
        """This class's address arithmetic named ``name`` (``LayoutParts.name``), or None: how an export's
        layout is found again (``kvnumba.remote``). A class whose arithmetic depends on its buffers' shapes
        makes it here from the name."""
        return cls.parts if cls.parts is not None and cls.parts.name == name else None

    @property
    def head_runs(self) -> int:
        """How many runs this layout cuts a token's item into (``kvnumba.kernels.layouts.head_runs``)."""
        assert self.parts is not None
        return layouts.head_runs(self.parts, self.geometry.heads)

    def like(self, k: Any, v: Any = None) -> CacheView:
        """The same view (class and options) over other buffers, e.g. NumPy copies for the reference."""
        other = object.__new__(type(self))
        other.__dict__.update({key: value for key, value in self.__dict__.items()
                               if key not in ("k", "v", "_held", "_kept", "flagged")})
        type(self).__init__(other, k, v, **self._options())
        return other

    def _options(self) -> dict[str, Any]:
        return {}

    def layer_items(self, which: str, layer: int) -> Any:
        """K's (or V's) tokens of one layer as a NumPy view ``[T // P, P, *item]`` (NumPy buffers)."""
        buffer = self.k if which == "k" else self.v
        return self.logical(buffer)[layer]

    def buffers(self, which: str) -> list[Any]:
        """K's (or V's) arrays: one per layer for per-layer views, else one."""
        buffer: Any = self.k if which == "k" else self.v  # a list exactly when per_layer
        return list(buffer) if self.per_layer else [buffer]

    def kind_offset(self, which: str) -> int:
        """Where K's (or V's) items start in each of its arrays, in bytes: 0 unless K and V share arrays
        (vLLM's per-layer caches, SGLang's page-unified pool), where V starts this far into each."""
        return 0

    def __repr__(self) -> str:
        g = self.geometry
        return (f"{type(self).__name__}(L={g.layers}, T={g.tokens}, P={g.page_size}, H={g.heads}, "
                f"item={g.item_bytes} B{', MLA' if self.mla else ''})")


_PICTURE_ONLY = contextvars.ContextVar("picture_only", default=False)  # picture(): an empty cache allowed


def picture(cls: type[CacheView], array: Any) -> CacheView:
    """A view of class ``cls`` over one whole-cache ``array`` for its geometry and NumPy picture alone
    (``kv.convert`` reads shapes this way): a cache of no layers or no tokens is allowed here, where a view
    made to be copied refuses it."""
    token = _PICTURE_ONLY.set(True)
    try:
        return cls(array)
    finally:
        _PICTURE_ONLY.reset(token)


def _refuse_empty(view: CacheView, argument: str) -> None:
    """``ValueError`` naming ``argument`` for a view of no layers, no tokens or empty items: a copy of it
    could move nothing, and every index into it would be out of range."""
    if _PICTURE_ONLY.get():
        return
    g = view.geometry
    for what, count in (("layers", g.layers), ("tokens", g.tokens), ("item bytes", g.item_bytes)):
        if count == 0:
            raise ValueError(f"{type(view).__name__}: {argument} holds 0 {what} (shape {view.array(_first(view.k))[0]}); "
                             "a cache view needs at least one layer, one token and a non-empty item")


def _first(buffer: Any) -> Any:
    return buffer[0] if isinstance(buffer, (list, tuple)) else buffer


class Geometry:
    """A view's geometry, read from its buffers' shapes."""

    __slots__ = ("layers", "tokens", "page_size", "heads", "item_bytes", "layout_dim", "dtype")

    def __init__(self, layers: int, tokens: int, page_size: int, heads: int, item_bytes: int, layout_dim: int,
                 dtype: str) -> None:
        minimum = {"layers": 0, "tokens": 0, "page_size": 1, "heads": 1, "item_bytes": 0, "layout_dim": 0}
        values = dict(zip(minimum, (layers, tokens, page_size, heads, item_bytes, layout_dim)))
        for name, value in values.items():
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Geometry: {name} must be an integer, got {type(value).__name__}")
            if value < minimum[name]:
                raise ValueError(f"Geometry: {name} must be >= {minimum[name]}, got {value}")
        if item_bytes % heads:
            raise ValueError(f"Geometry: item_bytes={item_bytes} is not a whole number of bytes per head for "
                             f"heads={heads}")
        self.layers, self.tokens, self.page_size, self.heads = int(layers), int(tokens), int(page_size), int(heads)
        self.item_bytes, self.layout_dim, self.dtype = int(item_bytes), int(layout_dim), dtype

    def __eq__(self, other: object) -> bool:
        return all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return (f"Geometry(layers={self.layers}, tokens={self.tokens}, page_size={self.page_size}, heads={self.heads}, "
                f"item_bytes={self.item_bytes}, layout_dim={self.layout_dim}, dtype={self.dtype})")


def item_of(shape: Sequence[int], dtype_bytes: int, where: str) -> tuple[int, int]:
    """``(heads, item_bytes)`` of an item shaped ``shape``: ``(H, D)``, or ``(D,)`` for one vector."""
    if len(shape) == 1:
        return 1, shape[0] * dtype_bytes
    if len(shape) == 2:
        return shape[0], shape[0] * shape[1] * dtype_bytes
    raise ValueError(f"{where}: an item is (H, D) or (D,), got {tuple(shape)}")


# --- the built-in views ----------------------------------------------------------------------------

class LayerFirst(CacheView):
    """``[L, T, *item]`` (one array), or a list of L ``[T, *item]`` arrays (read through a layer table)."""

    name, short_name = "layer_first", "lf"
    parts = layouts.LAYER_FIRST  # one [L, T, *item] array; a view of per-layer lists reads a table (LAYER_TABLE)

    def __init__(self, k: CacheBuffer, v: CacheBuffer | None = None) -> None:
        self.per_layer = isinstance(k, (list, tuple))
        self.parts = layouts.LAYER_TABLE if self.per_layer else layouts.LAYER_FIRST
        super().__init__(k, v)

    def shape(self, buffer: Any) -> Geometry:
        if isinstance(buffer, (list, tuple)):
            if not buffer:
                raise ValueError("LayerFirst: a list of per-layer arrays must hold at least one layer")
            described = [shape_of(b, f"LayerFirst layer {i}") for i, b in enumerate(buffer)]
            if any(d != described[0] for d in described):
                raise ValueError("LayerFirst: every layer must have the same shape and dtype")
            shape, size, dtype = described[0]
            if len(shape) < 2:
                raise ValueError(f"LayerFirst: a layer is [T, *item], got {shape}")
            heads, item = item_of(shape[1:], size, "LayerFirst")
            return Geometry(len(described), shape[0], 1, heads, item, 0, dtype)
        shape, size, dtype = shape_of(buffer, "LayerFirst")
        if len(shape) < 3:
            raise ValueError(f"LayerFirst: a buffer is [L, T, *item], got {shape}")
        heads, item = item_of(shape[2:], size, "LayerFirst")
        return Geometry(shape[0], shape[1], 1, heads, item, shape[1] * item, dtype)

    @classmethod
    def buffer_shape(cls, layers: int, tokens: int, page_size: int, item: tuple[int, ...]) -> tuple[int, ...]:
        return (layers, tokens, *item)

    def logical(self, buffer: Any) -> Any:
        if isinstance(buffer, (list, tuple)):
            return [b[:, None] for b in buffer]  # per layer [T, 1, *item]
        return buffer[:, :, None]  # [L, T, 1, *item]


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


class _Paged(CacheView):
    """A paged single-buffer layout: ``page_size`` (optional) must agree with the buffers' page axis."""

    paged = True

    def __init__(self, k: ArrayLike, v: ArrayLike | None = None, page_size: SupportsIndex | None = None) -> None:
        self.page_size_given = page_size
        super().__init__(k, v)
        if page_size is not None:
            page_size = validate.integer("page_size", page_size, minimum=1, maximum=validate.MAX_SIZE)
            if page_size != self.geometry.page_size:
                raise ValueError(f"{type(self).__name__}: page_size={page_size}, but the buffers' pages hold "
                                 f"{self.geometry.page_size} tokens")

    def _options(self) -> dict[str, Any]:
        return {"page_size": self.page_size_given}


class PageFirstDirect(_Paged):
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


class PageHead(_Paged):
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


class PageUnified(_Paged):
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

        name = "pu" if kinds == 2 and groups == 1 else "pu_mla" if kinds == 1 else f"pu_g{groups}"
        made = layouts.LayoutParts(name, layer_base, token_offset,
                                   layouts.item_head_stride if groups == 1 else group_stride,
                                   head_split=groups > 1, head_runs=groups if groups > 1 else None,
                                   title="page-unified")
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
        if len(item) == 1:
            return (tokens // page_size, layers, page_size, item[0])
        return (tokens // page_size, 1, layers, 2, page_size, *item)

    def kind_offset(self, which: str) -> int:
        g = self.geometry
        return g.page_size * (g.item_bytes // self.head_groups) if which == "v" else 0  # V follows K in a layer

    def like(self, k: Any, v: Any = None) -> CacheView:
        return type(self)(k, **self._options())

    def layer_items(self, which: str, layer: int) -> Any:
        buffer = np.asarray(self.k)
        if self.mla:
            return buffer[:, layer]  # [T/P, P, D]
        return np.moveaxis(buffer[:, :, layer, 0 if which == "k" else 1], 1, 2)  # [T/P, P, G, H/G, D]


PageUnified.parts = PageUnified.arithmetic(2, 1)  # the class's own: one head group of K and V (an instance: its shape's)


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
        _refuse_empty(self, "caches")
        self._held, self._kept, self.flagged = hold(self)
        check_user_layout(self)

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
    parts = layouts.BLOCKS

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

    def logical_layer(self, cache: Any, which: str) -> Any:
        return cache[0 if which == "k" else 1]  # [blocks, P, H, D]


class VllmFlashInfer(_Blocks):
    """FlashInfer's paged cache as vLLM keeps it: per layer ``[num_blocks, 2, block_size, H, D]`` ("NHD")
    or ``[num_blocks, 2, H, block_size, D]`` ("HND")."""

    name = "vllm_flash_infer"

    def __init__(self, caches: Sequence[ArrayLike], layout: Literal["NHD", "HND"] = "NHD") -> None:
        if layout not in ("NHD", "HND"):
            raise ValueError(f"VllmFlashInfer: layout must be 'NHD' or 'HND', got {layout!r}")
        self.layout = layout
        self.parts = layouts.BLOCKS if layout == "NHD" else layouts.HEAD_MAJOR_BLOCKS
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

    def logical_layer(self, cache: Any, which: str) -> Any:
        half = cache[:, 0 if which == "k" else 1]
        return half if self.layout == "NHD" else np.swapaxes(half, 1, 2)  # [blocks, P, H, D]


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


# --- the one layout vocabulary: view classes and their string names --------------------------------

BUILT_IN: tuple[type[CacheView], ...] = tuple(_BUILT_IN)
"""kvnumba's view classes: each declares its layout in its own class (a new one joins by being declared)."""
NAMES: dict[str, type[CacheView]] = {n: cls for cls in BUILT_IN for n in (cls.name, cls.short_name) if n}
"""Every string name of kvnumba's views (``"page_first"``) and their short names (``"pf"``)."""


def view_name(cls: type[CacheView]) -> str:
    """A view class's string name: kvnumba's own (``"page_first"``), or ``module:Class`` for one of yours."""
    return cls.name if cls.name is not None and NAMES.get(cls.name) is cls else f"{cls.__module__}:{cls.__qualname__}"


def view_class(value: Any, argument: str = "layout", among: Sequence[type[CacheView]] = ()) -> type[CacheView]:
    """The view class ``value`` names: a ``CacheView`` subclass itself, a string name or short name (read in any
    case, ``-`` for ``_``: ``"Page-First"``), or ``"module:Class"`` naming a subclass (a layout of your own).
    ``ValueError`` naming ``argument`` otherwise, listing the names of ``among`` (the layouts the caller
    takes; all of kvnumba's when empty)."""
    if isinstance(value, type) and issubclass(value, CacheView):
        return value
    if isinstance(value, str) and ":" in value:
        return _imported_view(value, argument)
    if isinstance(value, str):
        found = NAMES.get(value.strip().lower().replace("-", "_"))
        if found is not None:
            return found
    names = ", ".join(f"{cls.name} ({cls.short_name})" if cls.short_name else str(cls.name)
                      for cls in (among or BUILT_IN) if cls.name)
    raise ValueError(f"{argument}: unknown layout {value!r}: expected one of {names}, or module:Class")


def _imported_view(path: str, argument: str) -> type[CacheView]:
    """``module:Class`` naming a ``kv.CacheView`` subclass (a user-defined layout)."""
    import importlib

    module_name, _, class_name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{argument}: cannot import layout {path!r}: {err}") from None
    if not (isinstance(found, type) and issubclass(found, CacheView)):
        raise ValueError(f"{argument}: {path!r} is not a kvnumba.CacheView subclass")
    return found
