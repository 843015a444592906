"""Whole-cache layout conversion: one K (or V, or MLA) tensor of T tokens and L layers, re-laid out.

Layouts (``item`` is one token's shape in one layer: ``(H, D)`` for MHA, ``(1, D)`` or ``(D,)`` for
MLA; ``P`` is the page size):

- ``layer_first``: ``(L, T, *item)``
- ``page_first``: ``(T, L, *item)``
- ``page_first_direct``: ``(T // P, L, P, *item)`` (the memcpy path's layout)
- ``page_head``: ``(T // P, H, P, L, D)`` (MHA items ``(H, D)`` only)

A layout is one of those names, or a cache view class (``kvnumba.api.views``): a user-defined
layout (a ``kv.CacheView`` subclass with a ``buffer_shape`` classmethod) converts to and from every
other; on the command line, name it ``module:Class``.

Two engines do the same thing:

- ``"numpy"``: every layout is a strided view of one index space ``(L, T // P, P, *item)`` (a view
  class's ``logical``); the conversion is one NumPy assignment between the source's view and the
  destination's (no intermediate copy). Used for NumPy arrays (and CPU torch tensors), and by
  ``kvnumba convert``.
- ``"kernels"``: ``kv.copy`` between the two layouts' views (MLA form: one buffer), every token and
  layer, one launch, for arrays in GPU memory (torch, CuPy, Numba). ``convert`` returns after the
  GPU work is done. On the simulator the kernel engine works on NumPy arrays (tiny ones: the
  simulator runs one Python thread per CUDA thread).

``engine="auto"`` picks the kernels for GPU memory on a real GPU, NumPy otherwise.

Given a file's path instead of an array (``.npy``, ``.npz`` or ``.safetensors``), ``convert`` converts
every array in it into the file ``out``, as ``kvnumba convert`` does (``kvnumba.convert_files``).
"""
from __future__ import annotations

import enum
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, SupportsIndex, TypeAlias, TypeVar, Union, overload

import numpy as np

from .checks import validate
from .driver.target import SIMULATOR, gpu_available
from .arrays import ArrayInfo, array_info
from .api.views import CacheView  # for annotations (the functions below import what they use themselves)
from .types import ArrayLike, SupportsCudaArrayInterface, TorchTensorLike

__all__ = ["CacheLayout", "LayoutArg", "LayoutName", "convert", "converted_shape"]

_Scalar = TypeVar("_Scalar", bound=np.generic)
_GpuArray = TypeVar("_GpuArray", bound=Union[SupportsCudaArrayInterface, TorchTensorLike])
Engine: TypeAlias = Literal["auto", "numpy", "kernels"]


class CacheLayout(str, enum.Enum):
    """Whole-cache layouts. Accepts its value (``"page_first"``) or a short name (``"pf"``)."""

    LAYER_FIRST = "layer_first"
    PAGE_FIRST = "page_first"
    PAGE_FIRST_DIRECT = "page_first_direct"
    PAGE_HEAD = "page_head"

    @classmethod
    def _missing_(cls, value: object) -> CacheLayout:
        if isinstance(value, str):
            name = value.strip().lower().replace("-", "_")
            name = _ALIASES.get(name, name)
            for member in cls:
                if member.value == name:
                    return member
        names = ", ".join(m.value for m in cls)
        short = ", ".join(f"{k}={v}" for k, v in _ALIASES.items())
        raise ValueError(f"unknown layout {value!r}: expected one of {names} (or short names {short})")

    @property
    def paged(self) -> bool:
        """True when the layout's shape has a page axis (and so needs ``page_size``)."""
        return self in (CacheLayout.PAGE_FIRST_DIRECT, CacheLayout.PAGE_HEAD)


LayoutName: TypeAlias = Literal["layer_first", "page_first", "page_first_direct", "page_head", "lf", "pf", "pfd", "ph"]
"""A layout's name, or its short name, as type checkers know them (a misspelt one is an error)."""
LayoutArg: TypeAlias = Union[LayoutName, CacheLayout, "type[CacheView]"]
"""A layout as ``convert`` is typed to take it: a name (or short name), a ``CacheLayout`` or a view class. At
run time names are read in any case, and ``"module:Class"`` names a view class (the command line's form)."""
LayoutLike: TypeAlias = Union[str, CacheLayout, "type[CacheView]"]  # what the functions below read at run time
Lay: TypeAlias = Union[CacheLayout, "type[CacheView]"]  # a layout, resolved by ``layout``

_ALIASES = {"lf": "layer_first", "pf": "page_first", "pfd": "page_first_direct", "ph": "page_head"}

_SHAPES = {
    CacheLayout.LAYER_FIRST: "(L, T, *item)",
    CacheLayout.PAGE_FIRST: "(T, L, *item)",
    CacheLayout.PAGE_FIRST_DIRECT: "(T // page_size, L, page_size, *item)",
    CacheLayout.PAGE_HEAD: "(T // page_size, H, page_size, L, D)",
}


class Dims(NamedTuple):
    """What a shape says in a layout's terms."""

    layers: int
    tokens: int
    item: tuple[int, ...]  # the per-token shape
    token_axis: str  # where T is read, for messages: "dimension 0" or "dimensions 0 and 2"


def layout(value: LayoutLike, name: str = "layout") -> Lay:
    """``value`` as a ``CacheLayout``, or a cache view class (given as the class or as ``module:Class``);
    ``ValueError`` listing the valid names otherwise."""
    from .api.views import CacheView

    if isinstance(value, type) and issubclass(value, CacheView):
        return value
    if isinstance(value, str) and ":" in value:
        return _imported_view(value, name)
    try:
        return CacheLayout(value)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _imported_view(path: str, name: str) -> type[CacheView]:
    """``module:Class`` naming a ``kv.CacheView`` subclass (a user-defined layout)."""
    import importlib

    from .api.views import CacheView

    module_name, _, class_name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{name}: cannot import layout {path!r}: {err}") from None
    if not (isinstance(found, type) and issubclass(found, CacheView)):
        raise ValueError(f"{name}: {path!r} is not a kvnumba.CacheView subclass")
    return found


def layout_name(lay: Lay) -> str:
    """A layout's name for messages and file headers: its value, or ``module:Class``."""
    return lay.value if isinstance(lay, CacheLayout) else f"{lay.__module__}:{lay.__qualname__}"


def paged(lay: Lay) -> bool:
    """True when layout ``lay`` has a page axis (and so needs ``page_size``)."""
    return lay.paged


def _page_size(value: SupportsIndex | None, needed_by: str) -> int:
    if value is None:
        raise ValueError(f"{needed_by} needs page_size (tokens per page): pass page_size=")
    return validate.integer("page_size", value, minimum=1)


def dims(src: LayoutLike, shape: Sequence[int], page_size: int | None = None) -> Dims:
    """Read ``L``, ``T`` and the item shape off ``shape`` in layout ``src``; ``ValueError`` if it does not fit."""
    src = layout(src, "src")
    shape = tuple(int(n) for n in shape)
    if not isinstance(src, CacheLayout):  # a view class reads its own shapes
        view = src(_shaped(shape))
        g = view.geometry
        if page_size is not None and src.paged and g.page_size != page_size:
            raise ValueError(f"{layout_name(src)}: its page size is {g.page_size} (shape {shape}), "
                             f"page_size={page_size} was given")
        return Dims(g.layers, g.tokens, view.item_shape(), f"shape {shape} in {layout_name(src)}")
    minimum = {CacheLayout.LAYER_FIRST: 3, CacheLayout.PAGE_FIRST: 3, CacheLayout.PAGE_FIRST_DIRECT: 4}.get(src)
    if src is CacheLayout.PAGE_HEAD and len(shape) != 5:
        raise ValueError(f"page_head arrays are {_SHAPES[src]}, 5 dimensions: got shape {shape}")
    if minimum and len(shape) < minimum:
        raise ValueError(f"{src.value} arrays are {_SHAPES[src]}, at least {minimum} dimensions "
                         f"(an item has at least one): got shape {shape}")
    if src is CacheLayout.LAYER_FIRST:
        return Dims(shape[0], shape[1], shape[2:], f"dimension 1 of shape {shape}")
    if src is CacheLayout.PAGE_FIRST:
        return Dims(shape[1], shape[0], shape[2:], f"dimension 0 of shape {shape}")
    page_size = _page_size(page_size, src.value)
    page_axis = 2
    if shape[page_axis] != page_size:
        raise ValueError(f"{src.value} arrays are {_SHAPES[src]}: dimension {page_axis} should be "
                         f"page_size={page_size}, got {shape[page_axis]} (shape {shape})")
    where = f"dimensions 0 and 2 of shape {shape}"
    if src is CacheLayout.PAGE_FIRST_DIRECT:
        return Dims(shape[1], shape[0] * page_size, shape[3:], where)
    pages, heads, _, layers, head_dim = shape
    return Dims(layers, pages * page_size, (heads, head_dim), where)


def converted_shape(shape: Sequence[int], src: LayoutLike, dst: LayoutLike,
                    page_size: int | None = None) -> tuple[int, ...]:
    """The shape an array of ``shape`` in layout ``src`` has in layout ``dst``.

    Raises
    ------
    ValueError
        If a name is unknown, ``shape`` does not fit ``src``, ``page_size`` is missing or does not
        divide T where ``dst`` pages tokens, or ``dst`` is page_head and items are not ``(H, D)``.
    """
    src, dst = layout(src, "src"), layout(dst, "dst")
    d = dims(src, shape, page_size)
    if not isinstance(dst, CacheLayout):
        if dst.paged:
            page_size = _page_size(page_size, layout_name(dst))
            if d.tokens % page_size:
                raise ValueError(f"{layout_name(dst)} needs T divisible by page_size={page_size}: got T={d.tokens} "
                                 f"({d.token_axis})")
        return tuple(dst.buffer_shape(d.layers, d.tokens, page_size if dst.paged else 1,  # type: ignore[arg-type]
                                      d.item))  # page_size is an int when dst.paged
    if dst is CacheLayout.LAYER_FIRST:
        return (d.layers, d.tokens, *d.item)
    if dst is CacheLayout.PAGE_FIRST:
        return (d.tokens, d.layers, *d.item)
    page_size = _page_size(page_size, dst.value)
    if d.tokens % page_size:
        raise ValueError(f"{dst.value} needs T divisible by page_size={page_size}: got T={d.tokens} "
                         f"({d.token_axis})")
    pages = d.tokens // page_size
    if dst is CacheLayout.PAGE_FIRST_DIRECT:
        return (pages, d.layers, page_size, *d.item)
    if len(d.item) != 2:
        raise ValueError(f"page_head needs a per-token item of shape (H, D) to find H: got item shape "
                         f"{d.item} (shape {tuple(shape)} in {layout_name(src)})")
    heads, head_dim = d.item
    return (pages, heads, page_size, d.layers, head_dim)


# --- The NumPy engine: every layout as a view of the index space (L, pages, P, *item) ---------------

def canonical_view(array: np.ndarray, lay: Lay, page_size: int | None) -> np.ndarray:
    """A view of ``array`` (layout ``lay``) with axes ``(L, T // P, P, *item)``; P is 1 when unpaged.

    Writing to the view writes ``array``: the NumPy engine assigns one such view to another.
    """
    p = page_size or 1
    if not isinstance(lay, CacheLayout):
        return _class_view(array, lay, p)
    if lay is CacheLayout.LAYER_FIRST:
        layers, tokens, *item = array.shape
        return array.reshape(layers, tokens // p, p, *item)
    if lay is CacheLayout.PAGE_FIRST:
        tokens, layers, *item = array.shape
        v = array.reshape(tokens // p, p, layers, *item)
        return v.transpose(2, 0, 1, *range(3, v.ndim))
    if lay is CacheLayout.PAGE_FIRST_DIRECT:
        return array.transpose(1, 0, 2, *range(3, array.ndim))
    return array.transpose(3, 0, 2, 1, 4)  # page_head (N, H, P, L, D) -> (L, N, P, H, D)


def _class_view(array: np.ndarray, lay: type[CacheView], p: int) -> np.ndarray:
    """A view class's ``logical`` picture of ``array``, ``(L, T // Pc, Pc, *item)``, reshaped to the
    common page size ``p`` in place (a view, never a copy: the engine writes through it)."""
    logical = lay(array).logical(array)
    layers, pages, page, *item = logical.shape
    if page == p:
        return logical
    out = logical.view()
    try:
        out.shape = (layers, pages * page // p, p, *item)
    except AttributeError:
        raise ValueError(f"{layout_name(lay)}: its pages of {page} tokens do not fit pages of {p} "
                         "(convert between layouts of one page size)") from None
    return out


def _shaped(shape: tuple[int, ...]) -> np.ndarray:
    """A NumPy array of ``shape`` with no memory behind it (every element the same byte): view
    classes read geometry from it."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=(0,) * len(shape))


def _view_page_size(src: Lay, dst: Lay, page_size: int | None) -> int | None:
    """The page size for the canonical views: the given one if either side pages tokens, else 1."""
    return page_size if (paged(src) or paged(dst)) else 1


def _numpy_convert(array: np.ndarray, src: Lay, dst: Lay, page_size: int | None,
                   out_shape: tuple[int, ...]) -> np.ndarray:
    p = _view_page_size(src, dst, page_size)
    out = np.empty(out_shape, dtype=array.dtype)
    canonical_view(out, dst, p)[...] = canonical_view(array, src, p)
    return out


def _torch_cpu_as_numpy(t: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """A CPU torch tensor as NumPy (bf16 and fp8 viewed as same-size integers), and the way back."""
    torch = sys.modules["torch"]
    try:
        return t.numpy(), torch.from_numpy
    except TypeError:
        dtype = t.dtype
        as_int = getattr(torch, f"int{8 * t.element_size()}")
        return t.view(as_int).numpy(), lambda a: torch.from_numpy(a).view(dtype)


# --- The kernel engine ----------------------------------------------------------------------------------

class _Device:
    """Allocation, index arrays and address tables where the kernels can use them, for one input kind."""

    def __init__(self, info: ArrayInfo) -> None:
        self.info = info
        self.obj = info.obj
        self.kind = "torch" if info.is_torch else type(info.obj).__module__.split(".")[0]

    def empty(self, shape: tuple[int, ...]) -> Any:
        obj = self.obj
        if self.kind == "torch":
            return sys.modules["torch"].empty(shape, dtype=obj.dtype, device=obj.device)
        if self.kind == "cupy":
            return sys.modules["cupy"].empty(shape, dtype=obj.dtype)
        if isinstance(obj, np.ndarray):  # the simulator: NumPy stands for device memory
            return np.empty(shape, dtype=obj.dtype)
        from numba import cuda

        return cuda.device_array(shape, dtype=np.dtype(obj.dtype))

    def put(self, host_array: np.ndarray) -> Any:
        """A small NumPy array (indices) where the kernels read it, on the input's device."""
        host_array = np.ascontiguousarray(host_array)
        if SIMULATOR:
            return host_array
        if self.kind == "torch":
            return sys.modules["torch"].from_numpy(host_array).to(self.obj.device)
        if self.kind == "cupy":
            with self.obj.device:
                return sys.modules["cupy"].asarray(host_array)
        from numba import cuda

        from .driver.devices import on_device

        with on_device(self.info.device):
            return cuda.to_device(host_array)

    @staticmethod
    def synchronize() -> None:
        if not SIMULATOR:
            from numba import cuda

            cuda.synchronize()


def _default_launch() -> tuple[int, int]:
    """Launch shape for conversions: tiny on the simulator, wide on a GPU (this is not a background copy)."""
    return (2, 1) if SIMULATOR else (1024, 8)


_VIEWS: dict[CacheLayout, type[CacheView]] = {}  # CacheLayout -> its view class


def _view_class(lay: Lay) -> type[CacheView]:
    if isinstance(lay, CacheLayout):
        if not _VIEWS:
            from .api import views

            _VIEWS.update({CacheLayout.LAYER_FIRST: views.LayerFirst, CacheLayout.PAGE_FIRST: views.PageFirst,
                           CacheLayout.PAGE_FIRST_DIRECT: views.PageFirstDirect,
                           CacheLayout.PAGE_HEAD: views.PageHead})
        return _VIEWS[lay]
    return lay


def _kernel_convert(info: ArrayInfo, src: Lay, dst: Lay, page_size: int | None, d: Dims, out_shape: tuple[int, ...],
                    launch: tuple[int, int]) -> Any:
    count = math.prod(info.shape)
    itemsize = info.nbytes // count if count else 1
    item_bytes = math.prod(d.item) * itemsize
    split = [lay for lay in (src, dst) if _view_class(lay).head_split]
    heads = d.item[0] if split and len(d.item) == 2 else 1
    if item_bytes % 8:
        raise ValueError(f"engine='kernels' moves 8-byte words: one token's item is {item_bytes} bytes "
                         f"(item shape {d.item} x {itemsize} B), not a multiple of 8; use engine='numpy'")
    if heads > 1 and item_bytes % (8 * heads):
        raise ValueError(f"engine='kernels' copies page_head items head by head: item_size / H = "
                         f"{item_bytes} / {heads} bytes is not a multiple of 8; use engine='numpy'")
    device = _Device(info)
    out = device.empty(out_shape)
    if count == 0:
        return out
    from .api.copy import copy

    array = info.obj
    src_arr, dst_arr = array, out
    if len(d.item) > 2:  # views take items (H, D) or (D,): merge the trailing axes (views of the same bytes)
        src_arr = array.reshape(*info.shape[:len(info.shape) - len(d.item)], -1)
        dst_arr = out.reshape(*out_shape[:len(out_shape) - len(d.item)], -1)
    tokens = device.put(np.arange(d.tokens, dtype=np.int64))
    copy(_view_class(src)(src_arr), _view_class(dst)(dst_arr), tokens, tokens, block_quota=launch[0],
         num_warps_per_block=launch[1])
    device.synchronize()
    return out


@overload
def convert(array: str | os.PathLike[str], src: LayoutArg, dst: LayoutArg, page_size: SupportsIndex | None = None,
            *, out: str | os.PathLike[str], overwrite: bool = False,
            engine: Literal["auto", "numpy"] = "auto") -> dict[str, tuple[int, ...]]: ...
@overload
def convert(array: np.ndarray[Any, np.dtype[_Scalar]], src: LayoutArg, dst: LayoutArg,
            page_size: SupportsIndex | None = None, *, out: None = None, engine: Engine = "auto",
            block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None) -> np.ndarray[tuple[int, ...], np.dtype[_Scalar]]: ...
@overload
def convert(array: _GpuArray, src: LayoutArg, dst: LayoutArg, page_size: SupportsIndex | None = None, *,
            out: None = None, engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None) -> _GpuArray: ...
def convert(array: ArrayLike | str | os.PathLike[str], src: LayoutArg, dst: LayoutArg,
            page_size: SupportsIndex | None = None, *, out: str | os.PathLike[str] | None = None, overwrite: bool = False,
            engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None) -> Any:
    """Return ``array``, one K (or V, or MLA) tensor of a whole cache, re-laid out from ``src`` to ``dst``;
    or, given a file's path, convert every array in the file into the file ``out``.

    Parameters
    ----------
    array : array, str or os.PathLike
        A NumPy array (any memory order), a CPU torch tensor, or a GPU array (torch, CuPy, Numba).
        C-contiguous for the kernel engine. Shapes, for T tokens, L layers, item ``(H, D)`` (MHA) or ``(1, D)``/``(D,)`` (MLA):

        - ``"layer_first"``: ``(L, T, *item)``
        - ``"page_first"``: ``(T, L, *item)``
        - ``"page_first_direct"``: ``(T // page_size, L, page_size, *item)``
        - ``"page_head"``: ``(T // page_size, H, page_size, L, D)``

        Or the path of a ``.npy`` file, ``.npz`` archive or ``.safetensors`` file: every array in it is
        converted (with NumPy, in chunks) into ``out``, as ``kvnumba convert`` does.
    src, dst : str, CacheLayout or CacheView subclass
        Layout names (or short names ``lf``, ``pf``, ``pfd``, ``ph``), a view class (a user-defined
        layout: a ``kv.CacheView`` subclass with ``buffer_shape``), or ``"module:Class"`` naming one.
    page_size : int, optional
        Tokens per page; required when either layout is paged (page_first_direct, page_head, or a
        paged view class), unused (but checked) when neither is (``kvnumba convert`` refuses ``--page-size``
        there).
    out : str or os.PathLike, optional
        The output file when ``array`` is a path, written in the format its suffix names (``.npy``,
        ``.npz`` or ``.safetensors``); not the input file. It appears complete or not at all; a
        ``.safetensors`` output keeps a ``.safetensors`` input's metadata and its bf16/fp8 dtypes.
    overwrite : bool
        For a file: replace an existing ``out`` (default False: ``FileExistsError``).
    engine : {"auto", "numpy", "kernels"}
        ``"auto"``: kvnumba's kernels for GPU memory on a real GPU, NumPy otherwise. ``"kernels"`` on
        the simulator runs the kernels on (tiny) NumPy arrays.
    block_quota, num_warps_per_block : int, optional
        Launch shape for the kernel engine (default: wide on a GPU, tiny on the simulator).

    Returns
    -------
    array
        A new array of the same kind, dtype and device, in layout ``dst``. For a file: a dict of the
        output shape per array name (``""`` for a ``.npy`` output).

    Raises
    ------
    ValueError
        Unknown layout or engine names, a shape that does not fit ``src`` (the message names the
        dimension), a missing ``page_size``, T not divisible by it, page_head without ``(H, D)``
        items, or items the kernels cannot move (not a multiple of 8 bytes).
    TypeError
        If ``array`` is not an array or a path, or ``out`` is missing for a path (given for an array).
    FileExistsError
        For a file: ``out`` exists and ``overwrite`` is not set.
    OSError, ModuleNotFoundError
        For a file: one that cannot be read or written; ``.safetensors`` without the ``safetensors``
        package (``pip install 'kvnumba[safetensors]'``).

    Example
    -------
    >>> k_pf = kvnumba.convert(k_lf, "layer_first", "page_first")          # doctest: +SKIP
    >>> k_ph = kvnumba.convert(k_lf, "lf", "page_head", page_size=64)      # doctest: +SKIP
    >>> kvnumba.convert("kv.safetensors", "lf", "pf", out="kv_pf.safetensors")  # doctest: +SKIP
    """
    if isinstance(array, (str, os.PathLike)):
        return _convert_file(array, out, src, dst, page_size, engine, block_quota, num_warps_per_block, overwrite)
    if out is not None or overwrite:
        raise TypeError(f"{'out=' if out is not None else 'overwrite='} is for an input given as a file path; "
                        f"got an array ({type(array).__name__}): use the returned array")
    src, dst = layout(src, "src"), layout(dst, "dst")
    if engine not in ("auto", "numpy", "kernels"):
        raise ValueError(f"engine must be one of 'auto', 'numpy', 'kernels', got {engine!r}")
    if page_size is not None:
        page_size = validate.integer("page_size", page_size, minimum=1)
    if isinstance(array, np.ndarray) and engine != "kernels":
        # Any NumPy array (Fortran order, strided slices): the NumPy engine only reads it through views, so
        # the C-contiguity array_info asks for, on the kernels' behalf, does not apply.
        return _numpy_convert(array, src, dst, page_size, converted_shape(array.shape, src, dst, page_size))
    info = array_info(array, "array")
    d = dims(src, info.shape, page_size)
    out_shape = converted_shape(info.shape, src, dst, page_size)
    if engine == "auto":
        engine = "kernels" if (info.on_device and not SIMULATOR) else "numpy"
    if engine == "numpy":
        if info.is_torch:
            if info.on_device and not SIMULATOR:
                raise ValueError("engine='numpy' needs host memory: got a CUDA torch tensor (use engine='kernels')")
            host, back = _torch_cpu_as_numpy(array)
            return back(_numpy_convert(host, src, dst, page_size, out_shape))
        if not isinstance(array, np.ndarray):
            raise ValueError(f"engine='numpy' needs a NumPy array or a CPU torch tensor, got {type(array).__name__} "
                             f"(use engine='kernels' for GPU memory)")
        return _numpy_convert(array, src, dst, page_size, out_shape)
    if not SIMULATOR:
        if not gpu_available():
            raise ValueError("engine='kernels' needs a CUDA GPU, or NUMBA_ENABLE_CUDASIM=1 for the simulator")
        if not info.on_device:
            raise ValueError("engine='kernels' needs an array in GPU memory, got host memory "
                             "(copy it to the device first, or use engine='numpy')")
    default_quota, default_warps = _default_launch()
    launch = validate.launch_config(default_quota if block_quota is None else block_quota,
                                    default_warps if num_warps_per_block is None else num_warps_per_block)
    return _kernel_convert(info, src, dst, page_size, d, out_shape, launch)


def _convert_file(path: str | os.PathLike[str], out: str | os.PathLike[str] | None, src: LayoutArg, dst: LayoutArg,
                  page_size: SupportsIndex | None, engine: str, block_quota: SupportsIndex | None,
                  num_warps_per_block: SupportsIndex | None, overwrite: bool) -> dict[str, tuple[int, ...]]:
    """A file: ``kvnumba convert``'s conversion (NumPy, chunked, all-or-nothing), without progress output."""
    if out is None:
        raise TypeError(f"converting the file {os.fspath(path)!r} needs out=, the output file's path")
    if engine not in ("auto", "numpy") or block_quota is not None or num_warps_per_block is not None:
        raise ValueError("files are converted with NumPy: engine='kernels', block_quota and num_warps_per_block "
                         "apply to arrays")
    from .convert_files import convert_file

    shapes: dict[str, tuple[int, ...]] = convert_file(path, out, src, dst, page_size, progress=None,
                                                      overwrite=overwrite)
    return shapes
