"""The wide FP8 kernels: quantising copies (backups) that issue every read of a pass (``slots`` chunks a
lane, over a token's heads) before converting any, and convert with the GPU's packed instructions
(dequantising copies, loads: ``kernels.fp8_pipelined``). One memoised kernel per (source layout,
destination layout, MLA, mode, FP8 format, plain dtype, slots, head size); the same parameters (``Fp8Args``),
work split and index guard as ``kernels.fp8_copy``'s kernels, and the same results, bit for bit.

Why: a backup runs on ``block_quota`` SMs (2 or 4) while the model computes. ``fp8_copy``'s kernels
go one head at a time (256 bytes in flight a warp) and spend a division and a hundred integer instructions
an element, so they are bound by latency and by those SMs' issue rate. Here:

- **Chunks.** A token's K and V heads of one layer are ``kinds * H * D / 16`` chunks of 16 elements (32
  bytes of bfloat16/float16, 16 bytes of codes). Lane ``i`` takes chunks ``base + 32 k + i`` for ``k <
  slots``: it issues every read of its ``slots`` chunks before it uses one (a pass), then the next pass.
  ``D / 16`` must be a power of two up to 32 (``D`` = 16 ... 512), so a head's chunks are an aligned group
  of lanes in one row of the pass, and a pass holds at most 32 heads. ``D`` is compiled in: a chunk's head
  and the shuffles' groups go by constant shifts.
- **Whole passes.** Where a kind's ``H * D / 16`` chunks fill whole passes (8 heads of 128, say), each pass
  is of one kind and every chunk in range, so a lane's addresses are offsets fixed for the copy plus the
  pass's (``whole_pass``): no per-chunk head, kind or range arithmetic. Other copies (few heads) take
  ``general_pass``, whose passes may cross from K into V and end part-filled.
- **Quantise.** Each chunk's largest magnitude (``fp8_packed.magnitudes``), the group's maximum by
  shuffles; lane ``j`` gathers pass head ``j``'s and computes its scale and inverse (two divisions a lane
  for up to 32 heads; lanes that own no head divide a plain value, so no division takes its slow path),
  each chunk takes its head's inverse back by a shuffle, and ``fp8_packed.quantise8`` multiplies and
  converts 8 elements at a time, stored 16 bytes at once where the destination is 16-byte aligned. Lane
  ``j`` writes head ``j``'s scale.
- **The ring** (``ring=True``; the copies ``ring_takes``: whole passes, chunks on 16-byte boundaries). A warp
  keeps ``RING_STAGES`` passes in shared memory: a lane copies its chunks of the next pass there with 16-byte
  asynchronous copies (``async_copy.copy16``), with the pass's addresses, then converts the pass before, whose
  reads have landed meanwhile; no register holds a read in flight, so a pass's reads overlap the conversion
  of the one before. The walk carries each pass's addresses forward by adds. A lane reads back only the chunks
  it copied; the warp meets twice a pass, for the pass's addresses (lane 0 writes them). Codes go out in
  16-byte stores.
- **The other heads.** A head with an infinity or NaN, a zero scale or one whose inverse overflows: the
  warp sees it by a vote and moves that pass again with ``kernels.fp8``'s exact element functions, chunk by
  chunk, element by element, in loops that stay loops.

``slots`` (``SLOTS``, at most ``D / 16``): the chunks a lane holds, kept in registers. Two: at four, a
1024-thread block's 64 registers a thread spill, and an H200 ran the backup at 41 GB/s of bf16 against 50
(``scripts/RESULTS.md``). With 8 heads of 128, a token's K and V of one layer take two whole passes.
"""
from numba import cuda, int64, types

from . import fp8
from .async_copy import commit, copy16, load_shared_i64, store_shared_i64, waiter
from .fp8_copy import SIGNATURE, Fp8Args
from .fp8_memory import group_max, lane_value, store_i32, store_i64, store_i128, store_pair, warp_any
from .fp8_packed import magnitudes, packed_quantiser
from .item_copy import in_bounds, next_in_bounds
from .jit import WARP_SIZE, device_function, kernel
from .layouts import PAGE_FIRST, LayoutParts
from .memory import load_i64
from .params import check_parameters
from .ptx import ptx_of
from .tma import load_shared_i128, load_shared_u32, shared_address, store_shared_u32, sync_warp

SLOTS = 2  # chunks a lane keeps in flight (see the module docstring)
CHUNK = 16  # elements of a chunk
MODES = ("quantise",)  # loads: kernels.fp8_pipelined
_NON_FINITE = {"bfloat16": 0x7F80, "float16": 0x7C00}  # magnitude bits from here up: infinities and NaNs
_PLAIN_MAGNITUDE = 0x3C00  # a normal magnitude in both dtypes: the amax of lanes that own no head


def slots_for(mode, head_dim):
    """The slots of the wide kernel for ``mode`` and heads of ``head_dim`` elements, 0 where it does not
    run (loads and FP8 to FP8 copies, or ``head_dim / 16`` not a power of two up to 32)."""
    if mode not in MODES or head_dim % CHUNK:
        return 0
    per_head = head_dim // CHUNK
    if per_head > WARP_SIZE or per_head & (per_head - 1):
        return 0
    return min(SLOTS, per_head)


@device_function
def head_address(kinds_head, heads, k_base, v_base, stride):
    """Where head ``kinds_head`` of a token's heads starts: K's ``heads`` heads first, then V's."""
    kind = 1 if kinds_head >= heads else 0
    return (v_base if kind else k_base) + (kinds_head - kind * heads) * stride


@device_function
def _chunk_address(chunk, shift, heads, k_base, v_base, stride, chunk_bytes):
    """Where a pass chunk (``chunk_bytes`` long; ``2**shift`` to a head) of a token's heads starts."""
    return (head_address(chunk >> shift, heads, k_base, v_base, stride)
            + (chunk & ((1 << shift) - 1)) * chunk_bytes)


@device_function
def _element(address, e):
    """Element ``e`` (bits) of the chunk of bfloat16/float16 at ``address``."""
    return (load_i64(address + 8 * (e >> 2)) >> (16 * (e & 3))) & 0xFFFF


def _make_exact_quantise(fmt, dtype):
    """``exact(lane, base, total, shift, heads, rows, ...)``: a quantising pass element by element with
    ``kernels.fp8``'s exact functions (every lane of the warp calls it). Its loops stay loops: one copy of
    the element function keeps the kernel's compile time short."""
    magnitude, scale_of, inverse_of, quantise = fp8.quantiser(fmt, dtype)

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


def _make_passes(fmt, dtype, slots, shift, aligned=False, scales_shared=False):
    """``(general_pass, whole_pass, quantise_held)`` for heads of ``2**shift`` chunks: each reads its pass's
    chunks (``quantise_held``: has them), finds their heads' scales and, unless a head needs the exact
    functions (it then returns True having written nothing), writes codes and scales; ``aligned``: every
    chunk's codes start on a 16-byte boundary (one 16-byte store, no test); ``scales_shared``:
    ``quantise_held``'s ``scale_at`` is in shared memory (the ring's gathered scales)."""
    quantise8 = packed_quantiser(fmt, dtype)
    _, scale_of, inverse_of, _ = fp8.quantiser(fmt, dtype)
    non_finite = _NON_FINITE[dtype]
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

    store16 = store_i128 if aligned else store_pair
    store_scale = store_shared_u32 if scales_shared else store_i32

    @device_function
    def quantise_chunk(held, k, head_inverse, address):
        store16(address, quantise8(held[4 * k], held[4 * k + 1], head_inverse),
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
    def quantise_held(lane, held, dst, d_stride, scale_at):
        """A whole pass's codes and scales from its chunks in ``held``: ``dst``, where the lane's first chunk's
        codes go (its next ``head_step`` heads on); ``scale_at``, where pass head ``lane``'s scale goes. True,
        having written nothing, where a head needs the exact functions."""
        scale, inverse, exact = pass_scales(lane, held, lane < pass_heads)
        if exact:
            return True
        for k in range(slots):
            head_inverse = lane_value(lane, inverse, k * head_step + (lane >> shift))
            quantise_chunk(held, k, head_inverse, dst + k * head_step * d_stride)
        if lane < pass_heads:
            store_scale(scale_at, scale)
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
        for k in range(slots):  # every read first
            for w in range(4):
                held[4 * k + w] = load_i64(src + k * head_step * s_stride + 8 * w)
        return quantise_held(lane, held, (dv if kind else dk) + first_head * d_stride + d_lane, d_stride,
                             (fv if kind else fk) + (first_head + lane) * f_stride)

    return general_pass, whole_pass, quantise_held


def _make_layer_bases(src, dst, kinds):
    """``layer_bases(layer, heads, s_off, <source K, V, item, dim, page>, d_off, <destination's>, f_off,
    <scales' K, V, item, dim>) -> (sk, sv, dk, dv, fk, fv)``: where a token's K and V heads of ``layer`` start in
    the source, the destination's codes and its scales (``*_off``: the token's offsets; MLA: V's are K's)."""
    src_lb, dst_lb = src.layer_base, dst.layer_base

    @device_function
    def layer_bases(layer, heads, s_off, src_k, src_v, src_item, src_dim, src_page, d_off, dst_k, dst_v, dst_item,
                    dst_dim, dst_page, f_off, scales_k, scales_v, scales_item, scales_dim):
        sk = src_lb(src_k, layer, src_dim, src_item, heads, src_page) + s_off
        dk = dst_lb(dst_k, layer, dst_dim, dst_item, heads, dst_page) + d_off
        fk = dst_lb(scales_k, layer, scales_dim, scales_item, heads, dst_page) + f_off
        if kinds == 1:
            return sk, sk, dk, dk, fk, fk
        return (sk, src_lb(src_v, layer, src_dim, src_item, heads, src_page) + s_off,
                dk, dst_lb(dst_v, layer, dst_dim, dst_item, heads, dst_page) + d_off,
                fk, dst_lb(scales_v, layer, scales_dim, scales_item, heads, dst_page) + f_off)

    return layer_bases


def _build_kernel(src, dst, mla, mode, fmt, dtype, slots, head_dim):
    shift = (head_dim // CHUNK).bit_length() - 1  # a head's chunks: 2**shift
    general_pass, whole_pass, _ = _make_passes(fmt, dtype, slots, shift)
    exact = _make_exact_quantise(fmt, dtype)
    src_to, src_hs = src.token_offset, src.head_stride
    dst_to, dst_hs = dst.token_offset, dst.head_stride
    kinds = 1 if mla else 2
    layer_bases = _make_layer_bases(src, dst, kinds)
    width = 1 << shift
    pass_chunks = slots * WARP_SIZE

    def fp8_wide(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit, dst_token_limit,
                 num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim, src_page, src_scales_k,
                 src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v, dst_item, dst_dim, dst_page,
                 dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim):
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
                    sk, sv, dk, dv, fk, fv = layer_bases(
                        layer, heads, s_off, src_k, src_v, src_item, src_dim, src_page, d_off, dst_k, dst_v, dst_item,
                        dst_dim, dst_page, f_off, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim)
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

    check_parameters(fp8_wide, Fp8Args)
    fp8_wide.__name__ = fp8_wide.__qualname__ = (f"fp8_wide_{mode}_{fmt}_{dtype}_{src.name}_{dst.name}"
                                                 f"{'_mla' if mla else ''}_{slots}_d{head_dim}")
    return kernel(fp8_wide, max_registers=64)


RING_STAGES = 2  # passes of a warp's ring: one lands while the others convert (read when a ring kernel is built)
_HEADER = 32  # a stage's pass addresses (source, destination, scale: 24 bytes), on a 16-byte boundary


def ring_stage_bytes(slots):
    """Bytes of one stage of a warp's ring: the pass's chunks (``slots * 32`` of 32 bytes) and its three
    addresses (its first head's source, destination and scale)."""
    return slots * WARP_SIZE * 2 * CHUNK + _HEADER


GATHER = 1024  # bytes of scales a warp gathers a kind before it writes them (page-first destinations)


def ring_shared_bytes(slots=SLOTS, warps=32):
    """Dynamic shared memory a block of ``warps`` warps asks for: their rings, and where each warp gathers
    scales (two kinds' ``GATHER`` bytes and where each run starts and how long it is)."""
    return warps * (RING_STAGES * ring_stage_bytes(slots) + 2 * (GATHER + 16))


def ring_takes(heads, head_dim, slots, aligned):
    """Whether the ring kernel takes a quantising copy: a kind's chunks fill whole passes (``heads * head_dim /
    16`` a multiple of ``slots * 32``) and every chunk is 16-byte aligned at both ends (``aligned``: the
    source's buffers and the destination's codes start on 16-byte boundaries; their strides are multiples of
    16 bytes): its reads are 16-byte asynchronous copies, its stores 16-byte ones."""
    return bool(aligned) and slots_for("quantise", head_dim) >= slots >= 1 and (
        heads * (head_dim // CHUNK)) % (slots * WARP_SIZE) == 0


def _build_ring_kernel(src, dst, mla, mode, fmt, dtype, slots, head_dim):
    """The ring kernel: whole passes whose reads land in shared memory a pass ahead of their conversion."""
    shift = (head_dim // CHUNK).bit_length() - 1
    gather = dst is PAGE_FIRST  # a token's layers' scales lie side by side there: gathered, written as runs
    _, _, quantise_held = _make_passes(fmt, dtype, slots, shift, aligned=True, scales_shared=gather)
    exact = _make_exact_quantise(fmt, dtype)
    stages = RING_STAGES
    wait_steady, wait_all = waiter(stages - 1), waiter(0)
    src_to, src_hs = src.token_offset, src.head_stride
    dst_to, dst_hs = dst.token_offset, dst.head_stride
    kinds = 1 if mla else 2
    layer_bases = _make_layer_bases(src, dst, kinds)
    width = 1 << shift
    pass_chunks = slots * WARP_SIZE
    pass_heads = pass_chunks >> shift
    head_step = WARP_SIZE >> shift
    stage_bytes = ring_stage_bytes(slots)
    header = pass_chunks * 2 * CHUNK  # a stage's pass addresses start here
    half = WARP_SIZE * CHUNK  # bytes between the two halves of a row of chunks in a stage
    held_words = 4 * slots  # a closure constant: a local array's size must be known when compiling
    pass_scales_bytes = pass_heads * 4
    warp_bytes = stages * stage_bytes + 2 * (GATHER + 16)  # a warp's ring, then its runs of scales

    @device_function
    def flush(lane, runs, kind):
        """Writes the run of scales gathered for ``kind`` (its start and length at ``runs + 16 * kind``, its
        bytes from ``runs + 32 + GATHER * kind``) to global memory, the warp's 4-byte stores side by side."""
        start = load_shared_i64(runs + 16 * kind)
        length = load_shared_i64(runs + 16 * kind + 8)
        gathered = runs + 32 + GATHER * kind
        w = 4 * lane
        while w < length:
            store_i32(start + w, load_shared_u32(gathered + w))
            w += 4 * WARP_SIZE

    @device_function
    def issue(stage, lane, s_pass, d_pass, f_pass, kind, s_lane, s_stride):
        """The lane's chunks of the pass at ``s_pass`` into ``stage`` (each 16-byte half of a row of the pass
        contiguous there: no bank conflicts when it is read back); lane 0 writes the pass's addresses."""
        for k in range(slots):
            at = s_pass + s_lane + k * head_step * s_stride
            row = stage + 2 * k * half + CHUNK * lane
            copy16(row, at)
            copy16(row + half, at + CHUNK)
        if lane == 0:
            store_shared_i64(stage + header, s_pass)
            store_shared_i64(stage + header + 8, d_pass)
            store_shared_i64(stage + header + 16, f_pass)
            store_shared_i64(stage + header + 24, kind)

    @device_function
    def convert(stage, lane, d_lane, s_stride, d_stride, f_stride, runs):
        """Quantises the pass in ``stage``. Where scales are gathered, a pass's scales join its kind's run
        when they follow it (the same token's next layer, page-first), else the run is written and a new one
        starts: 32 bytes a pass written one by one would each be a partial line across PCIe."""
        held = cuda.local.array(held_words, types.int64)
        for k in range(slots):
            row = stage + 2 * k * half + CHUNK * lane
            held[4 * k], held[4 * k + 1] = load_shared_i128(row)
            held[4 * k + 2], held[4 * k + 3] = load_shared_i128(row + half)
        sync_warp()  # lane 0's addresses of the pass (and its runs) are seen by every lane
        d_pass = load_shared_i64(stage + header + 8)
        f_pass = load_shared_i64(stage + header + 16)
        scale_at = f_pass + lane * f_stride
        kind = start = length = 0
        if gather:
            kind = load_shared_i64(stage + header + 24)
            start = load_shared_i64(runs + 16 * kind)
            length = load_shared_i64(runs + 16 * kind + 8)
            if f_pass != start + length or length + pass_scales_bytes > GATHER:
                flush(lane, runs, kind)
                start = f_pass
                length = 0
            scale_at = runs + 32 + GATHER * kind + length + 4 * lane  # heads side by side: f_stride is 4
        if quantise_held(lane, held, d_pass + d_lane, d_stride, scale_at):
            s_pass = load_shared_i64(stage + header)  # the pass again from global memory, exactly; one kind
            exact(lane, 0, pass_chunks, shift, pass_heads, slots, s_pass, s_pass, s_stride, d_pass, d_pass,
                  d_stride, f_pass, f_pass, f_stride)  # its scales straight to global memory, outside the run
        else:
            length += pass_scales_bytes
        sync_warp()  # every lane has read the addresses and runs before lane 0 writes the next ones
        if gather and lane == 0:
            store_shared_i64(runs + 16 * kind, start)
            store_shared_i64(runs + 16 * kind + 8, length)

    def fp8_wide_ring(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                      dst_token_limit, num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim, src_page,
                      src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v, dst_item, dst_dim,
                      dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim):
        smem = cuda.shared.array(0, int64)
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        ring = shared_address(smem) + (cuda.threadIdx.x >> 5) * warp_bytes
        runs = ring + stages * stage_bytes
        if gather and lane == 0:
            for kind in range(2):  # no run yet
                store_shared_i64(runs + 16 * kind, 0)
                store_shared_i64(runs + 16 * kind + 8, 0)
        sync_warp()
        per_kind = heads << shift
        s_stride = src_hs(src_dim, src_item, heads, src_page)
        d_stride = dst_hs(dst_dim, dst_item, heads, dst_page)
        f_stride = dst_hs(dst_scales_dim, dst_scales_item, heads, dst_page)
        s_lane = (lane >> shift) * s_stride + (lane & (width - 1)) * 2 * CHUNK
        d_lane = (lane >> shift) * d_stride + (lane & (width - 1)) * CHUNK
        first = warp * items_per_warp
        count = min(items_per_warp, num_items - first)
        end_layer = first_layer + num_layers
        passes = per_kind // pass_chunks  # a kind's passes: whole, every chunk in range
        pass_s = pass_heads * s_stride  # from one pass of a kind to the next
        pass_d = pass_heads * d_stride
        pass_f = pass_heads * f_stride
        # The issuing walk over (item j, layer, kind, pass), set one pass before the first; it carries the
        # pass's source, destination and scale addresses forward (adds, no products) and V's from K's start.
        j = -1
        layer = end_layer - 1
        kind = kinds - 1
        step = passes - 1
        s_off = d_off = f_off = 0
        at_s = at_d = at_f = 0  # the pass's first head: source, destination, scale
        sv = dv = fv = 0
        more = True
        issued = converted = 0
        slot_in = slot_out = 0
        while True:
            if more:
                step += 1
                if step < passes:
                    at_s += pass_s
                    at_d += pass_d
                    at_f += pass_f
                else:
                    step = 0
                    kind += 1
                    if kind < kinds:  # V's passes of the layer
                        at_s = sv
                        at_d = dv
                        at_f = fv
                    else:
                        kind = 0
                        layer += 1
                        if layer >= end_layer:  # the next item whose indices are in bounds
                            layer = first_layer
                            j, s_tok, d_tok = next_in_bounds(lane, j + 1, count, first, src_indices, dst_indices,
                                                             src_token_limit, dst_token_limit, error_flag)
                            more = j < count
                            if more:
                                s_off = src_to(s_tok, src_dim, src_item, heads, src_page)
                                d_off = dst_to(d_tok, dst_dim, dst_item, heads, dst_page)
                                f_off = dst_to(d_tok, dst_scales_dim, dst_scales_item, heads, dst_page)
                        if more:
                            at_s, sv, at_d, dv, at_f, fv = layer_bases(
                                layer, heads, s_off, src_k, src_v, src_item, src_dim, src_page, d_off, dst_k, dst_v,
                                dst_item, dst_dim, dst_page, f_off, dst_scales_k, dst_scales_v, dst_scales_item,
                                dst_scales_dim)
                if more:
                    issue(ring + slot_in * stage_bytes, lane, at_s, at_d, at_f, kind, s_lane, s_stride)
                    slot_in = slot_in + 1 if slot_in + 1 < stages else 0
                    issued += 1
            commit()  # one group an iteration, empty or not: pass q is group q
            if more and issued - converted < stages:
                continue
            if converted == issued:
                break
            if more:
                wait_steady()  # pass `converted` was committed stages - 1 groups ago
            else:
                wait_all()
            convert(ring + slot_out * stage_bytes, lane, d_lane, s_stride, d_stride, f_stride, runs)
            slot_out = slot_out + 1 if slot_out + 1 < stages else 0
            converted += 1
        if gather:  # the runs still gathered
            sync_warp()
            for kind in range(kinds):
                flush(lane, runs, kind)

    check_parameters(fp8_wide_ring, Fp8Args)
    fp8_wide_ring.__name__ = fp8_wide_ring.__qualname__ = (f"fp8_wide_ring_{mode}_{fmt}_{dtype}_{src.name}_{dst.name}"
                                                           f"{'_mla' if mla else ''}_{slots}_d{head_dim}")
    return kernel(fp8_wide_ring, max_registers=64)


_kernels: dict = {}


def get_kernel(src, dst, mla, mode, fmt="e4m3", dtype="bfloat16", slots=SLOTS, head_dim=128, ring=False):
    """The wide kernel for one (source layout, destination layout, MLA, mode, format, plain dtype, slots, head
    size, ring), built on first request and memoised; ``src``/``dst``: ``LayoutParts``; ``head_dim``: elements a
    head, 16 * 2**k up to 512 (compiled in: a head's chunks go by constant shifts); ``slots`` up to ``head_dim /
    16``; ``ring``: the ring kernel, for copies it takes (``ring_takes``), launched with ``ring_shared_bytes``
    of dynamic shared memory."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not (isinstance(src, LayoutParts) and isinstance(dst, LayoutParts)):
        raise TypeError("src and dst must be kvnumba.kernels.layouts.LayoutParts")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not slots_for(mode, head_dim):
        raise ValueError(f"head_dim must be 16 * 2**k elements up to {CHUNK * WARP_SIZE}, got {head_dim!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= head_dim // CHUNK:
        raise ValueError(f"slots must be an int from 1 to head_dim / 16 = {head_dim // CHUNK}, got {slots!r}")
    key = (src, dst, bool(mla), mode, fp8.fp8_format(fmt).name, fp8.plain_dtype(dtype), slots, head_dim)
    key += (RING_STAGES if ring else 0,)  # the ring's stages are compiled in
    built = _kernels.get(key)
    if built is None:
        built = _kernels[key] = (_build_ring_kernel if ring else _build_kernel)(*key[:-1])
    return built


def kernel_ptx(src, dst, mla, mode, fmt="e4m3", dtype="bfloat16", slots=SLOTS, cc=(9, 0), head_dim=128, ring=False):
    """PTX of one wide kernel for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(src, dst, mla, mode, fmt, dtype, slots, head_dim, ring), SIGNATURE, cc)
