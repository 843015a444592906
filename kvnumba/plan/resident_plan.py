"""A resident load on a kernel plan: ``kv.copy``'s plan for the views, its call checked as every call is
(``per_call.checked``), then one launch of the resident loader (``kvnumba.kernels.resident``) over the plan's
layers, its layers published in a ``LayerSignal`` (``kvnumba.plan.layer_signal``) reset on the same stream
first.

The loader is bound to a plan on first use, with the plan's parameter values (``KernelPlan.template``) and
the signal's two addresses, which each load writes into its block with its indices. Its staged build
(``kernels.resident_staged``) takes the loads the staged kernel's setting gives it (``plan.staged_plan``,
``KVNUMBA_LOAD_PATH``), for a load of every layer; the register build the others. The source's tensor maps
picture every layer: one set serves every load of the plan. An NVFP4 copy's plan takes its codec's build
(``resident_build``), which quantises or dequantises on registers.
"""
import struct
from typing import Any, NamedTuple

from .. import config
from ..driver.devices import on_device
from ..driver.launch import BoundKernel, launch_shape, launchable
from ..kernels import resident_staged, staged
from ..kernels.layouts import LAYER_FIRST, slot_bytes
from ..kernels.params import pack_call, signature
from ..kernels.resident import ResidentArgs, get_resident_kernel
from . import per_call, tensor_maps
from .staged_plan import AUTO_MIN_ITEMS, auto_declines, ring_in_force, short_pages, unaligned_destination

# Where the signal's addresses go in the staged build's parameter block (the others': resident_kernel).
_STAGED_SIGNAL_AT = 8 * resident_staged.ResidentStagedArgs._fields.index("layers_done")
_pack_signal = struct.Struct("2q").pack_into


def resident_kernel(plan, narrow=False):
    """``(kernel, where its signal goes)``: the resident loader bound to ``plan``'s parameter values (made on first
    use, and again for a plan whose template changed, a rebound one's); ``narrow``: its build for one-warp blocks
    (``kernels.resident``). A codec plan's loader is its codec's build (``resident_build``), for any blocks."""
    codec_build = getattr(plan, "resident_build", None)

    def bind():
        if codec_build is not None:
            dispatcher, args = codec_build()
        else:
            src, dst, mla = plan.kernel_key
            dispatcher, args = get_resident_kernel(src, dst, mla, narrow), ResidentArgs
        kernel = launchable(dispatcher, signature(args))
        template = args._make((*plan.template, 0, 0))  # the signal's addresses: per load
        return BoundKernel(kernel, plan.device, template), 8 * args._fields.index("layers_done")

    return _per_template(plan, "_resident_narrow" if narrow and codec_build is None else "_resident", bind)


def _per_template(plan, key, make):
    """``make()``, kept on ``plan`` under ``key`` while its parameter template stays (a rebound plan's differs)."""
    found = plan.__dict__.get(key)
    if found is None or found[0] is not plan.template:
        found = plan.__dict__[key] = (plan.template, make())
    return found[1]


class StagedResident(NamedTuple):
    """The staged resident loader bound to one plan: launch it for calls of at least ``fewest`` items."""

    kernel: Any  # driver.launch.BoundKernel
    maps: Any  # plan.tensor_maps.SourceMaps: kept while the plan is
    fewest: int


def staged_resident(plan):
    """``plan``'s staged resident loader (``StagedResident``), or None when its loads stay on registers; made on
    first use (the setting and the ring read then)."""
    if getattr(plan, "resident_build", None) is not None:
        return None  # a codec plan's resident loader has one build
    return _per_template(plan, "_resident_staged", lambda: _bind_staged(plan, config.load_path(), ring_in_force()))


def _bind_staged(plan, path, ring):
    src_parts, dst_parts, mla = plan.kernel_key
    template, src = plan.template, plan.src
    if (path == "register" or src_parts not in resident_staged.SOURCES
            or dst_parts not in resident_staged.DESTINATIONS
            or (dst_parts is LAYER_FIRST and unaligned_destination(template))
            or (path == "auto" and auto_declines(plan.memory, plan.device, ring))):
        return None
    run_limits = staged.run_limits(plan.item_size, mla, ring)
    if run_limits is None or src.tokens is None or short_pages(path, src_parts, run_limits, src.page_size):
        return None
    maps = tensor_maps.source_maps(src_parts, template.src_k, template.src_v,
                                   src.tokens * slot_bytes(src_parts, src.layout_dim, src.page_size),
                                   plan.item_size, src.layout_dim, src.page_size, plan.head_num, mla, run_limits,
                                   ring.stage_bytes)
    if maps is None:
        return None
    kernel = launchable(resident_staged.get_resident_staged_kernel(src_parts, dst_parts, mla, ring),
                        resident_staged.RESIDENT_STAGED_SIGNATURE, ring.shared_bytes)
    args = resident_staged.ResidentStagedArgs._make((*template, *maps.args, 0, 0))  # the signal's: per load
    return StagedResident(BoundKernel(kernel, plan.device, args), maps, AUTO_MIN_ITEMS if path == "auto" else 1)


def launch_resident(plan, call, signal):
    """Reset ``signal`` and launch the resident loader for checked call ``call`` (``per_call.Checked``) on its
    stream: ``call.block_quota`` blocks at most, the plan's every layer; the staged build where it applies.
    Returns ``(copies, staged)``: the index arrays copied to the GPU for host indices (the caller keeps them until
    the load has finished), else ``()``; whether the staged build runs."""
    handle, window = call.handle, call.window
    signal.reset(handle)
    if call.items == 0:
        signal.publish(handle, plan.window)
        return (), False
    items_per_warp, grid, threads = launch_shape(call.items, call.block_quota, call.warps)
    bulk = staged_resident(plan) if call.warps > 1 else None
    staged = bulk is not None and call.items >= bulk.fewest
    if bulk is not None and staged:
        kernel, signal_at = bulk.kernel, _STAGED_SIGNAL_AT
    else:  # one-warp blocks: the build that fits beside a GEMM
        kernel, signal_at = resident_kernel(plan, narrow=call.warps == 1)
    with on_device(plan.device):
        copies, pointers = per_call.stage_indices((call.src, call.dst), handle)
        blocks = kernel.blocks
        pack_call(blocks.view, 0, pointers[0], pointers[1], call.items, items_per_warp, *window.params)
        _pack_signal(blocks.view, signal_at, signal.layers_done_address, signal.arrivals_address)
        kernel.launch(grid, threads, handle, blocks.address)
    return copies, staged


def checked_call(plan, src_indices, dst_indices, block_quota, warps, stream, check):
    """``per_call.checked`` for a resident load of ``plan`` (a ``kv.copy`` plan: no ``layer_id``)."""
    return per_call.checked(plan, src_indices, dst_indices, None, block_quota, warps, stream, check)
