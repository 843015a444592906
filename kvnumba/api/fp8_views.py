"""``kv.Fp8View``: a KV cache held in FP8 (codes and scales views of one built-in layout; its class docstring), and
``kv.fp8_like``, which allocates one shaped like a view.

The byte-for-byte format is ``kvnumba.quant.fp8``'s. ``kv.copy(plain_view, fp8_view, ...)`` quantises
bfloat16/float16 tokens into it, ``kv.copy(fp8_view, plain_view, ...)`` dequantises them, ``kv.copy(fp8_view,
fp8_view, ...)`` copies codes and scales (their plan: ``kvnumba.plan.fp8_plan``). A plain view's element type is
its buffers' dtype; buffers of uint16 (or int16) bit patterns take it from the FP8 view's ``dtype=``.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..arrays import array_info, device_array, pinned
from ..quant.fp8 import Fp8Codec, fp8_format, plain_dtype
from ..layouts import CacheView

__all__ = ["Fp8View", "fp8_like"]


class Fp8View:
    """A KV cache in FP8: ``codes`` and ``scales`` views of one layout (see the module docstring).

    Parameters
    ----------
    codes : CacheView
        uint8 buffers, items ``(H, D)`` (MLA ``(D,)``), ``D`` a multiple of 4.
    scales : CacheView
        The same class, layers, tokens, page size and heads: float32 buffers, items ``(H, 1)`` (MLA ``(1,)``).
    fmt : {"e4m3", "e5m2"}
        The codes' format: e4m3fn (largest 448) or e5m2 (largest 57344).
    dtype : {"bfloat16", "float16"}, optional
        The element type of the plain views it is copied from and to, for plain views over uint16 bit
        patterns (a plain view of bfloat16 or float16 buffers says its own; the two must then agree).

    Raises
    ------
    TypeError, ValueError
        Naming the argument: not views, views of different classes or geometry, codes not uint8 (int8
        too is refused), scales not float32 ``(H, 1)``, scales that share bytes with codes, ``D`` not a
        multiple of 4, an unknown ``fmt`` or ``dtype``.
    """

    fp8 = True  # what plan.fp8_plan.is_fp8 reads (the plan wing does not import the view classes)

    def __init__(self, codes: CacheView, scales: CacheView, fmt: str = "e4m3", *, dtype: str | None = None) -> None:
        for name, view in (("codes", codes), ("scales", scales)):
            if not isinstance(view, CacheView):
                raise TypeError(f"Fp8View: {name} must be a kvnumba cache view (kv.PageFirst, kv.LayerFirst, ...), "
                                f"got {type(view).__name__}")
            if view.raw_tables:
                raise TypeError(f"Fp8View: {name} is a LayerTable (raw addresses, no dtype): make it a LayerFirst of "
                                "the layers' arrays")
            if not view.built_in:
                raise TypeError(f"Fp8View: {name} must be one of kvnumba's built-in views, got {type(view).__name__}")
        if type(codes) is not type(scales):
            raise TypeError(f"Fp8View: codes is a {type(codes).__name__} but scales a {type(scales).__name__}: both "
                            "must be views of one layout")
        codes_layout, scales_layout = getattr(codes, "layout", None), getattr(scales, "layout", None)
        if codes_layout != scales_layout:  # VllmFlashInfer's NHD / HND
            raise ValueError(f"Fp8View: codes has the layout {codes_layout!r}, scales {scales_layout!r}")
        fmt = fp8_format(fmt).name
        self.dtype = None if dtype is None else plain_dtype(dtype)
        gc, gs = codes.geometry, scales.geometry
        if codes.itemsize != 1 or gc.dtype != "uint8":
            raise TypeError(f"Fp8View: codes must hold uint8 FP8 bit patterns, got {gc.dtype}")
        if scales.itemsize != 4 or gs.dtype != "float32":
            raise TypeError(f"Fp8View: scales must be float32, got {gs.dtype}")
        if codes.mla != scales.mla:
            raise ValueError(f"Fp8View: codes is {'MLA (no V)' if codes.mla else 'K and V'}, scales "
                             f"{'MLA (no V)' if scales.mla else 'K and V'}")
        for attribute in ("layers", "tokens", "page_size", "heads"):
            if getattr(gc, attribute) != getattr(gs, attribute):
                raise ValueError(f"Fp8View: codes and scales differ in {attribute}: {getattr(gc, attribute)} and "
                                 f"{getattr(gs, attribute)}")
        if gs.item_bytes != 4 * gs.heads:
            raise ValueError(f"Fp8View: scales must hold one float32 per head (items (H, 1)), got items of "
                             f"{gs.item_bytes} bytes for {gs.heads} heads")
        head_dim = gc.item_bytes // gc.heads
        if head_dim == 0 or head_dim % 4:
            raise ValueError(f"Fp8View: codes' heads must hold a multiple of 4 elements, got {head_dim}")
        _apart(codes, scales)
        self.codes, self.scales, self.fmt = codes, scales, fmt
        # NumPy arrays whose writable flag a cached or prepared plan reads again (as CacheView.flagged)
        self.flagged: tuple[Any, ...] = codes.flagged + scales.flagged
        self.geometry = gc
        self.heads, self.head_dim = gc.heads, head_dim

    @property
    def codec(self) -> Fp8Codec:
        """Its codec (``kvnumba.quant.fp8``: ``E4M3`` or ``E5M2``), which ``plan.build`` finds its plan by."""
        return fp8_format(self.fmt)

    @property
    def mla(self) -> bool:
        return self.codes.mla

    def check_unchanged(self, name: str | None = None, layers: Any = None) -> None:
        """``CacheView.check_unchanged`` of the codes and the scales."""
        name = name or "Fp8View"
        self.codes.check_unchanged(f"{name}.codes", layers)
        self.scales.check_unchanged(f"{name}.scales", layers)

    def __repr__(self) -> str:
        g = self.geometry
        return (f"Fp8View({type(self.codes).__name__}, fmt={self.fmt!r}, L={g.layers}, T={g.tokens}, P={g.page_size}, "
                f"H={g.heads}, D={self.head_dim}{', MLA' if self.mla else ''})")


def _ranges(view: CacheView, name: str) -> list[tuple[str, int, int]]:
    """``(name, first byte, end)`` of each of ``view``'s buffers (K and V, every layer's)."""
    out = []
    for which in ("k", "v"):
        if getattr(view, which) is None:
            continue
        for i, buffer in enumerate(view.buffers(which)):
            label = f"{name}.{which}[{i}]" if view.per_layer else f"{name}.{which}"
            info = array_info(buffer, label)
            out.append((label, info.ptr, info.ptr + info.nbytes))
    return out


def _apart(codes: CacheView, scales: CacheView) -> None:
    """Scales that share bytes with codes would be overwritten by them (and overwrite them) in a copy."""
    for name, start, end in _ranges(scales, "scales"):
        for other, low, high in _ranges(codes, "codes"):
            if start < high and low < end:
                raise ValueError(f"Fp8View: {name} overlaps {other} (bytes 0x{max(start, low):x} to "
                                 f"0x{min(end, high):x}): scales and codes must be separate buffers")


# --- allocation ---------------------------------------------------------------------------------

def _zeros_like(buffer: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """Zeros of ``shape`` and ``dtype`` where ``buffer`` lives, by its array library: torch (same device,
    pinned if it is), CuPy, Numba device arrays, NumPy (pinned on a GPU: ``kvnumba.arrays.pinned``)."""
    module = type(buffer).__module__
    if module.startswith("torch"):
        torch = sys.modules["torch"]
        kind = getattr(torch, dtype)
        pin = buffer.device.type == "cpu" and buffer.is_pinned()
        return torch.zeros(shape, dtype=kind, device=buffer.device, pin_memory=pin)
    if module.startswith("cupy"):
        cupy = sys.modules["cupy"]
        with buffer.device:
            return cupy.zeros(shape, dtype=dtype)
    if isinstance(buffer, np.ndarray):
        return pinned(np.zeros(shape, dtype))
    return device_array(np.zeros(shape, dtype))


def fp8_like(view: CacheView, fmt: str = "e4m3", dtype: str | None = None) -> Fp8View:
    """A zeroed ``Fp8View`` with ``view``'s class, options and geometry (codes shaped as ``view``'s buffers,
    uint8; scales with their last axis 1, float32), in the same kind of memory (``_zeros_like``).
    ``dtype``: for a plain view of uint16 bit patterns, the floats they are (else ``view``'s own)."""
    if not isinstance(view, CacheView) or view.raw_tables:
        raise TypeError(f"fp8_like: view must be a kvnumba cache view other than LayerTable, got {type(view).__name__}")
    if not view.built_in:
        raise TypeError(f"fp8_like: view must be one of kvnumba's built-in views, got {type(view).__name__}")
    if dtype is None and view.geometry.dtype in ("bfloat16", "float16"):
        dtype = view.geometry.dtype
    fmt = fp8_format(fmt).name

    def twin(buffer: Any, kind: str) -> Any:
        shape = tuple(CacheView.array(buffer)[0])
        if kind == "float32":
            shape = shape[:-1] + (1,)
        return _zeros_like(buffer, shape, kind)

    made = []
    for kind in ("uint8", "float32"):
        if hasattr(view, "caches"):  # vLLM / FlashInfer: per-layer arrays holding K and V
            made.append(view.like([twin(c, kind) for c in view.caches]))
            continue
        parts: list[Any] = []
        for which in ("k", "v"):
            buffer = getattr(view, which)
            if buffer is None or (which == "v" and buffer is view.k):  # MLA; or V in K's array (page-unified)
                parts.append(None)
            elif view.per_layer:
                parts.append([twin(b, kind) for b in buffer])
            else:
                parts.append(twin(buffer, kind))
        made.append(view.like(*parts))
    return Fp8View(made[0], made[1], fmt, dtype=dtype)
