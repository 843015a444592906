"""A resident load on a kernel plan: ``kv.copy``'s plan for the views, its call checked as every call is
(``per_call.checked``), then one launch of the resident loader (``kvnumba.kernels.resident``) over the plan's
layers, its layers published in a ``LayerSignal`` (``kvnumba.plan.layer_signal``) reset on the same stream
first.

The loader is bound to a plan on first use, with the plan's parameter values (``KernelPlan.template``) and
the signal's two addresses, which each load writes into its block with its indices. Its staged build
(``kernels.resident_staged``) takes the loads ``resident_staged_plan`` gives it, the register build the others.
"""
import struct

import numpy as np

from ..driver.devices import on_device
from ..driver.launch import BoundKernel, launch_shape, launchable
from ..driver.target import SIMULATOR
from ..kernels.params import pack_call
from ..kernels.resident import RESIDENT_SIGNATURE, ResidentArgs, get_resident_kernel
from ..kernels.resident_staged import ResidentStagedArgs
from . import per_call
from .resident_staged_plan import staged_resident

# The signal's addresses in a parameter block: the last two values of either build's.
_SIGNAL_AT = 8 * ResidentArgs._fields.index("layers_done")
_STAGED_SIGNAL_AT = 8 * ResidentStagedArgs._fields.index("layers_done")
_pack_signal = struct.Struct("2q").pack_into


def resident_kernel(plan, narrow=False):
    """The resident loader bound to ``plan``'s parameter values (made on first use, and again for a plan whose
    template changed, a rebound one's); ``narrow``: its build for one-warp blocks (``kernels.resident``)."""
    key = "_resident_narrow" if narrow else "_resident"
    bound = plan.__dict__.get(key)
    if bound is None or bound[0] is not plan.template:
        src, dst, mla = plan.kernel_key
        kernel = launchable(get_resident_kernel(src, dst, mla, narrow), RESIDENT_SIGNATURE)
        template = ResidentArgs._make((*plan.template, 0, 0))  # the signal's addresses: per load
        bound = plan.__dict__[key] = (plan.template, BoundKernel(kernel, plan.device, template))
    return bound[1]


def launch_resident(plan, call, signal):
    """Reset ``signal`` and launch the resident loader for checked call ``call`` (``per_call.Checked``) on its
    stream: ``call.block_quota`` blocks at most, the plan's every layer; the staged build where it applies.
    Returns ``(copies, staged)``: the index arrays copied to the GPU for host indices (the caller keeps them until
    the load has finished), else ``()``; whether the staged build runs."""
    handle, window = call.handle, call.window
    signal.reset(handle)
    if call.items == 0:
        signal.publish_all(handle, plan.window)
        return (), False
    items_per_warp, grid, threads = launch_shape(call.items, call.block_quota, call.warps)
    bulk = staged_resident(plan) if call.warps > 1 else None
    staged = bulk is not None and call.items >= bulk.fewest
    if bulk is not None and staged:
        kernel, signal_at = bulk.kernel, _STAGED_SIGNAL_AT
    else:  # one-warp blocks: the build that fits beside a GEMM
        kernel, signal_at = resident_kernel(plan, narrow=call.warps == 1), _SIGNAL_AT
    with on_device(plan.device):
        copies, pointers = _device_indices(call, handle)
        blocks = kernel.blocks
        pack_call(blocks.view, 0, pointers[0], pointers[1], call.items, items_per_warp, *window.params)
        _pack_signal(blocks.view, signal_at, signal.layers_done_address, signal.arrivals_address)
        kernel.launch(grid, threads, handle, blocks.address)
    return copies, staged


def _device_indices(call, handle):
    """``(copies, addresses)``: the call's index arrays where the kernel reads them; host indices on a GPU are
    copied on the load's stream (not waited for: the load runs on)."""
    indices = (call.src, call.dst)
    if SIMULATOR or not call.host_side:
        return (), [index.address for index in indices]
    from numba import cuda

    stream = cuda.external_stream(handle) if handle else cuda.default_stream()
    staged = [cuda.to_device(np.ascontiguousarray(index.values()), stream=stream) if index.on_host else None
              for index in indices]
    return staged, [index.address if copy is None else copy.device_ctypes_pointer.value
                    for index, copy in zip(indices, staged)]


def checked_call(plan, src_indices, dst_indices, block_quota, warps, stream, check):
    """``per_call.checked`` for a resident load of ``plan`` (a ``kv.copy`` plan: no ``layer_id``)."""
    return per_call.checked(plan, src_indices, dst_indices, None, block_quota, warps, stream, check)
