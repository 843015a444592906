"""The resident loader's staged build: every layer of a load on a few blocks, each layer moved by the staged
kernel's ring (``kernels.staged``) and published as it lands, as the register build does (``kernels.resident``).

Per block and layer: the ring's barriers made (invalidated first from the second layer on), the block's items
of that layer through the ring, a barrier (each warp has waited for its bulk stores' writes), then the arrival
and, for the last block, the publication. The ring's tensor maps picture every layer of the source (page-first
and page-head maps hold the layer as a coordinate): one set serves the whole load.

Parameters: the staged kernel's (``params.StagedArgs``), then ``resident.RESIDENT_EXTRA``.
"""
from collections import namedtuple

from numba import cuda, int64

from .factory import MAX_REGISTERS, copy_shape_for, memoised
from .jit import kernel
from .layouts import LAYER_FIRST, LAYER_TABLE, PAGE_FIRST, PAGE_HEAD
from .params import StagedArgs, check_parameters, signature
from .ptx import ptx_of
from .resident import RESIDENT_EXTRA, layer_landed
from .staged import MAX_STAGES, SHAPE, check_ring, make_load_block, make_reset

ResidentStagedArgs = namedtuple("ResidentStagedArgs", StagedArgs._fields + RESIDENT_EXTRA)  # type: ignore[misc]
RESIDENT_STAGED_SIGNATURE = signature(ResidentStagedArgs)
# Sources whose maps hold every layer; destinations a piece's tokens are written to one by one (a layer's buffer,
# found by the layout's arithmetic: a table's entry too).
SOURCES = (PAGE_FIRST, PAGE_HEAD)
DESTINATIONS = (LAYER_FIRST, LAYER_TABLE)


def _build(src, dst, mla, shape, ring):
    set_up, run_block = make_load_block(src, dst, mla, shape, ring)
    reset = make_reset(ring)

    def resident_load_staged(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                             dst_token_limit, src_k, dst_k, src_v, dst_v, num_layers, item_size, src_layout_dim,
                             dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag, maps, max_run_log2,
                             min_run, layers_done, arrivals):
        smem = cuda.shared.array(0, int64)
        holder = cuda.local.array(MAX_STAGES, int64)
        tid = cuda.threadIdx.x
        layer = 0
        while layer < num_layers:
            if layer > 0 and tid == 0:
                reset(smem)  # the last layer's barriers: every post was consumed, every bulk copy has landed
            set_up(smem, tid, cuda.blockDim.x)
            cuda.syncthreads()
            at = first_layer + layer
            args = (src_indices, dst_indices, at, src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v,
                    item_size, src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag)
            run_block(smem, holder, tid, cuda.blockIdx.x, cuda.blockDim.x, num_items, items_per_warp, src_indices,
                      dst_indices, at, src_token_limit, dst_token_limit, src_page_size, maps, max_run_log2, min_run,
                      item_size, args)
            cuda.syncthreads()  # every warp is done with the layer (its bulk stores waited for)
            if tid == 0:
                layer_landed(layer, cuda.gridDim.x, layers_done, arrivals)
            layer += 1

    check_parameters(resident_load_staged, ResidentStagedArgs)
    name = f"resident_load_staged_{src.name}_{dst.name}{'_mla' if mla else ''}"
    resident_load_staged.__name__ = resident_load_staged.__qualname__ = name
    return kernel(resident_load_staged, max_registers=MAX_REGISTERS)


def get_resident_staged_kernel(src, dst, mla, ring=None):
    """The staged resident loader from ``src`` (one of ``SOURCES``) to ``dst`` (one of ``DESTINATIONS``) with ring
    ``ring`` (default ``staged.SHAPE``), built on first request and memoised."""
    if src not in SOURCES or dst not in DESTINATIONS:
        raise ValueError(f"no staged resident loader from {src.name} to {dst.name}")
    return memoised(_build, src, dst, bool(mla), copy_shape_for(src, dst, mla), check_ring(ring or SHAPE))


def resident_staged_ptx(src, dst, mla, cc=(9, 0)):
    """PTX of one staged resident loader (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_resident_staged_kernel(src, dst, mla), RESIDENT_STAGED_SIGNATURE, cc)
