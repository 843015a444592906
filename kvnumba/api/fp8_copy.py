"""``kv.copy`` where a side is a ``kv.Fp8View``: quantise into FP8, dequantise out of it, or copy FP8 caches,
in one kernel launch (``kvnumba.kernels.fp8_copy``; the format: ``kvnumba.quant_reference``).

``kv.copy`` hands such calls here. A plan per (source view, destination view, layers) is built once and
memoised (the views held weakly): the views checked against each other, every buffer described, aligned
(plain 8 bytes, codes and scales 4), reachable by the GPU (pinned host memory), on one device, the
destinations writable and clear of the layer tables the kernel reads; per-layer views get device tables
of their layers' addresses. A call then checks its indices (host indices against both sides' tokens,
before anything is written; device indices by the kernel's guard and error flag, as for every entry
point), writes them into its parameter block and launches (``kvnumba.driver.launch``).
"""
from __future__ import annotations

import struct
import weakref
from typing import Any, SupportsIndex

import numpy as np

from .. import config
from ..arrays import HOST, WRITEABLE, array_info
from ..checks import bounds, guard, pinned, validate
from ..checks.devices import one_device
from ..checks.overlap import check_disjoint
from ..driver import capture
from ..driver.devices import on_device
from ..driver.launch import BoundKernel, launch_shape, launchable
from ..driver.streams import stream_handle
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError, IndexOutOfRangeError
from ..kernels import fp8_copy as kernels
from ..plan import fp8_staged_plan, routes
from ..checks.user_layouts import check_user_layout
from ..plan.device_tables import device_table
from .fp8_views import Fp8View, plain_dtype_of, plan_window
from .views import CacheView, LayerTable

__all__ = ["Fp8Plan", "copy", "plan_for"]

_pack_call = struct.Struct(f"{kernels.PER_CALL}q").pack_into


def copy(src_view: Any, dst_view: Any, src_indices: Any, dst_indices: Any,
         layers: SupportsIndex | range | None = None, *, block_quota: SupportsIndex = 2,
         num_warps_per_block: SupportsIndex = 32, route: str = "auto", stream: Any = None, check: bool = False) -> None:
    """``kv.copy`` with an ``Fp8View`` on one side or both (arguments as ``kv.copy``'s). ``route``: ``"auto"``
    or ``"kernel"`` (there is no copy-engine form: the bytes change on the way)."""
    _call_checks(route)
    _mode(src_view, dst_view)  # both views (one FP8), before anything is read of them
    src_view.check_unchanged("src_view", layers)
    dst_view.check_unchanged("dst_view", layers)
    plan_for(src_view, dst_view, layers).run(src_indices, dst_indices, block_quota, num_warps_per_block, stream,
                                             check or guard.ALWAYS_CHECK)


def _call_checks(route: Any) -> None:
    """What every call checks first: the route (the kernel's only), then a pending kernel error."""
    if routes.check_route(route) == "copy_engine":
        raise ValueError("route='copy_engine' cannot quantise or dequantise (nor copy FP8 views, whose scales are "
                         "4-byte items); use route='kernel'")
    if guard.flag_set():
        guard.raise_pending()


def involves_fp8(src_view: Any, dst_view: Any) -> bool:
    """Whether a ``kv.copy`` between these is an FP8 one (a ``kv.Fp8View`` on either side)."""
    return isinstance(src_view, Fp8View) or isinstance(dst_view, Fp8View)


_plans: dict[tuple, tuple] = {}


def plan_for(src_view: Any, dst_view: Any, layers: Any = None) -> Fp8Plan:
    """The memoised plan of ``kv.copy(src_view, dst_view, ..., layers)`` (found by the views' identity, and
    whether the destination's NumPy arrays are all writable: one made read-only since is checked again)."""
    try:
        key = (id(src_view), id(dst_view), layers, all(map(WRITEABLE, getattr(dst_view, "flagged", ()))))
        hash(key)
    except TypeError:
        key = None
    if key is not None:
        found = _plans.get(key)
        if found is not None and found[0]() is src_view and found[1]() is dst_view:
            return found[2]
    plan = Fp8Plan(src_view, dst_view, layers)
    if key is not None:
        if len(_plans) > 1024:
            _plans.clear()
        _plans[key] = (weakref.ref(src_view), weakref.ref(dst_view), plan)
    return plan


def clear() -> None:
    """Forget the memoised plans."""
    _plans.clear()


class _Side:
    """One side's kernel parameters: addresses (or tables), item bytes, layout_dim, page size."""

    def __init__(self, name: str, view: Any, destination: bool, placed: list, destinations: list, guides: list,
                 kept: list) -> None:
        self.parts = view.codes.parts if isinstance(view, Fp8View) else view.parts
        self.tokens = view.geometry.tokens
        self.label = f"{name} ({view!r})"
        if isinstance(view, Fp8View):
            self.k, self.v, self.item, self.dim = _resolve(f"{name}.codes", view.codes, 4, destination, placed,
                                                           destinations, guides, kept)
            self.scales = _resolve(f"{name}.scales", view.scales, 4, destination, placed, destinations, guides, kept)
        else:
            self.k, self.v, self.item, self.dim = _resolve(name, view, 8, destination, placed, destinations, guides,
                                                           kept)
            self.scales = (0, 0, 0, 0)
        self.page = view.geometry.page_size


def _resolve(name: str, view: CacheView, align: int, destination: bool, placed: list, destinations: list,
             guides: list, kept: list) -> tuple[int, int, int, int]:
    """``(k, v, item bytes, layout_dim)`` of one view for the kernel: buffer addresses, or for a per-layer
    view device tables of its layers' addresses (kept alive in ``kept``)."""
    ptrs = []
    for which in ("k",) if view.mla else ("k", "v"):
        infos = [array_info(b, f"{name}.{which}") for b in view.buffers(which)]
        for i, info in enumerate(infos):
            label = f"{name}.{which}" + (f"[{i}]" if view.per_layer else "")
            if info.ptr % align:
                raise ValueError(f"{label} must be {align}-byte aligned, its address is {info.ptr:#x}")
            pinned.require(label, info)
            placed.append((label, info.device))
            if destination:
                validate.writable(label, info)
                destinations.append((label, info.ptr, info.ptr + info.nbytes))
        if view.per_layer:
            addresses = [i.ptr + view.kind_offset(which) for i in infos]
            table = device_table(np.array(addresses, dtype=np.uint64), infos)
            kept.append(table)
            info = array_info(table, f"{name}.{which} table")
            guides.append((f"{name}'s {which} table", info.ptr, info.ptr + info.nbytes))
            ptrs.append(info.ptr)
        else:
            ptrs.append(infos[0].ptr + view.kind_offset(which))
    g = view.geometry
    return ptrs[0], ptrs[1] if len(ptrs) > 1 else 0, g.item_bytes, g.layout_dim


def _mode(src: Any, dst: Any) -> str:
    for name, view in (("src_view", src), ("dst_view", dst)):
        if not isinstance(view, (CacheView, Fp8View)):
            raise TypeError(f"{name} must be a kvnumba cache view or kv.Fp8View, got {type(view).__name__}")
        if isinstance(view, LayerTable):
            raise TypeError(f"{name} is a LayerTable (raw addresses, no dtype): an FP8 copy needs a LayerFirst of "
                            "the layers' arrays")
    src_q, dst_q = isinstance(src, Fp8View), isinstance(dst, Fp8View)
    if not (src_q or dst_q):
        raise TypeError("an FP8 copy needs a kv.Fp8View on one side at least")
    return "copy" if src_q and dst_q else "quantise" if dst_q else "dequantise"


class Fp8Plan:
    """The validated, launch-ready part of one FP8 copy (see the module docstring)."""

    def __init__(self, src: Any, dst: Any, layers: Any) -> None:
        self.mode = mode = _mode(src, dst)
        fp8 = dst if mode == "quantise" else src
        if src.mla != dst.mla:
            raise ValueError(f"src_view is {'MLA (no V)' if src.mla else 'K and V'} but dst_view is "
                             f"{'MLA (no V)' if dst.mla else 'K and V'}")
        heads, head_dim = fp8.heads, fp8.head_dim
        if mode == "copy":
            if src.fmt != dst.fmt:
                raise ValueError(f"src_view holds {src.fmt} codes but dst_view {dst.fmt}: an FP8 copy does not "
                                 "convert between formats")
            if (src.heads, src.head_dim) != (dst.heads, dst.head_dim):
                raise ValueError(f"the views' heads differ: src_view (H={src.heads}, D={src.head_dim}), dst_view "
                                 f"(H={dst.heads}, D={dst.head_dim})")
            dtype = "bfloat16"
        else:
            plain: CacheView = src if mode == "quantise" else dst
            dtype = plain_dtype_of(plain, fp8)
            g = plain.geometry
            name = "src_view" if mode == "quantise" else "dst_view"
            if g.heads != heads or g.item_bytes != heads * head_dim * 2:
                raise ValueError(f"{name} has items of {g.heads} heads, {g.item_bytes} bytes; the FP8 view's are "
                                 f"{heads} heads of {head_dim} elements ({heads * head_dim * 2} bytes as {dtype})")
            if plain.user_layout:
                check_user_layout(plain, heads)
        self.first_layer, self.window = plan_window(src, dst, layers)
        placed: list = []
        self.destinations: list = []
        guides: list = []
        self.kept: list = []
        self.src = _Side("src_view", src, False, placed, self.destinations, guides, self.kept)
        self.dst = _Side("dst_view", dst, True, placed, self.destinations, guides, self.kept)
        self.device = one_device(placed)
        check_disjoint(self.destinations, guides)
        self.uses_torch = any(type(b).__module__.startswith("torch")
                              for v in (src, dst) for part in ((v.codes, v.scales) if isinstance(v, Fp8View) else (v,))
                              for which in ("k", "v") if getattr(part, which) is not None
                              for b in part.buffers(which))
        self.fmt, self.dtype = fp8.fmt, dtype
        s, d = self.src, self.dst
        self.template = kernels.Fp8Args(
            src_indices=0, dst_indices=0, num_items=0, items_per_warp=0, first_layer=self.first_layer,
            src_token_limit=s.tokens, dst_token_limit=d.tokens, num_layers=self.window, heads=heads,
            words=head_dim // 4, error_flag=guard.flag_address(),
            src_k=s.k, src_v=s.v, src_item=s.item, src_dim=s.dim, src_page=s.page, src_scales_k=s.scales[0],
            src_scales_v=s.scales[1], src_scales_item=s.scales[2], src_scales_dim=s.scales[3],
            dst_k=d.k, dst_v=d.v, dst_item=d.item, dst_dim=d.dim, dst_page=d.page, dst_scales_k=d.scales[0],
            dst_scales_v=d.scales[1], dst_scales_item=d.scales[2], dst_scales_dim=d.scales[3])
        dispatcher = kernels.get_kernel(s.parts, d.parts, src.mla, mode, self.fmt, dtype)
        self.kernel = BoundKernel(launchable(dispatcher, kernels.SIGNATURE), self.device, self.template)
        self.staged = fp8_staged_plan.bind_staged(self, src, dst)  # staged loads (kvnumba.plan.fp8_staged_plan)
        checks = config.tuning("host_index_checks")
        self.host_index_checks = checks is None or bool(checks)

    tables: tuple = ()  # no layer tables of the caller's to read again with checks on (KernelPlan.tables)

    def fast(self, src_indices: Any, dst_indices: Any, layer_id: Any, block_quota: Any = 2,
             num_warps_per_block: Any = 32, *, stream: Any = None, check: bool = False, route: Any = "auto") -> int:
        """A call as a plan's per-call path takes it (``KernelPlan.fast``'s arguments: ``layer_id`` is None
        for ``kv.copy``): the route checked, a pending kernel error raised, then ``run``."""
        _call_checks(route)
        return self.run(src_indices, dst_indices, block_quota, num_warps_per_block, stream,
                        check or guard.ALWAYS_CHECK)

    def run(self, src_indices: Any, dst_indices: Any, block_quota: Any = 2, num_warps_per_block: Any = 32,
            stream: Any = None, check: bool = False) -> int:
        """One call: indices checked, then one launch (``check``: wait, and raise if the kernel skipped
        items). Nothing is written when a check fails."""
        block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
        src_info, dst_info = validate.indices(src_indices, dst_indices)
        count = src_info.shape[0]
        host = []
        for info, name, side in ((src_info, "src_indices", self.src), (dst_info, "dst_indices", self.dst)):
            on_host = SIMULATOR or info.device == HOST
            if not on_host and info.device != self.device:
                raise DeviceMismatchError(f"{name} is on cuda:{info.device} but the buffers are on cuda:{self.device}")
            check_disjoint(self.destinations, [(name, info.ptr, info.ptr + 8 * count)])
            values = bounds.host_indices(info) if on_host else None
            if on_host and count and self.host_index_checks:
                bounds.check_indices(name, values, side.tokens, side.label)
            host.append((info.ptr, values if on_host and not SIMULATOR else None))
        handle = stream_handle(stream, self.device if self.uses_torch or src_info.is_torch or dst_info.is_torch
                               else None)
        if count == 0:
            return handle
        if check:
            capture.refuse(handle, "check=True (it waits for the stream)", "call kv.check_errors() after the replay")
        routes.log.record("kernel")
        items_per_warp, grid, threads = launch_shape(count, block_quota, warps)
        kernel = self.kernel if self.staged is None else self.staged.kernel_for(count, warps, self.kernel)
        if any(values is not None for _, values in host):  # host indices on a GPU: copied for the kernel
            capture.refuse(handle, "a call with indices in host memory",
                           "pass GPU index arrays (a replay reads their contents then)")
            from numba import cuda

            with on_device(self.device):
                cuda_stream = cuda.external_stream(handle) if handle else cuda.default_stream()
                staged = [None if values is None else cuda.to_device(np.ascontiguousarray(values), stream=cuda_stream)
                          for _, values in host]
                pointers = [ptr if copy is None else copy.device_ctypes_pointer.value
                            for (ptr, _), copy in zip(host, staged)]
                _pack_call(kernel.blocks.view, 0, pointers[0], pointers[1], count, items_per_warp)
                kernel.launch(grid, threads, handle, kernel.blocks.address)
                cuda_stream.synchronize()
        else:
            _pack_call(kernel.blocks.view, 0, host[0][0], host[1][0], count, items_per_warp)
            kernel.launch(grid, threads, handle, kernel.blocks.address)
        if check:
            with on_device(self.device):
                guard.synchronize(handle)
            if guard.flag_set():
                guard.clear()
                raise IndexOutOfRangeError("the kernel skipped items with out-of-range token indices (of "
                                           f"{self.src.label} or {self.dst.label}); the other items were copied")
        return handle
