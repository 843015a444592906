"""The wide quantising kernel: quantising copies (backups) that issue every read of a pass before converting any,
and convert with the GPU's packed instructions. One memoised kernel per (source layout, destination layout, MLA,
codec, plain dtype, slots, head size), with the parameters (``ScaledArgs``), work split, index guard and results
of ``kernels.scaled_copy``'s, bit for bit.

Why: a backup runs on a few SMs while the model computes; a head at a time and an element's integer arithmetic
bind ``scaled_copy``'s kernels by latency and issue rate. Here:

- **Chunks.** A token's K and V heads of one layer are ``kinds * H * D / 16`` chunks of 16 elements. Lane ``i``
  takes chunks ``base + 32 k + i`` for ``k < slots`` and issues all their reads first (a pass). ``D / 16`` is a
  power of two up to 32, compiled in, so a head's chunks are an aligned group of lanes in one row of the pass.
- **Whole passes.** Where a kind's chunks fill whole passes, every chunk is in range and of one kind, so a lane's
  addresses are offsets fixed for the copy plus the pass's (``whole_pass``), read 16 bytes at once where
  aligned; other copies take ``general_pass``, whose passes may cross from K into V and end part-filled.
- **Quantise.** Each chunk's largest magnitude (``magnitudes``), the head's by shuffles; lane ``j`` computes pass
  head ``j``'s scale and inverse (lanes owning no head divide a plain value, so no division takes its slow
  path) and writes the scale; each chunk takes its inverse back by a shuffle and ``quantise8`` converts it.
- **The other heads.** A head with an infinity or NaN, a zero scale or an inverse that overflows: the warp sees
  it by a vote and moves that pass again with the exact element functions, in loops that stay loops.

``slots`` (``SLOTS``, at most ``D / 16``): the chunks a lane holds in registers; at four a 1024-thread block's
64 registers a thread spill.
"""
from numba import cuda, types

from ..quant.fp8 import E4M3
from .factory import codec_ops, memoised
from .fp8 import EXPONENT_MASK
from .item_copy import in_bounds
from .jit import WARP_SIZE, device_function, kernel
from .layouts import kv_layer_bases
from .memory import load_i128, load_i64
from .params import check_parameters
from .ptx import ptx_of
from .scaled_copy import SIGNATURE, ScaledArgs, codec_key, head_address, kernel_name
from .words import group_max, lane_value, store_i32, store_i64, store_pair, warp_any

SLOTS = 2  # chunks a lane keeps in flight (see the module docstring)
CHUNK = 16  # elements of a chunk
_PLAIN_MAGNITUDE = 0x3C00  # a normal magnitude in both dtypes: the amax of lanes that own no head


def slots_for(head_dim):
    """The slots of the wide kernel for heads of ``head_dim`` elements, 0 where it does not run
    (``head_dim / 16`` not a power of two up to 32)."""
    if head_dim % CHUNK:
        return 0
    per_head = head_dim // CHUNK
    if per_head > WARP_SIZE or per_head & (per_head - 1):
        return 0
    return min(SLOTS, per_head)


@device_function
def _chunk_address(chunk, shift, heads, k_base, v_base, stride, chunk_bytes):
    """Where a pass chunk (``chunk_bytes`` long; ``2**shift`` to a head) of a token's heads starts."""
    return (head_address(chunk >> shift, heads, k_base, v_base, stride)
            + (chunk & ((1 << shift) - 1)) * chunk_bytes)


@device_function
def _element(address, e):
    """Element ``e`` (bits) of the chunk of bfloat16/float16 at ``address``."""
    return (load_i64(address + 8 * (e >> 2)) >> (16 * (e & 3))) & 0xFFFF


def _make_exact_quantise(ops):
    """``exact(lane, base, total, shift, heads, rows, ...)``: a quantising pass element by element with the
    codec's exact functions (``ops``; every lane of the warp calls it). Its loops stay loops: one copy of
    the element function keeps the kernel's compile time short."""
    magnitude, scale_of, inverse_of, quantise = ops.magnitude, ops.scale_of, ops.inverse_of, ops.quantise

    @device_function
    def exact(lane, base, total, shift, heads, rows, sk, sv, s_stride, dk, dv, d_stride, fk, fv, f_stride):
        k = 0
        while k < rows:
            chunk = base + k * WARP_SIZE + lane
            valid = chunk < total
            src = 0
            dst = 0
            scale_at = -1
            if valid:
                src = _chunk_address(chunk, shift, heads, sk, sv, s_stride, 2 * CHUNK)
                dst = _chunk_address(chunk, shift, heads, dk, dv, d_stride, CHUNK)
                if chunk & ((1 << shift) - 1) == 0:  # a head's first chunk writes its scale
                    scale_at = head_address(chunk >> shift, heads, fk, fv, f_stride)
            m = 0
            e = 0
            while valid and e < CHUNK:
                m = max(m, magnitude(_element(src, e)))
                e += 1
            scale = scale_of(group_max(lane, m, 1 << shift))
            inverse = inverse_of(scale)
            low = 0
            high = 0
            e = 0
            while valid and e < CHUNK:
                code = quantise(_element(src, e), scale, inverse)
                if e < 8:
                    low |= code << (8 * e)
                else:
                    high |= code << (8 * (e - 8))
                e += 1
            if valid:
                store_i64(dst, low)
                store_i64(dst + 8, high)
            if scale_at >= 0:
                store_i32(scale_at, scale)
            k += 1

    return exact


def _make_passes(ops, dtype, slots, shift):
    """``(general_pass, whole_pass)`` for heads of ``2**shift`` chunks: each reads its pass's chunks, finds
    their heads' scales and, unless a head needs the exact functions (it then returns True having written
    nothing), writes codes and scales."""
    quantise8, magnitudes, scale_of, inverse_of = ops.quantise8, ops.magnitudes, ops.scale_of, ops.inverse_of
    non_finite = EXPONENT_MASK[dtype]
    held_words = 4 * slots  # a closure constant: a local array's size must be known when compiling
    width = 1 << shift  # a head's chunks: lanes of one row of the pass
    pass_heads = slots * WARP_SIZE >> shift
    head_step = WARP_SIZE >> shift  # heads from one row of the pass to the next

    @device_function
    def pass_scales(lane, held, owns):
        """``(scale, inverse, exact)`` for pass head ``lane`` (where ``owns``): each chunk's largest magnitude,
        its head's by shuffles, gathered at the lane of its pass head; ``exact``: some head of the warp's
        pass needs the exact functions. Lanes that own no head take a plain value (a zero one would send
        every division of the warp down its slow path)."""
        row = (lane << shift) >> 5  # pass head `lane` starts in this row, at lane `source`
        source = (lane << shift) & (WARP_SIZE - 1)
        amax = 0
        for k in range(slots):
            m = group_max(lane, magnitudes(held[4 * k], held[4 * k + 1], held[4 * k + 2], held[4 * k + 3]), width)
            m = lane_value(lane, m, source)
            if row == k:
                amax = m
        finite = amax < non_finite
        scale = scale_of(amax if finite and owns else (0 if owns else _PLAIN_MAGNITUDE))
        inverse = inverse_of(scale)
        return scale, inverse, warp_any(lane, owns and (not finite or inverse == 0))

    @device_function
    def quantise_chunk(held, k, head_inverse, address):
        store_pair(address, quantise8(held[4 * k], held[4 * k + 1], head_inverse),
                   quantise8(held[4 * k + 2], held[4 * k + 3], head_inverse))  # whole sectors where aligned

    @device_function
    def general_pass(lane, base, total, heads, sk, sv, s_stride, dk, dv, d_stride, fk, fv, f_stride):
        """Chunks ``base ..`` of a token's K and V heads, some past ``total`` or across K and V."""
        held = cuda.local.array(held_words, types.int64)
        for k in range(slots):  # every read first
            chunk = base + k * WARP_SIZE + lane
            for w in range(4):
                held[4 * k + w] = 0
            if chunk < total:
                address = _chunk_address(chunk, shift, heads, sk, sv, s_stride, 2 * CHUNK)
                for w in range(4):
                    held[4 * k + w] = load_i64(address + 8 * w)
        my_head = (base >> shift) + lane
        owns = lane < pass_heads and my_head < (total >> shift)
        scale, inverse, exact = pass_scales(lane, held, owns)
        if exact:
            return True
        for k in range(slots):
            chunk = base + k * WARP_SIZE + lane
            head_inverse = lane_value(lane, inverse, (k * WARP_SIZE + lane) >> shift)
            if chunk < total:
                quantise_chunk(held, k, head_inverse, _chunk_address(chunk, shift, heads, dk, dv, d_stride, CHUNK))
        if owns:
            store_i32(head_address(my_head, heads, fk, fv, f_stride), scale)
        return False

    @device_function
    def whole_pass(lane, base, per_kind, sk, sv, s_stride, s_lane, dk, dv, d_stride, d_lane, fk, fv, f_stride):
        """Chunks ``base ..`` of a token's K and V heads where a kind's ``per_kind`` chunks fill whole passes:
        every chunk is in range and of one kind, so a lane's addresses are its offsets ``s_lane``/``d_lane``
        plus the pass's; no chunk is checked."""
        kind = 1 if base >= per_kind else 0
        first_head = (base - kind * per_kind) >> shift
        held = cuda.local.array(held_words, types.int64)
        src = (sv if kind else sk) + first_head * s_stride + s_lane
        step = head_step * s_stride
        if ((src | step) & 15) == 0:  # every read first, 16 bytes at once (half the load instructions)
            for k in range(slots):
                for w in range(2):
                    held[4 * k + 2 * w], held[4 * k + 2 * w + 1] = load_i128(src + k * step + 16 * w)
        else:
            for k in range(slots):
                for w in range(4):
                    held[4 * k + w] = load_i64(src + k * step + 8 * w)
        scale, inverse, exact = pass_scales(lane, held, lane < pass_heads)
        if exact:
            return True
        dst = (dv if kind else dk) + first_head * d_stride + d_lane
        for k in range(slots):
            head_inverse = lane_value(lane, inverse, k * head_step + (lane >> shift))
            quantise_chunk(held, k, head_inverse, dst + k * head_step * d_stride)
        if lane < pass_heads:
            store_i32((fv if kind else fk) + (first_head + lane) * f_stride, scale)
        return False

    return general_pass, whole_pass


def _build_kernel(src, dst, mla, codec, dtype, slots, head_dim):
    shift = (head_dim // CHUNK).bit_length() - 1  # a head's chunks: 2**shift
    ops = codec_ops(codec, dtype)
    general_pass, whole_pass = _make_passes(ops, dtype, slots, shift)
    exact = _make_exact_quantise(ops)
    src_to, src_hs = src.token_offset, src.head_stride
    dst_to, dst_hs = dst.token_offset, dst.head_stride
    kinds = 1 if mla else 2
    src_bases, dst_bases = kv_layer_bases(src, kinds), kv_layer_bases(dst, kinds)
    width = 1 << shift
    pass_chunks = slots * WARP_SIZE

    def quantise_wide(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                      dst_token_limit, num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim, src_page,
                      src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v, dst_item, dst_dim,
                      dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        per_kind = heads << shift  # one kind's chunks of a token
        total = kinds * per_kind
        whole = per_kind % pass_chunks == 0  # every pass whole and of one kind: whole_pass
        s_stride = src_hs(src_dim, src_item, heads, src_page)
        d_stride = dst_hs(dst_dim, dst_item, heads, dst_page)
        f_stride = dst_hs(dst_scales_dim, dst_scales_item, heads, dst_page)  # the destination's scales
        s_lane = (lane >> shift) * s_stride + (lane & (width - 1)) * 2 * CHUNK  # a lane's chunk in a pass
        d_lane = (lane >> shift) * d_stride + (lane & (width - 1)) * CHUNK
        first = warp * items_per_warp
        count = min(items_per_warp, num_items - first)
        j = 0
        while j < count:
            s_tok = load_i64(src_indices + (first + j) * 8)
            d_tok = load_i64(dst_indices + (first + j) * 8)
            if in_bounds(lane, s_tok, d_tok, src_token_limit, dst_token_limit, error_flag):
                s_off = src_to(s_tok, src_dim, src_item, heads, src_page)
                d_off = dst_to(d_tok, dst_dim, dst_item, heads, dst_page)
                f_off = dst_to(d_tok, dst_scales_dim, dst_scales_item, heads, dst_page)
                for layer in range(first_layer, first_layer + num_layers):
                    sk, sv = src_bases(src_k, src_v, layer, src_dim, src_item, heads, src_page, s_off)
                    dk, dv = dst_bases(dst_k, dst_v, layer, dst_dim, dst_item, heads, dst_page, d_off)
                    fk, fv = dst_bases(dst_scales_k, dst_scales_v, layer, dst_scales_dim, dst_scales_item, heads,
                                       dst_page, f_off)
                    base = 0
                    while base < total:
                        if whole:
                            odd = whole_pass(lane, base, per_kind, sk, sv, s_stride, s_lane, dk, dv, d_stride, d_lane,
                                             fk, fv, f_stride)
                        else:
                            odd = general_pass(lane, base, total, heads, sk, sv, s_stride, dk, dv, d_stride, fk, fv,
                                               f_stride)
                        if odd:  # the pass again, exactly
                            exact(lane, base, total, shift, heads, min(slots, (total - base + WARP_SIZE - 1) >> 5),
                                  sk, sv, s_stride, dk, dv, d_stride, fk, fv, f_stride)
                        base += pass_chunks
            j += 1

    check_parameters(quantise_wide, ScaledArgs)
    quantise_wide.__name__ = quantise_wide.__qualname__ = (f"quantise_wide_{kernel_name(codec, dtype, src, dst, mla)}"
                                                           f"_{slots}_d{head_dim}")
    return kernel(quantise_wide, max_registers=64)


def get_kernel(src, dst, mla, codec=E4M3, dtype="bfloat16", slots=SLOTS, head_dim=128):
    """The wide kernel for one (source layout, destination layout, MLA, codec, plain dtype, slots, head size),
    built on first request and memoised; ``src``/``dst``: ``LayoutParts``; ``head_dim``: elements a head,
    16 * 2**k up to 512 (compiled in: a head's chunks go by constant shifts); ``slots`` up to ``head_dim / 16``."""
    src, dst, mla, codec, dtype = codec_key(src, dst, mla, codec, dtype)
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not slots_for(head_dim):
        raise ValueError(f"head_dim must be 16 * 2**k elements up to {CHUNK * WARP_SIZE}, got {head_dim!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= head_dim // CHUNK:
        raise ValueError(f"slots must be an int from 1 to head_dim / 16 = {head_dim // CHUNK}, got {slots!r}")
    return memoised(_build_kernel, src, dst, mla, codec, dtype, slots, head_dim)


def kernel_ptx(src, dst, mla, codec=E4M3, dtype="bfloat16", slots=SLOTS, cc=(9, 0), head_dim=128):
    """PTX of one wide kernel for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(src, dst, mla, codec, dtype, slots, head_dim), SIGNATURE, cc)
