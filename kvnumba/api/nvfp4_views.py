"""``kv.Nvfp4View``: vLLM's NVFP4 KV cache (``kv_cache_dtype="nvfp4"``), one uint8 tensor a layer, as a side of
``kv.copy``: bfloat16/float16 tokens of any view quantised into its pages, its pages dequantised into any view,
and pages copied to another NVFP4 cache (NHD or HND). The format, page by page: ``kvnumba.quant.nvfp4``; the
plan: ``kvnumba.plan.nvfp4_plan``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..arrays import array_info, flagged, shape_of
from ..quant.fp8 import plain_dtype
from ..quant.nvfp4 import GROUP, LAYOUTS, NVFP4, full_dim, head_dim_of, regions

__all__ = ["Nvfp4View"]


class Nvfp4Geometry(NamedTuple):
    layers: int
    tokens: int
    page_size: int
    heads: int
    head_dim: int


def _strides(cache: Any) -> tuple[int, ...] | None:
    """Element strides of an array (torch, NumPy, ``__cuda_array_interface__``); None: C-contiguous."""
    if isinstance(cache, np.ndarray):
        return tuple(s // cache.itemsize for s in cache.strides)
    stride = getattr(cache, "stride", None)
    if callable(stride):
        return tuple(stride())
    cai = getattr(cache, "__cuda_array_interface__", None)
    return None if cai is None or cai.get("strides") is None else tuple(s // np.dtype(cai["typestr"]).itemsize
                                                                         for s in cai["strides"])


def _scale(value: Any, name: str) -> np.float32:
    """A per-tensor scale: a number or a one-element array (read once, here)."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.size != 1:
            raise TypeError(f"Nvfp4View: {name} must be a float or a one-element array, got {value.size} elements")
        value = value.reshape(-1)[0]
    try:
        scale = np.float32(float(value))
    except (TypeError, ValueError):
        raise TypeError(f"Nvfp4View: {name} must be a float or a one-element array, got {type(value).__name__}") \
            from None
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"Nvfp4View: {name} must be a finite float32 above 0, got {value!r}")
    return scale


class Nvfp4View:
    """A vLLM NVFP4 KV cache: one uint8 tensor a layer, ``(blocks, 2, block_size, heads, D/2 + D/16)``.

    Parameters
    ----------
    caches : sequence of arrays
        Every layer's tensor (torch, CuPy, Numba or NumPy; on the GPU or pinned host memory), all of one shape,
        in NHD (``strides`` C-contiguous) or HND order (the heads' stride larger than the tokens': vLLM's
        permuted allocation); pages packed (a page every ``2 * block_size * heads * (D/2 + D/16)`` bytes).
    k_scale, v_scale : float or one-element array
        The per-tensor global scales (the checkpoint's ``k_scale``/``v_scale``; read once, here).
    layout : {"NHD", "HND"}, optional
        The order, where the strides cannot say it (one head or one-token blocks); checked against them.
    dtype : {"bfloat16", "float16"}, optional
        The plain views' element type, for plain views over uint16 bit patterns.
    v_scales_swizzled : bool
        True for caches written on SM100, whose V scales vLLM swizzles in groups of 4 tokens: refused.

    Raises
    ------
    TypeError, ValueError
        Naming the argument: not arrays, not uint8, shapes that differ or are not an NVFP4 cache's (``D`` a
        multiple of 64), strides of neither order, a layout the strides contradict, scales not finite and
        positive, swizzled V scales, pages whose K/V halves are not 8-byte aligned.

    Examples
    --------
    >>> cache = kv.Nvfp4View(vllm_caches, k_scale, v_scale)  # doctest: +SKIP
    >>> kv.copy(kv.PageFirst(host_k, host_v), cache, idx, idx)  # doctest: +SKIP
    """

    codec = NVFP4  # what plan.build reads (the plan wing does not import the view classes)
    mla = False
    user_layout = False

    def __init__(self, caches: Sequence[Any], k_scale: Any = 1.0, v_scale: Any = 1.0, *, layout: str | None = None,
                 dtype: str | None = None, v_scales_swizzled: bool = False) -> None:
        if v_scales_swizzled:
            raise ValueError("Nvfp4View: v_scales_swizzled=True (SM100's 4-token swizzle of V scales) is not supported: "
                             "kvnumba reads and writes linear V scales, as vLLM does on SM12x")
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(f"Nvfp4View: layout must be 'NHD' or 'HND', got {layout!r}")
        if not isinstance(caches, (list, tuple)) or not caches:
            raise TypeError(f"Nvfp4View: caches must be a non-empty list of per-layer arrays, got "
                            f"{type(caches).__name__}")
        shape: tuple[int, ...] = ()
        raw, orders = [], set()
        for i, cache in enumerate(caches):
            label = f"caches[{i}]"
            got, itemsize, dtype_name = shape_of(cache, label)
            if dtype_name != "uint8":
                raise TypeError(f"Nvfp4View: {label} must be uint8, got {dtype_name}")
            if len(got) != 5 or got[1] != 2:
                raise ValueError(f"Nvfp4View: {label} must be (blocks, 2, block_size, heads, D/2 + D/16), got {got}")
            if shape and got != shape:
                raise ValueError(f"Nvfp4View: {label} has the shape {got}, caches[0] {shape}")
            shape = got
            blocks, _, block, heads, full = got
            head_dim = head_dim_of(full) if full % 9 == 0 else 0
            if head_dim % 64:
                raise ValueError(f"Nvfp4View: {label}'s last axis must be D/2 + D/16 for D a multiple of 64 (72 for "
                                 f"D = 128), got {full}")
            if (block * heads * head_dim // GROUP) % 8:
                raise ValueError(f"Nvfp4View: {label}'s K/V halves must start on 8 bytes (block_size * heads * D/16 "
                                 f"a multiple of 8), got block_size={block}, heads={heads}, D={head_dim}")
            side = block * heads * full
            nhd, hnd = (2 * side, side, heads * full, full, 1), (2 * side, side, full, block * full, 1)
            strides = _strides(cache)
            if strides is None or strides == nhd:
                found = {"NHD"} | ({"HND"} if nhd == hnd else set())
                raw.append(cache)
            elif strides == hnd and hasattr(cache, "swapaxes"):  # torch, CuPy, NumPy: its pages as allocated
                found = {"HND"}
                raw.append(cache.swapaxes(2, 3))
            else:
                raise ValueError(f"Nvfp4View: {label}'s strides {strides} are neither NHD's {nhd} nor HND's {hnd}")
            orders.add(frozenset(found))
        order = frozenset.intersection(*orders)
        if layout is not None and layout not in order:
            raise ValueError(f"Nvfp4View: layout={layout!r} but the strides of caches say {'/'.join(sorted(order))}")
        self.layout = layout or ("NHD" if "NHD" in order else "HND")
        blocks, _, block, heads, full = shape
        self.caches, self.raw = tuple(caches), tuple(raw)
        self.k_scale, self.v_scale = _scale(k_scale, "k_scale"), _scale(v_scale, "v_scale")
        self.dtype = None if dtype is None else plain_dtype(dtype)
        self.heads, self.head_dim, self.page_size = heads, head_dim_of(full), block
        self.page_bytes = 2 * block * heads * full
        self.geometry = Nvfp4Geometry(len(caches), blocks * block, block, heads, self.head_dim)
        self.flagged: tuple[Any, ...] = flagged(self.raw)
        self._addresses = [array_info(c, f"caches[{i}]").ptr for i, c in enumerate(self.raw)]

    def layer_regions(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """NumPy views of layer ``layer``'s pages (NumPy caches): data ``[blocks, 2, block_size, heads, D/2]`` and
        scales ``[blocks, 2, block_size, heads, D/16]`` (``kvnumba.quant.nvfp4.regions``)."""
        cache = np.asarray(self.raw[layer])
        if self.layout == "HND":
            cache = np.swapaxes(cache, 2, 3)
        return regions(cache, self.heads, self.page_size, self.head_dim, self.layout)

    def check_unchanged(self, name: str | None = None, layers: Any = None) -> None:
        """Each layer's array still at the address it had when the view was made."""
        for i, cache in enumerate(self.raw):
            if array_info(cache, f"caches[{i}]").ptr != self._addresses[i]:
                raise ValueError(f"{name or 'Nvfp4View'}: caches[{i}] was given new memory since the view was made; "
                                 "make the view again")

    def __repr__(self) -> str:
        g = self.geometry
        return (f"Nvfp4View({self.layout}, L={g.layers}, T={g.tokens}, P={g.page_size}, H={g.heads}, D={g.head_dim}, "
                f"full_dim={full_dim(g.head_dim)})")
