"""Whether a resident load takes the loader's staged build (``kernels.resident_staged``), and that build bound to a
plan: the staged kernel's choice (``plan.staged_plan``, ``KVNUMBA_LOAD_PATH``) for a load of every layer.

- ``auto``: a page-first or page-head source in pinned host memory read into GPU memory (a layer-first view, or a
  list of layer buffers), on a GPU of compute capability 9.0 or newer whose blocks hold the ring, for loads of at
  least ``staged_plan.AUTO_MIN_ITEMS`` items in blocks of two warps or more, page-head pages that hold a bulk
  piece;
- ``staged``: wherever the layouts and sizes allow (the simulator too: tests);
- ``register``: never.

Otherwise the register build runs (``kernels.resident``). The source's tensor maps picture every layer
(``plan.tensor_maps``): one set, made with the binding, serves every load of the plan.
"""
from typing import Any, NamedTuple

from .. import config
from ..driver.launch import BoundKernel, launchable
from ..driver.target import SIMULATOR
from ..kernels import resident_staged, staged
from ..kernels.layouts import LAYER_FIRST, PAGE_HEAD
from . import tensor_maps
from .staged_plan import AUTO_MIN_ITEMS, ring_in_force


class StagedResident(NamedTuple):
    """The staged resident loader bound to one plan: launch it for calls of at least ``fewest`` items."""

    kernel: Any  # driver.launch.BoundKernel
    maps: Any  # plan.tensor_maps.SourceMaps: kept while the plan is
    fewest: int


def staged_resident(plan):
    """``plan``'s staged resident loader (``StagedResident``), or None when its loads stay on registers; made on
    first use (the setting and the ring read then, as for the staged kernel when a plan is built)."""
    found = plan.__dict__.get("_resident_staged")
    if found is None or found[0] is not plan.template:
        found = plan.__dict__["_resident_staged"] = (plan.template, _bind(plan, config.load_path(), ring_in_force()))
    return found[1]


def _bind(plan, path, ring):
    src_parts, dst_parts, mla = plan.kernel_key
    if path == "register" or src_parts not in resident_staged.SOURCES or dst_parts not in resident_staged.DESTINATIONS:
        return None
    template, src = plan.template, plan.src
    if dst_parts is LAYER_FIRST and any(p % 16 for p in (template.dst_k, template.dst_v) if p):
        return None  # pieces leave shared memory in 16-byte stores
    if path == "auto":
        src_host, dst_host = plan.memory
        if SIMULATOR or not src_host or dst_host or tensor_maps.compute_capability(plan.device) < (9, 0):
            return None
        if tensor_maps.shared_limit(plan.device) < ring.shared_bytes:
            return None
    run_limits = staged.run_limits(plan.item_size, mla, ring)
    if run_limits is None or src.tokens is None:
        return None
    if path == "auto" and src_parts is PAGE_HEAD and \
            src.page_size < tensor_maps.piece_limits(run_limits, True, src.page_size)[1]:
        return None  # pages shorter than a bulk piece: every item through registers, more slowly
    maps = tensor_maps.source_maps(src_parts, template.src_k, template.src_v, src.tokens * src.layout_dim,
                                   plan.item_size, src.layout_dim, src.page_size, plan.head_num, mla, run_limits,
                                   ring.stage_bytes)
    if maps is None:
        return None
    kernel = launchable(resident_staged.get_resident_staged_kernel(src_parts, dst_parts, mla, ring),
                        resident_staged.RESIDENT_STAGED_SIGNATURE, ring.shared_bytes)
    args = resident_staged.ResidentStagedArgs._make((*template, *maps.args, 0, 0))  # the signal's: per load
    return StagedResident(BoundKernel(kernel, plan.device, args), maps, AUTO_MIN_ITEMS if path == "auto" else 1)
