"""``CacheView`` (buffers plus a layout plus geometry), ``Geometry``, and the registry: a view class registers
itself by declaring its ``name`` (and ``short_name``); ``NAMES`` maps each to its class, ``registered()`` gives
the classes in the order declared, ``view_class`` reads a name (or ``module:Class``), ``view_name`` gives it back.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, SupportsIndex

import numpy as np

from ..arrays import shape_of
from ..checks import validate
from ..checks.user_layouts import check_user_layout
from ..kernels import layouts
from ..types import ArrayLike, CacheBuffer
from .buffers import Held, hold, layers_alike

_PACKAGE = __name__.rpartition(".")[0] + "."  # kvnumba's own layouts live in this package

NAMES: dict[str, type[CacheView]] = {}
"""Every registered layout's string name (``"page_first"``) and short name (``"pf"``), in the order declared."""

Allocate = Callable[[tuple[int, ...]], Any]  # makes a uint8 array of a shape (a staging view's memory)


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

    A view describes its buffers as they were when it was made, and holds them (``kvnumba.layouts.buffers``
    says how; ``check_unchanged`` is the per-call check). A view class of your own (not kvnumba's) has its
    arithmetic evaluated at construction at every layer and token, with the heads a copy can use: every
    byte it can reach must lie in its buffer, K and V each.

    What the routes read of a class, never its name: ``parts`` (the kernels and the copy engine), ``staging``,
    ``stages``, ``export_options`` and ``parts_named`` (``kvnumba.remote``), ``buffer_shape``, ``whole_tensor``,
    ``kv_pool`` and ``paged`` (``kv.convert``).
    """

    name: ClassVar[str | None] = None  # its registered name ("page_first"): see NAMES and view_class
    short_name: ClassVar[str | None] = None  # its short name, where it has one ("pf")
    whole_tensor = True  # one array holds all of a cache's K (or V): kv.convert reads and writes this layout
    head_split = False
    paged = False  # its shapes have a page axis (kv.convert then needs page_size)
    kv_pool = False  # K and V in one array: kv.convert takes a pool for the pair (k, v) (kvnumba.convert.unified)
    per_layer = False  # k is a list of per-layer arrays (the kernel reads a table of their addresses)
    raw_tables = False  # k and v are raw uint64 tables of layer addresses (LayerTable)
    parts: layouts.LayoutParts | None = None  # LayoutParts, made from the three functions of a subclass

    user_layout = False  # True for a subclass that brings its own address arithmetic
    built_in = True  # one of kvnumba's views (its arithmetic follows its shapes: not checked at run time)
    _held: Held | None  # what kv.copy compares of its buffers per call (kvnumba.layouts.buffers)
    _kept: list[Any]  # what keeps the memory of its other buffers from moving
    flagged: tuple[Any, ...]  # NumPy arrays whose writable flag a plan of this view reads again (arrays.flagged)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A layout is declared by its class: three address functions (and ``head_split``, ``per_layer``) make
        its ``LayoutParts``; a class that declares a ``name`` joins the registry (``NAMES``)."""
        super().__init_subclass__(**kwargs)
        cls.built_in = cls.__module__.startswith(_PACKAGE)
        names = ("layer_base", "token_offset", "head_stride")
        if any(n in cls.__dict__ for n in names):  # new arithmetic: compile it (missing parts inherited)
            functions = [getattr(cls, n, None) for n in names]
            if any(f is None for f in functions):
                raise TypeError(f"{cls.__name__} must define layer_base, token_offset and head_stride")
            key = (cls.short_name or cls.name) if cls.built_in else f"{cls.__module__}.{cls.__qualname__}"
            cls.parts = layouts.LayoutParts(key, *functions, head_split=cls.head_split, table=cls.per_layer,
                                            title=(cls.name or cls.__name__).replace("_", "-"))
            cls.user_layout = not cls.built_in
        if cls.name is not None and "name" in cls.__dict__:
            for name in (cls.name, cls.short_name):
                taken = NAMES.get(name or "", cls)
                if taken is not cls:
                    raise TypeError(f"{cls.__name__}: the layout name {name!r} is {taken.__name__}'s")
            NAMES.update({name: cls for name in (cls.name, cls.short_name) if name})

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
        self._finish("k")

    def _finish(self, argument: str) -> None:
        """The end of every constructor: a cache of nothing refused, naming ``argument`` (a copy of it could move
        nothing: every index would be out of range; ``picture`` allows it), the buffers held, the arithmetic of a
        layout of your own checked."""
        g = self.geometry
        for what, count in (("layers", g.layers), ("tokens", g.tokens), ("item bytes", g.item_bytes)):
            if count == 0 and not _PICTURE_ONLY.get():
                first = self.k[0] if isinstance(self.k, (list, tuple)) else self.k
                raise ValueError(f"{type(self).__name__}: {argument} holds 0 {what} (shape {self.array(first)[0]}); "
                                 "a cache view needs at least one layer, one token and a non-empty item")
        self._held, self._kept, self.flagged = hold(self)
        check_user_layout(self)

    def check_unchanged(self, name: str | None = None, layers: SupportsIndex | range | None = None) -> None:
        """Raise ``ValueError`` if a buffer of this view that ``layers`` copies (None: every layer; an
        int or a range: those) was given new memory in place since the view was made (``resize_``,
        ``set_``, ``.data =``): make a new view then. ``name`` names the view in the message
        (``"src_view"``). ``kv.copy`` checks this on every call (``kvnumba.layouts.buffers.Held``)."""
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

    @classmethod
    def staging(cls, remote: Any, pages: int, layers: Any, allocate: Allocate) -> CacheView:
        """A view of this layout like ``remote`` (a ``kvnumba.remote`` side: its ``geometry``, ``mla``, ``parts``
        and ``origin.options``) holding ``pages`` pages, for ``layers`` (sorted: those a copy touches), its buffers
        raw bytes from ``allocate(shape)``: where the staged route lands the remote's runs (``kvnumba.remote.staging``).
        Here: ``buffer_shape`` with layers ``0 .. last copied`` (a layout of your own: every layer)."""
        g = remote.geometry
        kept = int(layers[-1]) + 1 if cls.built_in else g.layers
        shape = cls.buffer_shape(kept, pages * g.page_size, g.page_size, raw_item(g))
        return cls(allocate(shape), None if remote.mla else allocate(shape))

    @classmethod
    def stages(cls) -> bool:
        """Whether ``staging`` can make a view of this layout: a class with its own, or one buffer with a shape."""
        own = cls.staging.__func__ is not CacheView.staging.__func__  # type: ignore[attr-defined]
        return own or not cls.per_layer and cls.buffer_shape.__func__ is not CacheView.buffer_shape.__func__  # type: ignore[attr-defined]

    def export_options(self) -> dict[str, Any]:
        """What an export carries of this view's options (those a staging view of its layout is made with)."""
        return {key: value for key, value in self._options().items() if isinstance(value, (int, str, type(None)))}

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


def raw_item(g: Geometry) -> tuple[int, int]:
    """A staging view's item as raw bytes, ``(H, item/H)``: every view takes it, opposite any dtype."""
    return (g.heads, g.item_bytes // g.heads)


def per_layer(make_layer: Callable[[], Any], layers: Any, total: int) -> list[Any]:
    """A staging view's per-layer list: ``total`` entries, a fresh array for each of ``layers`` (those a copy
    touches), the first of them elsewhere (never read or written: ``kv.copy`` maps layer ``l`` to layer ``l``)."""
    arrays = {int(layer): make_layer() for layer in layers}
    return [arrays.get(layer, arrays[int(layers[0])]) for layer in range(total)]


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


def leading(buffer: Any, axes: int, where: str, form: str) -> tuple[tuple[int, ...], int, int, str]:
    """``(its first axes, heads, item bytes, dtype)`` of a buffer of the ``form`` ``[*axes, *item]``;
    ``ValueError`` saying so, from ``where``, for one of too few axes."""
    shape, size, dtype = shape_of(buffer, where)
    if len(shape) <= axes:
        raise ValueError(f"{where}: a buffer is {form}, got {shape}")
    return (shape[:axes], *item_of(shape[axes:], size, where), dtype)


def item_of(shape: Sequence[int], dtype_bytes: int, where: str) -> tuple[int, int]:
    """``(heads, item_bytes)`` of an item shaped ``shape``: ``(H, D)``, or ``(D,)`` for one vector."""
    if len(shape) == 1:
        return 1, shape[0] * dtype_bytes
    if len(shape) == 2:
        return shape[0], shape[0] * shape[1] * dtype_bytes
    raise ValueError(f"{where}: an item is (H, D) or (D,), got {tuple(shape)}")


class Paged(CacheView):
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


# --- the registry ----------------------------------------------------------------------------------

def registered() -> tuple[type[CacheView], ...]:
    """Every registered layout class, in the order declared (kvnumba's own first)."""
    return tuple(dict.fromkeys(NAMES.values()))


def declared(base: type[CacheView] | None = None) -> list[type[CacheView]]:
    """Every ``CacheView`` subclass (of ``base``) defined in this process: kvnumba's and yours, named or not."""
    return [c for sub in (base or CacheView).__subclasses__() for c in (sub, *declared(sub))]


def view_name(cls: type[CacheView]) -> str:
    """A view class's string name: a registered one's (``"page_first"``), or ``module:Class``."""
    return cls.name if cls.name is not None and NAMES.get(cls.name) is cls else f"{cls.__module__}:{cls.__qualname__}"


def view_class(value: Any, argument: str = "layout", among: Sequence[type[CacheView]] = ()) -> type[CacheView]:
    """The view class ``value`` names: a ``CacheView`` subclass itself, a string name or short name (read in any
    case, ``-`` for ``_``: ``"Page-First"``), or ``"module:Class"`` naming a subclass (a layout of your own).
    ``ValueError`` naming ``argument`` otherwise, listing the names of ``among`` (the layouts the caller
    takes; every registered one when empty)."""
    if isinstance(value, type) and issubclass(value, CacheView):
        return value
    if isinstance(value, str) and ":" in value:
        return _imported_view(value, argument)
    if isinstance(value, str):
        found = NAMES.get(value.strip().lower().replace("-", "_"))
        if found is not None:
            return found
    names = ", ".join(f"{cls.name} ({cls.short_name})" if cls.short_name else str(cls.name)
                      for cls in (among or registered()) if cls.name)
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
