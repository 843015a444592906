"""The staged load: a per-layer load from a quantised cache (``kv.Fp8View``) in pinned host memory into a
bfloat16/float16 view on the GPU, dequantising on the way, with the staged kernel's ring
(``kernels.staged.make_ring``): the bulk-copy unit (TMA) brings runs of tokens' codes into shared memory, warps
dequantise them from there. Why: a register kernel moves only the bytes its warps hold per PCIe round trip; the
bulk-copy unit keeps a whole ring of stages in flight.

Per block, as in ``kernels.staged``: warp 0, the loader, posts runs of consecutive source tokens as bulk pieces
(one box of K's codes and one of V's, through the codes' tensor maps: ``plan.fp8_staged_plan``), short runs as
direct batches, or the register mark for a block of few runs. The other warps:

- **bulk pieces**: every consumer warp takes tokens ``j, j + n, ..`` of a piece (``bulk_stores=False``,
  ``store_warps=0``: dequantising is arithmetic). A stage holds the piece's K codes, V's from the next 128-byte
  boundary (``staged.second_buffer``), then a scale area of ``kinds * count * H`` float32 ``[kind][token][head]``
  (``scale_area``). The scales land on the piece's barrier with the codes, so no consumer waits a round trip
  of its own: through the scales' own tensor maps where a token's scales make a box row and land 128-byte
  aligned (``scale_maps``), else copied by the loader's lanes (``fill_scales``). Each lane then takes 16-code
  chunks (``D % 16 == 0``) and stores 32 bytes of plain values at the destination layout's address, by the
  codec's packed conversion or, for NaN codes, e5m2 infinities and non-finite scales, its exact functions.
  Lanes walk the chunks by counting (``advance``): a 64-bit division costs more than a chunk's conversion;
- **direct items** and a register-marked block's share: the register kernel's own loop
  (``scaled_copy.make_items_copy``).

A stage holds up to ``2**max_run_log2`` tokens (``run_limits``); a block has at most ``WARPS`` warps, so that a
thread holds its values in registers (``REGISTERS``). Parameters: ``StagedScaledArgs``, ``ScaledArgs``' then
``params.STAGED_EXTRA``'s and ``scale_maps``. A per-layer table source is read through one-layer maps.
"""
from collections import namedtuple

from numba import cuda, int64

from ..quant.fp8 import E4M3
from . import staged
from .async_copy import copy4, landed_arrive
from .factory import codec_ops, memoised
from .jit import WARP_SIZE, device_function, kernel
from .layouts import LAYER_FIRST, LAYER_TABLE, PAGE_FIRST, PAGE_HEAD
from .memory import load_i64
from .params import STAGED_EXTRA, check_parameters, signature
from .ptx import ptx_of
from .scaled_copy import ScaledArgs, codec_key, kernel_name, make_items_copy
from .staged import MAP_BYTES, MAX_STAGES
from .tma import expect_bytes, load_shared_i128, load_shared_u32, tensor_load
from .words import store_i64

# ``scale_maps``: the scales' tensor maps (``plan.tensor_maps.source_maps`` over the scales buffers, with the
# codes' run limits), or 0: the loader's lanes copy the scales four bytes at a time
StagedScaledArgs = namedtuple("StagedScaledArgs",  # type: ignore[misc]
                              ScaledArgs._fields + STAGED_EXTRA + ("scale_maps",))
SIGNATURE = signature(StagedScaledArgs)
SOURCES = (LAYER_FIRST, LAYER_TABLE, PAGE_FIRST, PAGE_HEAD)  # a table's layer: a layer-first map of its buffer
# The bfloat16 ring with every consumer warp sharing each piece, and stages of 72 KiB: a piece of 32 tokens of
# 8 heads of 128 codes and their scales fits one (config's staged_shape: another ring, always run so).
SHAPE = staged.SHAPE._replace(bulk_stores=False, store_warps=0, stage_bytes=72 * 1024)
CHUNK = 16  # codes a lane dequantises at once (one shared-memory load): heads of a multiple of 16
# A block's warps, at most (``Fp8Plan.run`` launches fewer where a call asks for more): at 32 warps of 64
# registers the consumers' chunk loop spilled into local memory, which the ring leaves little L1 for.
WARPS = 16
# A block's 65536 registers shared by its threads, in the GPU's units of 8 a thread, at most 255 (ptxas's)
REGISTERS = min(65536 // (WARPS * WARP_SIZE), 255) // 8 * 8


def map_layout(src):
    """The layout the tensor maps of source ``src`` picture (``plan.tensor_maps``)."""
    return LAYER_FIRST if src is LAYER_TABLE else src


def run_limits(codes_item, heads, mla, ring):
    """``staged.run_limits`` for a stage that holds each token's codes and scales (None: not one token's)."""
    return staged.run_limits(codes_item, mla, ring, tail=4 * heads)


def fits(head_dim):
    """Whether heads of ``head_dim`` codes can be dequantised from a stage (whole 16-byte chunks)."""
    return head_dim % CHUNK == 0


def _build(src, dst, mla, codec, dtype, ring):
    copy_items = make_items_copy(src, dst, mla, "dequantise", codec, dtype)
    ops = codec_ops(codec, dtype)
    word, store_packed, takes = ops.dequantise_word, ops.store_chunk, ops.takes
    kinds = 1 if mla else 2
    layered = map_layout(src) is not LAYER_FIRST  # the layer is a coordinate of the maps
    src_lb, src_to, src_hs = src.layer_base, src.token_offset, src.head_stride
    dst_lb, dst_to, dst_hs = dst.layer_base, dst.token_offset, dst.head_stride

    @device_function
    def advance(i, r, step, per):
        """Position ``(i, r)`` (the warp's ``i``-th token of a piece, its ``r``-th unit of ``per``) moved on by
        ``step`` units: no division (``per`` is 16-128 for real caches, ``step`` a warp)."""
        r += step
        while r >= per:
            r -= per
            i += 1
        return i, r

    @device_function
    def scale_area(stage, count, codes_item):
        """Where a piece's scale area starts in its stage: after its K codes, the padding and its V codes
        (``staged.second_buffer``; no V for MLA). The loader (``fill_scales``) and the consumers (``take_piece``)
        both find it here."""
        second = 0
        if kinds == 2:
            second = staged.second_buffer(count, codes_item)
        return stage + second + count * codes_item

    @device_function
    def fill_scales(lane, stage, full, first, count, layer, args):
        """A bulk piece's scales into its scale area, tied to the piece's barrier ``full``: by the bulk unit, a
        box a kind, where there are ``scale_maps``, else by the loader's lanes, four bytes each (``copy4``). A
        piece's tokens are consecutive (``token0 + t``)."""
        (src_indices, dst_indices, _layer, src_token_limit, dst_token_limit, num_layers, heads, words, error_flag,
         src_k, src_v, src_item, src_dim, src_page, scales_k, scales_v, scales_item, scales_dim, dst_k, dst_v,
         dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim) = args[0]
        scale_maps, max_run_log2 = args[1], args[2]
        area = scale_area(stage, count, src_item)
        token0 = load_i64(src_indices + first * 8)
        if scale_maps != 0:
            if lane == 0:
                log2 = 0
                while (1 << log2) < count:  # a bulk piece is 2**log2 tokens
                    log2 += 1
                each = count * heads * 4  # one kind's scales: [token][head], as the box lands
                expect_bytes(full, kinds * each)  # the phase waits for these boxes too
                k_map = scale_maps + log2 * MAP_BYTES
                tensor_load(area, k_map, 0, 0, layer if layered else 0, token0, 0, full)
                if kinds == 2:
                    tensor_load(area + each, k_map + (max_run_log2 + 1) * MAP_BYTES, 0, 0, layer if layered else 0,
                                token0, 0, full)
            landed_arrive(full)  # every lane's arrival, as below (no copies of its own in flight)
            return
        per = count * heads  # one kind's scales of the piece, [token][head]
        stride = src_hs(scales_dim, scales_item, heads, src_page)
        for kind in range(kinds):
            at = src_lb(scales_k if kind == 0 else scales_v, layer, scales_dim, scales_item, heads, src_page)
            t = lane // heads  # once a piece; then by counting (advance)
            head = lane - t * heads
            u = lane
            while u < per:
                copy4(area + (kind * per + u) * 4,
                      at + src_to(token0 + t, scales_dim, scales_item, heads, src_page) + head * stride)
                t, head = advance(t, head, WARP_SIZE, heads)
                u += WARP_SIZE
        landed_arrive(full)

    @device_function
    def store_chunk(d, lo, hi, scale):
        """16 codes (``lo``, ``hi``) times ``scale`` as 32 bytes of plain values at ``d``: by the packed
        conversions, or by the exact element functions for NaN codes, e5m2 infinities and non-finite scales
        (which the packed ones do not take)."""
        if takes(scale, lo, hi):
            store_packed(d, lo, hi, scale)
        else:
            store_i64(d, word(lo & 0xFFFFFFFF, scale))
            store_i64(d + 8, word((lo >> 32) & 0xFFFFFFFF, scale))
            store_i64(d + 16, word(hi & 0xFFFFFFFF, scale))
            store_i64(d + 24, word((hi >> 32) & 0xFFFFFFFF, scale))

    @device_function
    def take_piece(lane, stage, full, parity, first, j, count, n, args):
        (src_indices, dst_indices, layer, src_token_limit, dst_token_limit, num_layers, heads, words, error_flag, src_k,
         src_v, src_item, src_dim, src_page, src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v,
         dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim) = args[0]
        second = staged.second_buffer(count, src_item)  # where V's codes start (unused for MLA: no V)
        area = scale_area(stage, count, src_item)
        staged.wait_phase(full, parity)  # codes and scales (fill_scales) have landed
        head_chunks = words >> 2  # a head's 16-code chunks (``words``: its 8-byte words of plain values)
        shift = 0
        while (1 << shift) < head_chunks:
            shift += 1
        whole = (1 << shift) == head_chunks  # a power of two: a chunk's head by a shift
        chunks = heads * head_chunks  # one kind's chunks of a token
        per_token = kinds * chunks
        total = (count - j + n - 1) // n * per_token
        d_stride = dst_hs(dst_dim, dst_item, heads, dst_page)
        k_layer = dst_lb(dst_k, layer, dst_dim, dst_item, heads, dst_page)
        v_layer = k_layer
        if kinds == 2:
            v_layer = dst_lb(dst_v, layer, dst_dim, dst_item, heads, dst_page)
        c = lane
        i, r = advance(0, lane, 0, per_token)
        token_i = -1
        d_token = 0
        while c < total:
            t = j + i * n
            if i != token_i:  # a new token: its destination offset
                d_token = dst_to(load_i64(dst_indices + (first + t) * 8), dst_dim, dst_item, heads, dst_page)
                token_i = i
            kind = 1 if r >= chunks else 0
            q = r - kind * chunks
            head = q >> shift if whole else q // head_chunks
            scale = load_shared_u32(area + ((kind * count + t) * heads + head) * 4)
            lo, hi = load_shared_i128(stage + kind * second + t * src_item + q * CHUNK)
            store_chunk((v_layer if kind else k_layer) + d_token + head * d_stride
                        + (q - head * head_chunks) * 2 * CHUNK, lo, hi, scale)
            c += WARP_SIZE
            i, r = advance(i, r, WARP_SIZE, per_token)

    @device_function
    def take_direct(lane, first, j, count, n, args):
        """Direct items and a register block's share: the register kernel's loop."""
        copy_items(lane, first, j, count, n, args[0])

    set_up, run_block = staged.make_ring(map_layout(src), mla, ring, fill_scales)(take_piece, take_direct)

    def dequantise_staged(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                          dst_token_limit, num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim,
                          src_page, src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v, dst_item,
                          dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim, maps,
                          max_run_log2, min_run, scale_maps):
        args = ((src_indices, dst_indices, first_layer, src_token_limit, dst_token_limit, num_layers, heads, words,
                error_flag, src_k, src_v, src_item, src_dim, src_page, src_scales_k, src_scales_v, src_scales_item,
                src_scales_dim, dst_k, dst_v, dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item,
                dst_scales_dim), scale_maps, max_run_log2)
        smem = cuda.shared.array(0, int64)
        set_up(smem, cuda.threadIdx.x, cuda.blockDim.x)
        cuda.syncthreads()
        run_block(smem, cuda.local.array(MAX_STAGES, int64), cuda.threadIdx.x, cuda.blockIdx.x,
                  cuda.blockDim.x, num_items, items_per_warp, src_indices, dst_indices, first_layer, src_token_limit,
                  dst_token_limit, src_page, maps, max_run_log2, min_run, src_item, args)

    check_parameters(dequantise_staged, StagedScaledArgs)
    dequantise_staged.__name__ = dequantise_staged.__qualname__ = (
        f"dequantise_staged_{kernel_name(codec, dtype, src, dst, mla)}")
    return kernel(dequantise_staged, max_registers=REGISTERS)


def get_kernel(src, dst, mla, codec=E4M3, dtype="bfloat16", ring=None):
    """The staged dequantising load from source layout ``src`` (one of ``SOURCES``) to any destination
    layout ``dst`` (``LayoutParts``), built on first request and memoised; ``ring``: a ``staged.StagedShape``
    (default ``SHAPE``; run with ``bulk_stores=False``)."""
    if src not in SOURCES:
        raise ValueError(f"no staged kernel from {getattr(src, 'name', src)} to {getattr(dst, 'name', dst)}")
    src, dst, mla, codec, dtype = codec_key(src, dst, mla, codec, dtype)
    ring = staged.check_ring(ring or SHAPE)._replace(bulk_stores=False)
    return memoised(_build, src, dst, mla, codec, dtype, ring)


def kernel_ptx(src, dst, mla, codec=E4M3, dtype="bfloat16", cc=(9, 0)):
    """PTX of one staged kernel (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(src, dst, mla, codec, dtype), SIGNATURE, cc)
