"""``kv.convert``: one K (or V, or MLA) tensor of a whole cache re-laid out, K and V to and from SGLang's
page-unified pool (``kvnumba.convert.unified``), or every array of a file (``kvnumba.convert.files``).
Layouts, shapes and both engines are described in docs/guides/convert.md.

- ``"numpy"``: one NumPy assignment between the two layouts' strided views of one index space
  ``(L, T // P, P, *item)`` (``kvnumba.convert.shapes``), with no intermediate copy;
- ``"kernels"``: one ``kv.copy`` between the two layouts' views, for arrays in GPU memory (on the
  simulator, tiny NumPy arrays: it runs one Python thread per CUDA thread).
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any, Literal, SupportsIndex, TypeAlias, TypeVar, Union, overload

import numpy as np

from ..checks import validate
from ..driver.target import SIMULATOR, gpu_available
from ..arrays import ArrayInfo, array_info
from ..layouts import CacheView, LayerFirst, PageUnified
from ..types import ArrayLike, SupportsCudaArrayInterface, TorchTensorLike
from . import unified
from .shapes import Dims, canonical_view, converted_shape, dims, layout, view_page_size

__all__ = ["LayoutArg", "LayoutName", "UnifiedArg", "convert", "converted_shape"]

_Array = TypeVar("_Array", bound=Union[np.ndarray, SupportsCudaArrayInterface, TorchTensorLike])
Engine: TypeAlias = Literal["auto", "numpy", "kernels"]
FileDtype: TypeAlias = Literal["bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4"]

LayoutName: TypeAlias = Literal["layer_first", "page_first", "page_first_direct", "page_head", "lf", "pf", "pfd", "ph"]
"""The names of kvnumba's views ``convert`` takes, as type checkers know them (a misspelt one is an error; they
cannot read the registry, and a test holds these to it). At run time every registered name converts."""
LayoutArg: TypeAlias = Union[LayoutName, "type[CacheView]"]
"""A layout as ``convert`` is typed to take it: a view class, or its string name. At run time names are read in
any case, and ``"module:Class"`` names a view class (the command line's form)."""
UnifiedArg: TypeAlias = Union[Literal["page_unified", "pu"], "type[PageUnified]"]
"""SGLang's page-unified pool as ``convert`` is typed to take it: ``kv.PageUnified`` or its name. It holds K and V
in one array: a pool converts into the pair ``(k, v)``, a pair into a pool (MLA: one tensor either way)."""


def _numpy_convert(array: np.ndarray, src: type[CacheView], dst: type[CacheView], page_size: int | None,
                   out_shape: tuple[int, ...]) -> np.ndarray:
    """The NumPy engine: one assignment between the two layouts' canonical views (no intermediate copy)."""
    p = view_page_size(src, dst, page_size)
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

    def copies(self, steps: list[tuple[CacheView, CacheView]], tokens: int, launch: tuple[int, int]) -> None:
        """``kv.copy`` of every token, one step after the other (indices on the input's device), then wait
        for the GPU."""
        from ..api.copy import copy

        indices: Any = np.arange(tokens, dtype=np.int64)
        if not SIMULATOR:
            from numba import cuda

            from ..driver.devices import on_device

            if self.kind == "torch":
                indices = sys.modules["torch"].from_numpy(indices).to(self.obj.device)
            elif self.kind == "cupy":
                with self.obj.device:
                    indices = sys.modules["cupy"].asarray(indices)
            else:
                with on_device(self.info.device):
                    indices = cuda.to_device(indices)
        for a, b in steps:
            copy(a, b, indices, indices, block_quota=launch[0], num_warps_per_block=launch[1])
        if not SIMULATOR:
            cuda.synchronize()


def _kernel_launch(on_device: bool, block_quota: SupportsIndex | None, num_warps_per_block: SupportsIndex | None,
                   arrays: str = "an array") -> tuple[int, int]:
    """The kernel engine's launch shape once the input is where the kernels read it: tiny on the simulator,
    wide on a GPU (a conversion is not a background copy)."""
    if not SIMULATOR:
        if not gpu_available():
            raise ValueError("engine='kernels' needs a CUDA GPU, or NUMBA_ENABLE_CUDASIM=1 for the simulator")
        if not on_device:
            raise ValueError(f"engine='kernels' needs {arrays} in GPU memory, got host memory (copy "
                             f"{'it' if arrays == 'an array' else 'them'} to the device first, or use engine='numpy')")
    quota, warps = (2, 1) if SIMULATOR else (1024, 8)
    return validate.launch_config(quota if block_quota is None else block_quota,
                                  warps if num_warps_per_block is None else num_warps_per_block)


def _kernel_convert(info: ArrayInfo, src: type[CacheView], dst: type[CacheView], d: Dims, out_shape: tuple[int, ...],
                    launch: tuple[int, int]) -> Any:
    count = math.prod(info.shape)
    itemsize = info.nbytes // count if count else 1
    item_bytes = math.prod(d.item) * itemsize
    split = [lay for lay in (src, dst) if lay.head_split]
    heads = d.item[0] if split and len(d.item) == 2 else 1
    if item_bytes % 8:
        raise ValueError(f"engine='kernels' moves 8-byte words: one token's item is {item_bytes} bytes "
                         f"(item shape {d.item} x {itemsize} B), not a multiple of 8; use engine='numpy'")
    if heads > 1 and item_bytes % (8 * heads):
        raise ValueError(f"engine='kernels' copies page_head items head by head: item_size / H = "
                         f"{item_bytes} / {heads} bytes is not a multiple of 8; use engine='numpy'")
    device = _Device(info)
    out = device.empty(out_shape)
    if count:
        device.copies([(src(info.obj), dst(out))], d.tokens, launch)
    return out


@overload
def convert(array: str | os.PathLike[str], src: LayoutArg | UnifiedArg, dst: LayoutArg | UnifiedArg,
            page_size: SupportsIndex | None = None, *, out: str | os.PathLike[str], overwrite: bool = False,
            engine: Literal["auto", "numpy"] = "auto", dtype: FileDtype | None = None,
            head_groups: SupportsIndex | None = None) -> dict[str, tuple[int, ...]]: ...
@overload
def convert(array: _Array, src: UnifiedArg, dst: UnifiedArg, page_size: SupportsIndex | None = None, *,
            out: None = None, engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None, head_groups: SupportsIndex | None = None) -> _Array: ...
@overload
def convert(array: _Array, src: UnifiedArg, dst: LayoutArg, page_size: SupportsIndex | None = None, *,  # type: ignore[overload-overlap]
            out: None = None, engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None) -> tuple[_Array, _Array] | _Array: ...
@overload
def convert(array: tuple[_Array, _Array], src: LayoutArg, dst: UnifiedArg, page_size: SupportsIndex | None = None,
            *, out: None = None, engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None, head_groups: SupportsIndex | None = None) -> _Array: ...
@overload
def convert(array: _Array, src: LayoutArg, dst: LayoutArg | UnifiedArg, page_size: SupportsIndex | None = None, *,
            out: None = None, engine: Engine = "auto", block_quota: SupportsIndex | None = None,
            num_warps_per_block: SupportsIndex | None = None) -> _Array: ...
def convert(array: ArrayLike | tuple[ArrayLike, ArrayLike] | str | os.PathLike[str], src: LayoutArg | UnifiedArg,
            dst: LayoutArg | UnifiedArg, page_size: SupportsIndex | None = None, *,
            out: str | os.PathLike[str] | None = None, overwrite: bool = False, engine: Engine = "auto",
            block_quota: SupportsIndex | None = None, num_warps_per_block: SupportsIndex | None = None,
            dtype: FileDtype | None = None, head_groups: SupportsIndex | None = None) -> Any:
    """Return ``array``, one K (or V, or MLA) tensor of a whole cache, re-laid out from ``src`` to ``dst``;
    or, given a file's path, convert every array in the file into the file ``out``. SGLang's page-unified
    pool holds K and V in one array: from it a pool gives the pair ``(k, v)``, to it a pair ``(k, v)`` gives
    one pool (MLA: one tensor either way). Layouts, shapes and files: docs/guides/convert.md.

    Parameters
    ----------
    array : array, pair of arrays, str or os.PathLike
        A NumPy array (any memory order), a CPU torch tensor, or a GPU array (torch, CuPy, Numba;
        C-contiguous), shaped as ``src``'s ``buffer_shape`` says, e.g. ``"layer_first"``: ``(L, T, *item)``,
        item ``(H, D)`` (MHA) or ``(1, D)``/``(D,)`` (MLA). For ``dst="page_unified"``, K and V as a pair
        ``(k, v)`` (one shape, dtype and memory), or one MLA tensor. Or the path of a ``.npy``, ``.npz`` or
        ``.safetensors`` file, every array of which is converted (with NumPy, in chunks) into ``out``.
    src, dst : CacheView subclass or str
        A view class that holds a whole cache in one array (``kv.LayerFirst``, ..., ``kv.PageUnified``, or a
        ``kv.CacheView`` subclass of your own with ``buffer_shape``), its name or short name
        (``kvnumba.layouts.NAMES``), or ``"module:Class"`` naming one.
    page_size : int, optional
        Tokens per page; required when either layout is paged, unused (but checked) otherwise.
    out : str or os.PathLike, optional
        For a file: the output, in the format its suffix names, never the input; it appears complete or
        not at all.
    overwrite : bool
        For a file: replace an existing ``out`` (default False: ``FileExistsError``).
    engine : {"auto", "numpy", "kernels"}
        ``"auto"``: kvnumba's kernels for GPU memory on a real GPU, NumPy otherwise.
    block_quota, num_warps_per_block : int, optional
        Launch shape for the kernel engine (default: wide on a GPU, tiny on the simulator).
    head_groups : int, optional
        For ``dst="page_unified"``: the pool's head groups ``G`` (default 1), dividing the heads ``H``; for a
        file, those of every pool written (K and V are paired by name: ``k``, ``v`` and the pool ``kv``).
    dtype : {"fp8_e4m3", "fp8_e5m2", "bfloat16", "float16", "nvfp4"}, optional
        For a file: quantise its bfloat16/float16 tensors into FP8 codes with float32 scales, dequantise a
        quantised file, or write its ``k`` and ``v`` as vLLM's NVFP4 pages (docs/guides/fp8.md). Arrays are
        quantised with ``kv.copy`` into ``kv.fp8_like(view)``.

    Returns
    -------
    array, tuple or dict
        A new array of the same kind, dtype and device, in layout ``dst``; from an MHA pool, the tuple
        ``(k, v)``. For a file: the output shape per array name (``""`` for a ``.npy`` output).

    Raises
    ------
    ValueError
        An unknown layout or engine, a shape that does not fit ``src`` (naming the dimension), a missing
        ``page_size`` or one that does not divide T, items the kernels cannot move (not a multiple of 8
        bytes); for a pool, K and V of different shapes, or ``head_groups`` that does not divide H.
    TypeError
        ``array`` is not an array, a pair of arrays or a path; ``out`` missing for a path (or given for an
        array); K and V of different dtypes.
    FileExistsError, OSError, ModuleNotFoundError
        For a file: ``out`` exists without ``overwrite``; a file cannot be read or written; a
        ``.safetensors`` file without the ``safetensors`` package.

    Examples
    --------
    >>> k_pf = kvnumba.convert(k_lf, "layer_first", "page_first")          # doctest: +SKIP
    >>> k_ph = kvnumba.convert(k_lf, "lf", "page_head", page_size=64)      # doctest: +SKIP
    >>> pool = kvnumba.convert((k_lf, v_lf), "lf", "page_unified", page_size=64, head_groups=2)  # doctest: +SKIP
    >>> k_pf, v_pf = kvnumba.convert(pool, "pu", "pf", page_size=64)        # doctest: +SKIP
    >>> kvnumba.convert("kv.safetensors", "lf", "pf", out="kv_pf.safetensors")  # doctest: +SKIP
    >>> kvnumba.convert("kv.safetensors", "lf", "lf", out="kv_fp8.safetensors", dtype="fp8_e4m3")  # doctest: +SKIP
    """
    if isinstance(array, (str, os.PathLike)):
        return _convert_file(array, out, src, dst, page_size, engine, block_quota, num_warps_per_block, overwrite,
                             dtype, head_groups)
    if out is not None or overwrite or dtype is not None:
        given = "out=" if out is not None else "overwrite=" if overwrite else "dtype="
        raise TypeError(f"{given} is for an input given as a file path; got an array ({type(array).__name__})"
                        + (": quantise arrays with kv.copy into kv.fp8_like(view), or kvnumba.reference.quantise"
                           if given == "dtype=" else ": use the returned array"))
    src, dst = layout(src, "src", unified=True), layout(dst, "dst", unified=True)
    if engine not in ("auto", "numpy", "kernels"):
        raise ValueError(f"engine must be one of 'auto', 'numpy', 'kernels', got {engine!r}")
    if page_size is not None:
        page_size = validate.integer("page_size", page_size, minimum=1)
    if src.kv_pool or dst.kv_pool:
        return _convert_pool(array, src, dst, page_size, head_groups, engine, block_quota, num_warps_per_block)
    if head_groups is not None:
        raise ValueError("head_groups applies to dst='page_unified' (a pool's head groups); leave it out")
    if isinstance(array, np.ndarray) and engine != "kernels":
        # Any NumPy array (Fortran order, strided slices): the NumPy engine only reads it through views, so
        # the C-contiguity array_info asks for, on the kernels' behalf, does not apply.
        return _numpy_convert(array, src, dst, page_size, converted_shape(array.shape, src, dst, page_size))
    info = array_info(array, "array")
    out_shape = converted_shape(info.shape, src, dst, page_size)
    if engine == "auto":
        engine = "kernels" if (info.on_device and not SIMULATOR) else "numpy"
    if engine == "numpy":
        host, back = _host(array, "array")
        return back(_numpy_convert(host, src, dst, page_size, out_shape))
    launch = _kernel_launch(info.on_device, block_quota, num_warps_per_block)
    return _kernel_convert(info, src, dst, dims(src, info.shape, page_size), out_shape, launch)


def _host(array: Any, argument: str) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """``array`` where the NumPy engine reads it (a NumPy array, a CPU torch tensor), and the way back."""
    if isinstance(array, np.ndarray):
        return array, lambda a: a
    info = array_info(array, argument)
    if info.is_torch:
        if info.on_device and not SIMULATOR:
            raise ValueError("engine='numpy' needs host memory: got a CUDA torch tensor (use engine='kernels')")
        return _torch_cpu_as_numpy(array)
    raise ValueError(f"engine='numpy' needs a NumPy array or a CPU torch tensor, got {type(array).__name__} "
                     f"(use engine='kernels' for GPU memory)")


def _convert_pool(array: Any, src: type[CacheView], dst: type[CacheView], page_size: int | None,
                  head_groups: SupportsIndex | None, engine: str, block_quota: SupportsIndex | None,
                  num_warps_per_block: SupportsIndex | None) -> Any:
    """A conversion from or to a page-unified pool (``kvnumba.convert.unified``): one pool in, K and V out
    (a tuple; MLA: one tensor), or K and V in (a pair), one pool out."""
    pair = list(array) if isinstance(array, (tuple, list)) and len(array) == 2 else None  # K and V
    if pair is None and isinstance(array, (tuple, list)):
        raise ValueError(f"array: a {type(array).__name__} of {len(array)} arrays; dst='page_unified' takes K and "
                         "V as a pair (k, v), or one MLA tensor")
    arrays = [array] if pair is None else pair
    names = ["array"] if pair is None else ["array[0] (k)", "array[1] (v)"]
    infos = None if engine != "kernels" and all(isinstance(a, np.ndarray) for a in arrays) \
        else [array_info(a, n) for a, n in zip(arrays, names)]
    dtypes = [np.dtype(a.dtype) for a in arrays] if infos is None else [i.dtype for i in infos]
    if dtypes[0] != dtypes[-1]:
        raise TypeError(f"array: K and V must have one dtype, got {dtypes[0]} and {dtypes[1]}")
    shapes = [a.shape for a in arrays] if infos is None else [i.shape for i in infos]
    plan = unified.planned(shapes, src, dst, page_size, head_groups)
    assert page_size is not None  # planned() requires it
    if engine == "auto":
        engine = "kernels" if infos is not None and infos[0].on_device and not SIMULATOR else "numpy"
    if engine == "numpy":
        hosts = [_host(a, n) for a, n in zip(arrays, names)]
        outs = [np.empty(shape, dtype=hosts[0][0].dtype) for shape in plan.shapes]
        for source, destination in zip(*unified.pictures([h for h, _ in hosts], outs, src, dst, page_size)):
            unified.put(source, destination)
        outs = [hosts[0][1](o) for o in outs]
    else:
        assert infos is not None
        if len(infos) == 2 and (infos[0].on_device, infos[0].device) != (infos[1].on_device, infos[1].device):
            raise ValueError("array: K and V must be in the same memory (one device, or both on the host)")
        launch = _kernel_launch(infos[0].on_device, block_quota, num_warps_per_block, "arrays")
        outs = _kernel_convert_pool(infos, src, dst, plan, launch)
    return tuple(outs) if len(outs) == 2 else outs[0]


def _kernel_convert_pool(infos: list[ArrayInfo], src: type[CacheView], dst: type[CacheView],
                         plan: unified.Planned, launch: tuple[int, int]) -> list[Any]:
    """The kernel engine for a pool: one ``kv.copy`` between the two sides' views (K and V together), or two
    through a layer-first pair where the sides cut a token's heads into runs no copy shares."""
    device = _Device(infos[0])
    outs = [device.empty(shape) for shape in plan.shapes]
    if any(math.prod(i.shape) == 0 for i in infos):
        return outs

    def view(lay: type[CacheView], arrays: list[Any]) -> CacheView:
        return lay(arrays[0]) if lay.kv_pool else lay(*arrays)

    source, destination = view(src, [i.obj for i in infos]), view(dst, outs)
    g = source.geometry
    runs = sorted({source.head_runs, destination.head_runs})
    for count in runs:
        if g.item_bytes % (8 * count):
            raise ValueError(f"engine='kernels' moves 8-byte words: one token's item is {g.item_bytes} bytes, "
                             f"cut into {count} runs of heads, not a multiple of 8 bytes each; use engine='numpy'")
    steps = [(source, destination)]
    if len(runs) == 2 and runs[0] != 1:  # e.g. page_head (H runs) and a pool of 1 < G < H groups
        item = tuple(source.item_shape())
        middle = LayerFirst(*[device.empty((g.layers, g.tokens, *item)) for _ in range(1 if plan.mla else 2)])
        steps = [(source, middle), (middle, destination)]
    device.copies(steps, g.tokens, launch)
    return outs


def _convert_file(path: str | os.PathLike[str], out: str | os.PathLike[str] | None, src: LayoutArg | UnifiedArg,
                  dst: LayoutArg | UnifiedArg, page_size: SupportsIndex | None, engine: str,
                  block_quota: SupportsIndex | None, num_warps_per_block: SupportsIndex | None, overwrite: bool,
                  dtype: str | None = None, head_groups: SupportsIndex | None = None) -> dict[str, tuple[int, ...]]:
    """A file: ``kvnumba convert``'s conversion (NumPy, chunked, all-or-nothing), without progress output."""
    if out is None:
        raise TypeError(f"converting the file {os.fspath(path)!r} needs out=, the output file's path")
    if engine not in ("auto", "numpy") or block_quota is not None or num_warps_per_block is not None:
        raise ValueError("files are converted with NumPy: engine='kernels', block_quota and num_warps_per_block "
                         "apply to arrays")
    from .files import convert_file

    shapes: dict[str, tuple[int, ...]] = convert_file(path, out, src, dst, page_size, progress=None,
                                                      overwrite=overwrite, dtype=dtype, head_groups=head_groups)
    return shapes
