"""The pipelined NVFP4 load: a dequantising copy (vLLM's NVFP4 pages to bfloat16/float16) whose reads land in shared
memory by per-thread asynchronous copies (``kernels.async_copy``), a round ahead of the conversion (as
``kernels.dequantise_pipelined`` does for FP8); the parameters (``nvfp4.Nvfp4Args``), work split, index guard and
results of ``kernels.nvfp4``'s dequantising kernel, bit for bit.

A round is one pass of the register kernel: lane ``i`` holds groups ``base + i`` and ``base + 32 + i`` of a
token's K and of its V (8 code bytes and the 4-byte word holding the group's scale each). A stage holds them
field by field, lane by lane (consecutive lanes at consecutive words), and each lane reads back only what it
copied itself, so the warp never meets. Needs ``cp.async`` (compute capability 8.0) and ``SHARED_BYTES`` of shared
memory a block; the plan falls back to the register kernel elsewhere.
"""
from numba import cuda, int64

from .async_copy import commit, copy4, copy8, load_shared_i64, waiter
from .factory import memoised
from .jit import WARP_SIZE, kernel
from ..quant.fp8 import plain_dtype
from .nvfp4 import SIGNATURE, Nvfp4Args, group_ops, side_base, slot_of
from .params import check_parameters
from .scaled_copy import next_item
from .ptx import ptx_of
from .tma import load_shared_u32, shared_address

STAGES = 2  # rounds of a warp's ring: one lands while the other converts
_CODES, _SCALES = 0, 4 * 8 * WARP_SIZE  # a stage: four code fields of 8 bytes a lane, then four scale fields of 4
STAGE_BYTES = _SCALES + 4 * 4 * WARP_SIZE
MAX_WARPS = 32  # the most warps of a block a call may ask for (launch.MAX_WARPS)
SHARED_BYTES = MAX_WARPS * STAGES * STAGE_BYTES


def get_kernel(plain_parts, src_hnd, dtype, groups):
    """The pipelined load for one (plain side's ``LayoutParts``, source in HND order, plain dtype, ``D / 16``), built
    on first request and memoised."""
    return memoised(build, plain_parts, bool(src_hnd), plain_dtype(dtype), int(groups))


def kernel_ptx(plain_parts, src_hnd, dtype="bfloat16", groups=8, cc=(9, 0)):
    """PTX of one pipelined load for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(plain_parts, src_hnd, dtype, groups), SIGNATURE, cc)


def build(plain_parts, src_hnd, dtype, groups):
    """The pipelined load kernel for one plain layout (``LayoutParts``), source order, plain dtype and ``groups``
    (``D / 16``, compiled in: a group's head by a division by a constant)."""
    _, decode = group_ops(dtype)
    nv_slot = slot_of(src_hnd)
    lb, to, hs = plain_parts.layer_base, plain_parts.token_offset, plain_parts.head_stride
    wait_previous = waiter(1)  # all but the newest group landed: the round before it

    per_head = groups

    def nvfp4_load(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit, dst_token_limit,
                   num_layers, heads, groups, error_flag, plain_k, plain_v, plain_item, plain_dim, plain_page,
                   src_table, src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale, v_scale,
                   k_unscale, v_unscale, thresholds):
        smem = cuda.shared.array(0, int64)
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        ring = shared_address(smem) + (cuda.threadIdx.x >> 5) * (STAGES * STAGE_BYTES)
        total = heads * per_head
        scales_at = heads * src_block * per_head * 8  # a side's scale region, past its data
        p_stride = hs(plain_dim, plain_item, heads, plain_page)
        first = warp * items_per_warp
        count = min(items_per_warp, num_items - first)
        end_layer = first_layer + num_layers
        # the issuing walk over (item j, layer, base), set one round before the first
        j = -1
        layer = end_layer - 1
        base = total
        t = tok = p_off = pk = pv = nk = 0
        c_pk = c_pv = c_base = 0  # the round being converted
        more = True
        have = False
        slot = 0
        while True:
            if more:
                base += 2 * WARP_SIZE
                if base >= total:
                    base = 0
                    layer += 1
                    if layer >= end_layer:  # the next item whose indices are in bounds
                        layer = first_layer
                        j, tok, d_tok = next_item(lane, first, j + 1, count, src_indices, dst_indices,
                                                  src_token_limit, dst_token_limit, error_flag)
                        more = j < count
                        t = tok % src_block
                        p_off = to(d_tok, plain_dim, plain_item, heads, plain_page)
                    if more:
                        nk = side_base(src_table, layer, tok, src_page_bytes, src_block, 0)
                        pk = lb(plain_k, layer, plain_dim, plain_item, heads, plain_page) + p_off
                        pv = lb(plain_v, layer, plain_dim, plain_item, heads, plain_page) + p_off
            stage = ring + slot * STAGE_BYTES
            if more:  # this round's copies, K's and V's of two groups a lane
                for r in range(2):
                    i = base + r * WARP_SIZE + lane
                    if i < total:
                        h = i // per_head
                        g = i - h * per_head
                        n_slot = nv_slot(t, h, heads, src_block)
                        data_at = n_slot * per_head * 8 + g * 8
                        scale_at = scales_at + n_slot * per_head + (g & ~3)
                        copy8(stage + _CODES + (2 * r) * 8 * WARP_SIZE + 8 * lane, nk + data_at)
                        copy8(stage + _CODES + (2 * r + 1) * 8 * WARP_SIZE + 8 * lane, nk + (src_page_bytes >> 1)
                              + data_at)
                        copy4(stage + _SCALES + (2 * r) * 4 * WARP_SIZE + 4 * lane, nk + scale_at)
                        copy4(stage + _SCALES + (2 * r + 1) * 4 * WARP_SIZE + 4 * lane, nk + (src_page_bytes >> 1)
                              + scale_at)
            commit()  # an empty group once the walk is done: the wait below still means the round before it
            if have:
                wait_previous()
                done = ring + (slot ^ 1) * STAGE_BYTES
                for r in range(2):
                    i = c_base + r * WARP_SIZE + lane
                    if i < total:
                        h = i // per_head
                        g = i - h * per_head
                        plain_at = h * p_stride + g * 32
                        for kind in range(2):
                            codes = load_shared_i64(done + _CODES + (2 * r + kind) * 8 * WARP_SIZE + 8 * lane)
                            scales = load_shared_u32(done + _SCALES + (2 * r + kind) * 4 * WARP_SIZE + 4 * lane)
                            decode(True, (c_pv if kind else c_pk) + plain_at, codes, scales, g,
                                   v_scale if kind else k_scale)
            if not more:
                break
            have = True
            c_pk, c_pv, c_base = pk, pv, base
            slot ^= 1

    check_parameters(nvfp4_load, Nvfp4Args)
    nvfp4_load.__name__ = nvfp4_load.__qualname__ = (f"nvfp4_load_{dtype}_{plain_parts.name}_"
                                                     f"{'hnd' if src_hnd else 'nhd'}_g{groups}")
    return kernel(nvfp4_load, max_registers=64)
