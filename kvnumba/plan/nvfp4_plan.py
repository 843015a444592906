"""The plan of a ``kv.copy`` with a ``kv.Nvfp4View`` on a side (``view.codec.family == "nvfp4"``): quantise into
vLLM's NVFP4 pages, dequantise out of them, or copy pages between NVFP4 caches (``kvnumba.kernels.nvfp4``; the
format: ``kvnumba.quant.nvfp4``).

Built by ``plan.build`` and cached in ``kv.copy``'s plan cache like every copy's plan, it checks the views once
(geometry, heads, dtype, global scales), resolves every buffer through ``plan.sides`` (aligned, reachable,
writable destinations, one device), gives each NVFP4 side a device table of its layers' addresses, and binds the
kernel: a load the pipelined one (``kernels.nvfp4_load``) where it runs, else ``kernels.nvfp4``'s. A call is every
kernel plan's (``plan.per_call.run``: indices checked, one launch), through ``Fp8Plan``'s.
"""
from __future__ import annotations

import numpy as np

from .. import config
from ..checks import guard
from ..driver.target import SIMULATOR
from ..kernels import nvfp4 as kernels
from ..kernels import nvfp4_load
from ..kernels.nvfp4_packed import threshold_table
from ..kernels.fp8 import f32_bits_of
from ..quant.nvfp4 import _rcp
from .copy_plan import copy_window, view_side
from .device_tables import device_table
from .fp8_plan import Fp8Plan, check_views, copy_mode, kernel_numbers
from .kernel_plan import announce
from .sides import Placement, resolve_array
from .tensor_maps import compute_capability, shared_limit


def is_nvfp4(view):
    """Whether ``view`` is a ``kv.Nvfp4View`` (its codec says so)."""
    return getattr(getattr(type(view), "codec", None), "family", None) == "nvfp4"


def _read_table(place, label, words, infos):
    """``(address, keep)``: uint64 ``words`` as a device table beside the arrays ``infos`` describe, which the
    destinations must stay clear of (``place.guides``)."""
    table = device_table(words, infos)
    info = resolve_array(Placement(), label, table, False, 16)
    place.guides.append((label, info.ptr, info.ptr + info.nbytes))
    return info.ptr, table


def _nvfp4_side(place, name, view, destination):
    """``(table, keep, infos)``: a device table of the layers' addresses (every layer: the kernel adds the layer),
    and the layers' ``ArrayInfo``."""
    infos = [resolve_array(place, f"{name}.caches[{i}]", cache, destination, 8) for i, cache in enumerate(view.raw)]
    ptr, table = _read_table(place, f"{name} (its layer table)", np.array([i.ptr for i in infos], np.uint64), infos)
    return ptr, table, infos


def _pipelined(device):
    """Whether a load takes the pipelined kernel (``kernels.nvfp4_load``): ``cp.async`` (compute capability 8.0) and
    its shared memory a block, unless ``config.override(fp8_kernel="general")`` asks for the register kernel."""
    if config.tuning("fp8_kernel") == "general":
        return False
    return SIMULATOR or (compute_capability(device) >= (8, 0) and shared_limit(device) >= nvfp4_load.SHARED_BYTES)


class Nvfp4Plan(Fp8Plan):
    """The validated, launch-ready part of one NVFP4 copy (see the module docstring)."""

    def __init__(self, src, dst, layers):
        self.mode = mode = copy_mode(src, dst, is_nvfp4, "NVFP4", "kv.Nvfp4View")
        src_q, dst_q = is_nvfp4(src), is_nvfp4(dst)
        nv = dst if mode == "quantise" else src
        heads, head_dim = nv.heads, nv.head_dim
        plain, name = (src, "src_view") if mode == "quantise" else (dst, "dst_view")
        if mode != "copy" and plain.mla:
            raise ValueError(f"{name} is MLA (no V): an NVFP4 cache holds K and V")
        dtype = check_views(src, dst, mode, nv, "NVFP4")
        if mode == "copy" and (src.k_scale, src.v_scale) != (dst.k_scale, dst.v_scale):
            raise ValueError(f"the views' global scales differ: src_view (k_scale={src.k_scale}, v_scale="
                             f"{src.v_scale}), dst_view (k_scale={dst.k_scale}, v_scale={dst.v_scale}): a copy "
                             "moves codes and scales as they are")
        if mode != "copy" and plain.head_runs not in (1, heads):
            raise ValueError(f"{name} ({plain!r}) keeps its {heads} heads in {plain.head_runs} groups: an NVFP4 "
                             "copy goes head by head, which needs one head group or one head a group")
        self.first_layer, self.window = copy_window(src, dst, layers)
        place = Placement()
        plain_side, tables, keep, nv_infos = None, {}, [], []
        for name, view, destination in (("src_view", src, False), ("dst_view", dst, True)):
            if is_nvfp4(view):
                tables[name], table, nv_infos = _nvfp4_side(place, name, view, destination)
                keep.append(table)
            else:
                plain_side = view_side(place, name, view, destination, self.first_layer, self.window, strict=False,
                                       align=8, one_layer=False)
        if mode == "quantise":  # vLLM's SFScaleVal = 1 / k_scale, and rcp of it
            inverse = [np.float32(1) / s for s in (nv.k_scale, nv.v_scale)]
            scales = [f32_bits_of(s) for s in inverse]
            unscales = [f32_bits_of(_rcp(s)) for s in inverse]
            rows = threshold_table(unscales[0], unscales[1], dtype).view(np.uint64).reshape(-1).copy()
            thresholds, table = _read_table(place, "dst_view (its e2m1 thresholds)", rows, nv_infos)
            keep.append(table)
        else:
            scales, unscales = [f32_bits_of(s) for s in (nv.k_scale, nv.v_scale)], [0, 0]
            thresholds = 0
        self.tables_kept = keep  # the device tables the kernel reads, alive with the plan
        self._placed(place, src, dst)
        self.fmt, self.dtype = "nvfp4", dtype
        p = plain_side
        self.template = kernels.Nvfp4Args(  # type: ignore[assignment]  # its first seven: every call's (pack_call)
            src_indices=0, dst_indices=0, num_items=0, items_per_warp=0, first_layer=self.first_layer,
            src_token_limit=self.tokens[0], dst_token_limit=self.tokens[1], num_layers=self.window, heads=heads,
            groups=head_dim // 16, error_flag=guard.flag_address(),
            **kernel_numbers("plain", p), plain_page=p.page_size if p else 0,
            src_table=tables.get("src_view", 0), src_page_bytes=src.page_bytes if src_q else 0,
            src_block=src.page_size if src_q else 0, dst_table=tables.get("dst_view", 0),
            dst_page_bytes=dst.page_bytes if dst_q else 0, dst_block=dst.page_size if dst_q else 0,
            k_scale=scales[0], v_scale=scales[1], k_unscale=unscales[0], v_unscale=unscales[1], thresholds=thresholds)
        # kernels.nvfp4's key: its per-layer kernel's, and the resident loader's build (resident_build)
        self._resident_key = (mode, p.parts if p else None, src_q and src.layout == "HND", dst_q and dst.layout == "HND",
                              dtype, head_dim // 16)
        shared = 0
        if p is not None and mode == "dequantise" and _pipelined(self.device):
            dispatcher = nvfp4_load.get_kernel(p.parts, src.layout == "HND", dtype, head_dim // 16)
            shared = nvfp4_load.SHARED_BYTES
        else:
            dispatcher = kernels.get_kernel(*self._resident_key)
        self._bound(dispatcher, kernels.SIGNATURE, shared)
        self.staged = None
        announce(self)

    def resident_build(self):  # a method where Fp8Plan has None
        """``(kernel, its parameters' namedtuple)``: the resident loader's NVFP4 build (``kv.load_resident``: every
        layer of a load in one launch)."""
        return kernels.get_kernel(*self._resident_key, resident=True), kernels.ResidentArgs
