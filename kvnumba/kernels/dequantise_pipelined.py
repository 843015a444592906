"""The pipelined load: a dequantising copy (codes and scales to bfloat16/float16) whose reads land in shared
memory by per-thread asynchronous copies (``kernels.async_copy``), a pass ahead of the conversion. One memoised
kernel per (source layout, destination layout, MLA, codec, plain dtype, head size, whole passes), with the
parameters (``scaled_copy.ScaledArgs``), work split, index guard and results of ``kernels.scaled_copy``'s.

Why: a load reads pinned host memory across PCIe, a round trip of microseconds; a register kernel holds its reads
in registers while it waits. Once the reads are in flight the kernel is bound by the instructions it issues, so
the per-granule work is kept small: the head size is compiled in, a head's scale is copied once a pass, and a
granule's destination address is found once, when its codes are copied.

Granules: a token's K and V heads of one layer are ``kinds * H * D / 8`` granules of 8 codes (``D / 8`` a power
of two: ``takes``). A pass is ``PASS`` granules: lane ``i`` takes granules ``base + 32 k + i`` for ``k <
PER_LANE``. Each warp walks its passes (item, layer, base) twice, ``STAGES - 1`` passes apart:

- **issue**: a lane copies each granule's 8 codes into the pass's stage of the warp's ring (``copy8``) and
  writes its destination address there (0: none); lanes ``j < PASS / (D / 8)`` copy the scale of the pass's
  head ``j`` (``copy4``); then ``commit``;
- **convert**: once the pass has landed (``waiter``) and the warp has met (a lane reads scales others copied),
  a lane converts its granules with the codec's packed instructions (``kernels.fp8``), or its exact element
  functions for a granule with a NaN code, an e5m2 infinity or a non-finite scale, and stores 16 bytes each;
  the warp meets again before the stage is refilled.

**Whole passes** (``takes_whole``: a head of at most 32 granules, and one kind's granules of a token fill whole
passes): every granule of a pass is in range and of one kind, so a lane's addresses are offsets fixed for the
copy plus the pass's first head's; a stage keeps no address a granule, only the pass's first, and a warp's ring
holds ``WHOLE_STAGES`` passes in less shared memory (``shared_bytes``). Needs sm_90 for the packed conversions.
"""
import numbers

from numba import cuda, int64

from ..quant.fp8 import E4M3
from .async_copy import commit, copy4, copy8, load_shared_i64, store_shared_i64, waiter
from .factory import codec_ops, memoised
from .jit import WARP_SIZE, device_function, kernel
from .layouts import kv_layer_bases
from .params import check_parameters
from .ptx import ptx_of
from .scaled_copy import SIGNATURE, ScaledArgs, codec_key, head_address, kernel_name, next_item
from .tma import load_shared_u32, shared_address, sync_warp
from .words import store_pair

GRANULE = 8  # codes a lane copies and converts at once
PER_LANE = 4  # granules a lane holds a pass
PASS = PER_LANE * WARP_SIZE
STAGES = 2  # passes of a warp's ring: one lands while the other converts (more measured no faster)
_CODES, _SCALES, _TARGETS = 0, 8 * PASS, 12 * PASS  # a stage's parts, bytes from its start
STAGE_BYTES = _TARGETS + 8 * PASS  # codes, scales (a head's once), and each granule's destination address
WHOLE_STAGES = 2  # passes of a warp's ring in whole passes (3 and 4 measured no faster)
MAX_WARPS = 32  # the most warps of a block a call may ask for (launch.MAX_WARPS)
SHARED_BYTES = MAX_WARPS * STAGES * STAGE_BYTES  # the most any of these kernels asks for


def takes_whole(heads, head_dim):
    """Whether a copy of ``heads`` heads of ``head_dim`` codes goes in whole passes: a head is at most 32
    granules (a row of lanes holds whole heads) and one kind's granules of a token fill whole passes, so
    every granule of a pass is in range, of one kind and at an offset fixed for the copy plus the pass's."""
    granules = head_dim // GRANULE
    return takes(head_dim) and granules <= WARP_SIZE and (heads * granules) % PASS == 0


def _whole_layout(head_dim):
    """``(scales, destination, stage bytes)`` of a whole-pass stage: the pass's codes, its heads' scales, then
    the address of its first head in the destination (8 bytes, for the whole pass)."""
    scales = 8 * PASS
    destination = (scales + 4 * (PASS // (head_dim // GRANULE)) + 7) & ~7
    return scales, destination, (destination + 8 + 15) & ~15


def shared_bytes(heads, head_dim):
    """The dynamic shared memory a block of the kernel for ``heads`` heads of ``head_dim`` codes asks for."""
    if takes_whole(heads, head_dim):
        return MAX_WARPS * WHOLE_STAGES * _whole_layout(head_dim)[2]
    return SHARED_BYTES


def takes(head_dim):
    """Whether the kernel takes heads of ``head_dim`` codes: ``head_dim / 8`` a power of two."""
    granules = head_dim // GRANULE
    return head_dim % GRANULE == 0 and granules > 0 and granules & (granules - 1) == 0


def _make_stage_ops(ops, shift):
    dequantise4, exact4, special = ops.dequantise4, ops.dequantise_word, ops.special
    mask = (1 << shift) - 1  # a head's granules: 2**shift, compiled in (shifts and masks by constants)
    heads_a_pass = max(PASS >> shift, 1)  # the heads a pass's granules fall in (a head of more: 1)
    scale_rows = (heads_a_pass + WARP_SIZE - 1) // WARP_SIZE
    long_heads = PASS < (1 << shift)  # a head longer than a pass: a pass may start inside one

    @device_function
    def issue(stage, lane, base, kinds_heads, heads, sk, sv, s_stride, fk, fv, f_stride, dk, dv, d_stride):
        first_head = base >> shift
        for k in range(PER_LANE):
            i = k * WARP_SIZE + lane
            at = (base & mask) + i if long_heads else i  # granule `at` of head first_head
            head = first_head + (at >> shift)
            target = 0  # no granule: convert skips it
            if head < kinds_heads:
                copy8(stage + _CODES + 8 * i, head_address(head, heads, sk, sv, s_stride) + (at & mask) * GRANULE)
                target = head_address(head, heads, dk, dv, d_stride) + (at & mask) * 2 * GRANULE
            store_shared_i64(stage + _TARGETS + 8 * i, target)
        for r in range(scale_rows):  # a head's scale once a pass: slot j holds head first_head + j's
            slot = r * WARP_SIZE + lane
            head = first_head + slot
            if slot < heads_a_pass and head < kinds_heads:
                copy4(stage + _SCALES + 4 * slot, head_address(head, heads, fk, fv, f_stride))

    @device_function
    def convert_granule(codes, scale, address):
        """8 codes times their head's scale, 16 bytes at ``address``: packed, or with the exact element
        functions where a code is NaN (e5m2: or infinite) or the scale is not finite."""
        if (scale & 0x7F800000) == 0x7F800000 or special(codes):
            low = exact4(codes & 0xFFFFFFFF, scale)
            high = exact4((codes >> 32) & 0xFFFFFFFF, scale)
        else:
            low = dequantise4(codes, scale)
            high = dequantise4(codes >> 32, scale)
        store_pair(address, low, high)

    @device_function
    def convert(stage, lane):
        for k in range(PER_LANE):
            i = k * WARP_SIZE + lane
            address = load_shared_i64(stage + _TARGETS + 8 * i)
            if address != 0:
                scale = load_shared_u32(stage + _SCALES + 4 * (i >> shift))  # a pass's heads from slot 0
                convert_granule(load_shared_i64(stage + _CODES + 8 * i), scale, address)

    # Whole passes (``takes_whole``): granule `32 k + lane` of a pass is granule `lane & mask` of the pass's
    # head `k * head_step + (lane >> shift)`, so a lane's addresses are its offset plus the pass's first head's
    # and `k` steps of `head_step` heads; nothing is checked or kept a granule.
    scales_at, first_at, _ = _whole_layout(GRANULE << shift)
    head_step = max(WARP_SIZE >> shift, 1)

    @device_function
    def issue_whole(stage, lane, base, per_kind, sk, sv, s_stride, fk, fv, f_stride, dk, dv, d_stride):
        kind = 1 if base >= per_kind else 0
        first_head = (base - kind * per_kind) >> shift
        src = (sv if kind else sk) + (first_head + (lane >> shift)) * s_stride + (lane & mask) * GRANULE
        for k in range(PER_LANE):
            copy8(stage + 8 * (k * WARP_SIZE + lane), src + k * head_step * s_stride)
        scales = (fv if kind else fk) + first_head * f_stride
        for r in range(scale_rows):
            slot = r * WARP_SIZE + lane
            if slot < heads_a_pass:
                copy4(stage + scales_at + 4 * slot, scales + slot * f_stride)
        if lane == 0:  # the others read it after the warp meets
            store_shared_i64(stage + first_at, (dv if kind else dk) + first_head * d_stride)

    @device_function
    def convert_whole(stage, lane, d_stride):
        dst = load_shared_i64(stage + first_at) + (lane >> shift) * d_stride + (lane & mask) * 2 * GRANULE
        for k in range(PER_LANE):
            i = k * WARP_SIZE + lane
            scale = load_shared_u32(stage + scales_at + 4 * (i >> shift))
            convert_granule(load_shared_i64(stage + _CODES + 8 * i), scale, dst + k * head_step * d_stride)

    return issue, convert, issue_whole, convert_whole


def _build_kernel(src, dst, mla, codec, dtype, head_dim, whole):
    shift = (head_dim // GRANULE).bit_length() - 1
    issue, convert, issue_whole, convert_whole = _make_stage_ops(codec_ops(codec, dtype), shift)
    stages, stage_bytes = (WHOLE_STAGES, _whole_layout(head_dim)[2]) if whole else (STAGES, STAGE_BYTES)
    wait_steady, wait_all = waiter(stages - 1), waiter(0)
    src_to, src_hs = src.token_offset, src.head_stride
    dst_to, dst_hs = dst.token_offset, dst.head_stride
    kinds = 1 if mla else 2
    src_bases, dst_bases = kv_layer_bases(src, kinds), kv_layer_bases(dst, kinds)

    def dequantise_pipelined(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                             dst_token_limit, num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim,
                             src_page, src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v,
                             dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim):
        smem = cuda.shared.array(0, int64)
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        ring = shared_address(smem) + (cuda.threadIdx.x >> 5) * (stages * stage_bytes)
        kinds_heads = kinds * heads
        per_kind = heads << shift
        total = kinds_heads << shift
        first = warp * items_per_warp
        count = min(items_per_warp, num_items - first)
        end_layer = first_layer + num_layers
        # The issuing walk over (item j, layer, base), set one pass before the first.
        j = -1
        layer = end_layer - 1
        base = total - PASS
        s_off = s_stride = d_off = d_stride = f_off = f_stride = 0
        sk = sv = dk = dv = fk = fv = 0
        more = True
        issued = converted = 0
        slot_in = slot_out = 0
        while True:
            if more:
                base += PASS
                if base >= total:
                    base = 0
                    layer += 1
                    if layer >= end_layer:  # the next item whose indices are in bounds
                        layer = first_layer
                        j, s_tok, d_tok = next_item(lane, first, j + 1, count, src_indices, dst_indices,
                                                    src_token_limit, dst_token_limit, error_flag)
                        more = j < count
                        if more:
                            s_off = src_to(s_tok, src_dim, src_item, heads, src_page)
                            s_stride = src_hs(src_dim, src_item, heads, src_page)
                            d_off = dst_to(d_tok, dst_dim, dst_item, heads, dst_page)
                            d_stride = dst_hs(dst_dim, dst_item, heads, dst_page)
                            f_off = src_to(s_tok, src_scales_dim, src_scales_item, heads, src_page)
                            f_stride = src_hs(src_scales_dim, src_scales_item, heads, src_page)
                    if more:
                        sk, sv = src_bases(src_k, src_v, layer, src_dim, src_item, heads, src_page, s_off)
                        dk, dv = dst_bases(dst_k, dst_v, layer, dst_dim, dst_item, heads, dst_page, d_off)
                        fk, fv = src_bases(src_scales_k, src_scales_v, layer, src_scales_dim, src_scales_item, heads,
                                           src_page, f_off)
                if more:
                    if whole:
                        issue_whole(ring + slot_in * stage_bytes, lane, base, per_kind, sk, sv, s_stride, fk, fv,
                                    f_stride, dk, dv, d_stride)
                    else:
                        issue(ring + slot_in * stage_bytes, lane, base, kinds_heads, heads, sk, sv, s_stride, fk,
                              fv, f_stride, dk, dv, d_stride)
                    slot_in = slot_in + 1 if slot_in + 1 < stages else 0
                    issued += 1
            commit()  # one group an iteration, empty or not: pass q is group q
            if more and issued - converted < stages:
                continue
            if converted == issued:
                break
            if more:
                wait_steady()  # pass `converted` was committed STAGES - 1 groups ago
            else:
                wait_all()
            sync_warp()  # the pass's scales, copied by some lanes, are seen by every lane
            if whole:
                convert_whole(ring + slot_out * stage_bytes, lane, d_stride)
            else:
                convert(ring + slot_out * stage_bytes, lane)
            sync_warp()  # every lane has read the stage's scales before the next pass's copies land there
            slot_out = slot_out + 1 if slot_out + 1 < stages else 0
            converted += 1

    check_parameters(dequantise_pipelined, ScaledArgs)
    dequantise_pipelined.__name__ = dequantise_pipelined.__qualname__ = (
        f"dequantise_pipelined_{kernel_name(codec, dtype, src, dst, mla)}_d{head_dim}{'_whole' if whole else ''}")
    return kernel(dequantise_pipelined, max_registers=64)


def get_kernel(src, dst, mla, codec=E4M3, dtype="bfloat16", head_dim=128, whole=False):
    """The pipelined kernel for one (source layout, destination layout, MLA, codec, plain dtype, head size,
    whole passes), built on first request and memoised; ``src``/``dst``: ``LayoutParts``; ``head_dim``:
    elements a head, one that ``takes`` (compiled in: a head's granules found by constant shifts and masks);
    ``whole``: the copy's heads ``takes_whole`` (its walk then keeps no per-granule state). Launch it with
    ``shared_bytes(heads, head_dim)`` of dynamic shared memory and at most ``MAX_WARPS`` warps a block."""
    src, dst, mla, codec, dtype = codec_key(src, dst, mla, codec, dtype)
    if not isinstance(head_dim, numbers.Integral) or isinstance(head_dim, bool) or not takes(int(head_dim)):
        raise ValueError(f"head_dim must be 8 * 2**k elements, got {head_dim!r}")
    if whole and int(head_dim) > GRANULE * WARP_SIZE:
        raise ValueError(f"whole passes take heads of at most {GRANULE * WARP_SIZE} codes, got {head_dim!r}")
    return memoised(_build_kernel, src, dst, mla, codec, dtype, int(head_dim), bool(whole))


def kernel_ptx(src, dst, mla, codec=E4M3, dtype="bfloat16", cc=(9, 0), head_dim=128, whole=False):
    """PTX of one pipelined kernel for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(src, dst, mla, codec, dtype, head_dim, whole), SIGNATURE, cc)
