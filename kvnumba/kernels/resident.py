"""The resident loader: one launch that copies every layer of a load on a few blocks, layer after layer,
and publishes each layer as it lands.

Each block's warps copy their share of one layer's items (the register kernel's split and per-item body,
``item_copy.make_items_copy``); then, after a barrier, the block's first thread fences (system scope: a
destination may be host memory) and adds 1 to the layer's arrival word. The block that brings the count to
the grid's size fences again and publishes ``layer + 1`` into the load's one ``layers_done`` word
(``signals.publish_u32``, a maximum with release semantics). No block waits for the others.

One counter, not one per layer: a block arrives at layer ``l + 1`` only after it published or arrived at ``l``,
so the word counts layers landed in order, a waiter for layer ``l`` waits for ``layers_done >= l + 1``
(``kvnumba.plan.layer_signal``), and one word is all the host resets between loads.

This is the register build; ``resident_staged`` moves runs of tokens by the bulk-copy unit and publishes alike,
and ``nvfp4.get_kernel(..., resident=True)`` quantises or dequantises each layer (NVFP4's codec).
"""
from collections import namedtuple

from numba import cuda

from .factory import MAX_REGISTERS, NARROW_REGISTERS, _parts, copy_shape_for, memoised
from .item_copy import make_items_copy
from .jit import WARP_SIZE, device_function, kernel
from .params import KernelArgs, check_parameters, signature
from .ptx import ptx_of
from .signals import arrive_u32, fence_system, publish_u32

# layers_done: one uint32, the layers of this load landed; arrivals: one uint32 per layer, the blocks done with it.
RESIDENT_EXTRA = ("layers_done", "arrivals")
ResidentArgs = namedtuple("ResidentArgs", KernelArgs._fields + RESIDENT_EXTRA)  # type: ignore[misc]  # computed
RESIDENT_SIGNATURE = signature(ResidentArgs)


@device_function
def layer_landed(layer, blocks, layers_done, arrivals):
    """A block's end of ``layer``, by its first thread once every warp has stored its share (after a barrier):
    fence, then arrive; the block that brings the count to ``blocks`` fences again and publishes."""
    fence_system()  # the block's stores before its arrival, for any observer (a destination may be host memory)
    if arrive_u32(arrivals + 4 * layer) == blocks - 1:
        fence_system()  # every block's stores (seen through the arrivals) before the signal
        publish_u32(layers_done, layer + 1)


def _build_kernel(src, dst, mla, copy_shape, narrow):
    copy_items = make_items_copy(src, dst, mla, copy_shape)

    def resident_load(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                      dst_token_limit, src_k, dst_k, src_v, dst_v, num_layers, item_size, src_layout_dim,
                      dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag, layers_done, arrivals):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        first_item = warp * items_per_warp
        count = min(items_per_warp, num_items - first_item)  # negative for warps past the last item
        layer = 0
        while layer < num_layers:
            copy_items(lane, first_item, 0, count, 1, src_indices, dst_indices, first_layer + layer, 1,
                       src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v, item_size, src_layout_dim,
                       dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag)
            cuda.syncthreads()  # every warp of the block has stored its share of the layer
            if cuda.threadIdx.x == 0:
                layer_landed(layer, cuda.gridDim.x, layers_done, arrivals)
            layer += 1

    check_parameters(resident_load, ResidentArgs)
    name = f"resident_load_{src.name}_{dst.name}{'_mla' if mla else ''}{'_narrow' if narrow else ''}"
    resident_load.__name__ = resident_load.__qualname__ = name
    return kernel(resident_load, max_registers=NARROW_REGISTERS if narrow else MAX_REGISTERS)


def get_resident_kernel(src_layout, dst_layout, mla, narrow=False):
    """The resident loader for one layout pair (``LayoutParts`` or a seed layout name), built on first request
    and memoised; its inner loop's shape is the register kernel's for the pair (``factory.copy_shape_for``).
    ``narrow``: the build for one-warp blocks, capped at ``factory.NARROW_REGISTERS`` so that a block fits on an SM
    beside a GEMM's blocks (as the register kernel's narrow build)."""
    src, dst = _parts(src_layout), _parts(dst_layout)
    return memoised(_build_kernel, src, dst, bool(mla), copy_shape_for(src, dst, mla), bool(narrow))


def resident_ptx(src_layout, dst_layout, mla, cc=(9, 0), narrow=False):
    """PTX of one resident loader for compute capability ``cc``; needs NVVM, not a GPU (not the simulator)."""
    return ptx_of(get_resident_kernel(src_layout, dst_layout, mla, narrow), RESIDENT_SIGNATURE, cc)
