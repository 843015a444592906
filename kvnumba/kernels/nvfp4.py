"""The NVFP4 kernels of ``kv.copy``: bfloat16/float16 tokens into vLLM's NVFP4 pages, out of them, and pages to
pages; one memoised kernel per (mode, plain side's layout, NVFP4 sides' orders, plain dtype, ``D/16``). Loads
take ``kernels.nvfp4_load`` where it runs; its conversion is this module's.

The format is ``kvnumba.quant.nvfp4``'s. A group's 16 elements convert in ``kernels.nvfp4_packed``'s branch-free
PTX wherever it applies (every group of magnitudes below 0x7C00 with a finite ``out`` when quantising, every
scale but NaN's when dequantising); the rest go element by element with the reference's rounding. A warp takes
one token item, then every layer, K and V together; lane ``i`` takes groups ``i, i + 32, ...`` of a side's
``H * D/16`` (32 bytes of bfloat16, 8 bytes of codes, one scale byte), and four lanes' scales go out as one
4-byte word (hence ``D`` a multiple of 64).

An NVFP4 side is a table of its layers' addresses (``*_table``), its page bytes and block size; token ``t``
of head ``h`` sits at slot ``t * H + h`` (NHD) or ``h * block + t`` (HND) of its side's regions.
"""
from collections import namedtuple
from typing import Any, NamedTuple

from numba import cuda

from ..quant.fp8 import CANONICAL_NAN, plain_dtype
from ..quant.nvfp4 import RCP6
from .fp8 import EXPONENT_MASK, ONE_BITS, bf16_from_f32, f32_bits_of, magnitudes, narrow
from .words import f32_bits, f32_div, f32_from_bits, f32_mul, lane_value, load_i32, store_i32, store_i64, store_pair
from .factory import memoised
from .item_copy import in_bounds
from .jit import WARP_SIZE, device_function, kernel
from .memory import load_i64, load_i128
from .nvfp4_packed import NEVER, THRESHOLDS, decoder, encoder, unit_decoder
from .params import check_parameters, signature
from .ptx import ptx_of
from .resident import RESIDENT_EXTRA, layer_landed

MODES = ("quantise", "dequantise", "copy")
NAN_F32 = 0x7FC00000
RCP6_BITS = f32_bits_of(RCP6)
TWO_120_BITS = f32_bits_of(2.0**120)
TWO_112_BITS = f32_bits_of(2.0**112)
TWO_14_BITS = f32_bits_of(2.0**14)
V_ROWS = 128 * 4 * THRESHOLDS  # bytes of K's rows in the threshold table
SIGN_NIBBLES = 0x8888888888888888 - (1 << 64)  # every code's sign bit, as an int64


class Nvfp4Args(NamedTuple):
    """The NVFP4 kernels' parameters, in order. ``plain_*``: the bfloat16 side (a buffer or table, as
    ``kernels.scaled_copy``'s); ``src_table``/``dst_table``: an NVFP4 side's layer addresses (0: plain side).
    ``k_scale``/``v_scale``: float32 bits, quantising ``1 / global_scale``, dequantising ``global_scale``;
    ``k_unscale``/``v_unscale``: ``rcp(1 / global_scale)`` (quantising only)."""

    src_indices: int
    dst_indices: int
    num_items: int
    items_per_warp: int
    first_layer: int
    src_token_limit: int
    dst_token_limit: int
    num_layers: int
    heads: int
    groups: int  # D / 16
    error_flag: int
    plain_k: int
    plain_v: int
    plain_item: int
    plain_dim: int
    plain_page: int
    src_table: int
    src_page_bytes: int
    src_block: int
    dst_table: int
    dst_page_bytes: int
    dst_block: int
    k_scale: int
    v_scale: int
    k_unscale: int
    v_unscale: int
    thresholds: int  # quantising: nvfp4_packed.threshold_table's rows on the device (K's, then V's)


SIGNATURE = signature(Nvfp4Args)
ResidentArgs = namedtuple("ResidentArgs", Nvfp4Args._fields + RESIDENT_EXTRA)  # type: ignore[misc]  # computed
RESIDENT_SIGNATURE = signature(ResidentArgs)  # the resident loader's NVFP4 build (get_kernel(..., resident=True))

E2M1_UP = (0x3E800000, 0x3FA00000, 0x40200000, 0x40A00000)  # 0.25, 1.25, 2.5, 5: ties below go to even
E2M1_AT = (0x3F400000, 0x3FE00000, 0x40600000)  # 0.75, 1.75, 3.5: ties from here go up, to even


@device_function
def rcp(bits):
    """float32 ``1 / x`` with subnormals flushed to zero, input and result (``rcp.approx.ftz``'s contract)."""
    if (bits & 0x7F800000) == 0:
        return (bits & 0x80000000) | 0x7F800000
    r = f32_div(ONE_BITS, bits)
    if (r & 0x7F800000) == 0:
        return r & 0x80000000
    return r


@device_function
def e2m1_code(p):
    """The e2m1 code of float32 bits ``p``: to nearest even by the thresholds of the reference (magnitudes compare
    as their bits do), saturated; NaN (above every threshold) -> 7."""
    a = p & 0x7FFFFFFF
    m = 0
    for t in E2M1_UP:
        if a > t:
            m += 1
    for t in E2M1_AT:
        if a >= t:
            m += 1
    if a > 0x7F800000:
        return 7
    return ((p >> 28) & 8) | m


@device_function
def e2m1_bits(c):
    """float32 bits of e2m1 code ``c``."""
    m = c & 7
    bits = 0
    if m == 1:
        bits = 0x3F000000
    elif m > 1:
        bits = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    return ((c & 8) << 28) | bits


@device_function
def side_base(table, layer, tok, page_bytes, block, kind):
    """Where side ``kind`` (0: K, 1: V) of token ``tok``'s page of ``layer`` starts (``table``: the layers'
    addresses)."""
    return load_i64(table + layer * 8) + (tok // block) * page_bytes + kind * (page_bytes >> 1)


def slot_of(hnd):
    """``slot(t, h, heads, block)``: a token's head's slot in its side's regions."""
    if hnd:
        @device_function
        def slot(t, h, heads, block):
            return h * block + t
    else:
        @device_function
        def slot(t, h, heads, block):
            return t * heads + h
    return slot


@device_function
def fetch_plain(active, plain):
    """A group's 32 bytes of bfloat16/float16 (four 8-byte words), zeros for an idle lane: two 16-byte loads where
    ``plain`` is 16-byte aligned (half the load instructions, whole sectors)."""
    if active:
        if (plain & 15) == 0:
            w0, w1 = load_i128(plain)
            w2, w3 = load_i128(plain + 16)
            return w0, w1, w2, w3
        return load_i64(plain), load_i64(plain + 8), load_i64(plain + 16), load_i64(plain + 24)
    return 0, 0, 0, 0


@device_function
def fetch_codes(active, data, scale):
    """A group's 8 bytes of codes and the 4-byte word of scales holding its own, zeros for an idle lane."""
    if active:
        return load_i64(data), load_i32(scale)
    return 0, 0


@device_function
def e4m3_bits(code):
    """float32 bits of e4m3fn ``code``, branch-free: its magnitude bits placed as a float32's top exponent and
    mantissa bits are ``2**-120`` times its value, normal or subnormal alike (the product is exact: no flush to
    zero); ``0x7F`` (NaN) gives the quiet NaN, with the code's sign."""
    magnitude = code & 0x7F
    bits = NAN_F32 if magnitude == 0x7F else f32_mul(magnitude << 20, TWO_120_BITS)
    return ((code & 0x80) << 24) | bits


@device_function
def e4m3_code(sf):
    """The e4m3fn code of float32 bits ``sf`` (>= 0, not NaN: a group's scale), to nearest even, saturated at 448,
    branch-free: below 2**-6 (e4m3's subnormals and its first normal) ``sf + 2**14`` rounds in e4m3's steps of
    2**-9 and its bits less those of 2**14 are the code; from there the bits rounded to three mantissa bits,
    rebiased."""
    small = f32_bits(f32_from_bits(sf) + f32_from_bits(TWO_14_BITS)) - TWO_14_BITS
    big = min(((sf + 0x7FFFF + ((sf >> 20) & 1)) >> 20) - 960, 0x7E)
    return small if sf < 0x3C800000 else big


def plain_bits_of(name):
    """``bits(b)``: float32 bits of bfloat16/float16 bits ``b``, branch-free (float16's finite ones as
    ``e4m3_bits``: its magnitude bits placed in a float32's are ``2**-112`` times its value)."""
    if name == "bfloat16":
        @device_function
        def bits(b):
            return b << 16
    else:
        @device_function
        def bits(b):
            m = b & 0x7FFF
            value = f32_mul(m << 13, TWO_112_BITS) if m < 0x7C00 else (0x7F800000 if m == 0x7C00 else NAN_F32)
            return ((b & 0x8000) << 16) | value
    return bits


def group_ops(dtype):
    """``(encode, decode)`` device functions of one lane's group of 16 elements of ``dtype``: ``encode`` quantises
    the group's words (``fetch_plain``) into 8 bytes of codes at ``data`` and, from lanes of ``g % 4 == 0``, four
    lanes' scales as one word at ``scale`` (every lane calls it, ``active`` or not: the scales' shuffles;
    ``table``: the side's rows of ``nvfp4_packed.threshold_table``); ``decode`` dequantises ``fetch_codes``'s
    values into the group's 32 bytes at ``plain``. Both take the packed conversions where they apply.
    """
    name = plain_dtype(dtype)
    plain_bits = plain_bits_of(name)
    to_plain = bf16_from_f32 if name == "bfloat16" else narrow("float16")
    encode16, decode4, decode4_unit = encoder(), decoder(name), unit_decoder(name)
    nan_out = CANONICAL_NAN[name]
    exponent_mask = EXPONENT_MASK[name]

    @device_function
    def exact_max(w0, w1, w2, w3):
        """The largest magnitude bits, NaN ignored (``__hmax``); -1 if every element is NaN."""
        m = -1
        for k in range(16):
            w = w0 if k < 4 else w1 if k < 8 else w2 if k < 12 else w3
            a = (w >> (16 * (k & 3))) & 0x7FFF
            if a <= exponent_mask:
                m = max(m, a)
        return m

    @device_function
    def exact_codes(w0, w1, w2, w3, out):
        word = 0
        for k in range(16):
            w = w0 if k < 4 else w1 if k < 8 else w2 if k < 12 else w3
            word |= e2m1_code(f32_mul(plain_bits((w >> (16 * (k & 3))) & 0xFFFF), out)) << (4 * k)
        return word

    @device_function
    def encode(lane, active, w0, w1, w2, w3, data, scale, g, scale_bits, unscale_bits, table):
        top = magnitudes(w0, w1, w2, w3)  # infinities and NaNs order above every finite magnitude
        finite = top < exponent_mask
        m = top if finite else exact_max(w0, w1, w2, w3)
        vmax = NAN_F32 if m < 0 else plain_bits(m)  # m: no NaN
        sf = f32_mul(scale_bits, f32_mul(vmax, RCP6_BITS))
        code = 0x7F if (sf & 0x7FFFFFFF) > 0x7F800000 else e4m3_code(sf)
        sfv = e4m3_bits(code)
        out = 0
        if sfv != 0:
            out = rcp(f32_mul(sfv, unscale_bits))
        if top < NEVER and (out & 0x7F800000) != 0x7F800000:  # the row's thresholds hold (packed_table)
            row = table + code * (4 * THRESHOLDS)
            t01, t23 = load_i128(row)
            t45, t67 = load_i128(row + 16)
            word = encode16(w0, w1, w2, w3, t01, t23, t45, t67)
        else:
            word = exact_codes(w0, w1, w2, w3, out)
        pair = code | (lane_value(lane, code, lane ^ 1) << 8)  # two shuffles: lanes 4k gather 4k .. 4k + 3
        scales = pair | (lane_value(lane, pair, lane ^ 2) << 16)
        if active:
            store_i64(data, word)
            if (g & 3) == 0:
                store_i32(scale, scales)

    @device_function
    def decode(active, plain, codes, scales, g, scale_bits):
        if active:
            code = (scales >> (8 * (g & 3))) & 0xFF
            sfv = e4m3_bits(code)
            if (code & 0x7F) != 0x7F:  # packed: the magnitude times |sf|, the sign the code's flipped by sf's
                c = codes ^ (SIGN_NIBBLES & -(sfv >> 31))
                a = sfv & 0x7FFFFFFF
                if scale_bits == ONE_BITS:  # a global scale of 1: exact packed products
                    store_pair(plain, decode4_unit(c, a), decode4_unit(c >> 16, a))
                    store_pair(plain + 16, decode4_unit(c >> 32, a), decode4_unit(c >> 48, a))
                else:
                    store_pair(plain, decode4(c, a, scale_bits), decode4(c >> 16, a, scale_bits))
                    store_pair(plain + 16, decode4(c >> 32, a, scale_bits), decode4(c >> 48, a, scale_bits))
            else:
                for j in range(4):
                    word = 0
                    for e in range(4):
                        c = (codes >> (4 * (4 * j + e))) & 0xF
                        p = f32_mul(f32_mul(e2m1_bits(c), sfv), scale_bits)
                        if (p & 0x7FFFFFFF) > 0x7F800000:
                            v = ((c & 8) << 12) | nan_out
                        else:
                            v = to_plain(p) & 0xFFFF
                        word |= v << (16 * e)
                    store_i64(plain + 8 * j, word)

    return encode, decode


def _build_kernel(mode, plain_parts, src_hnd, dst_hnd, dtype, per_head, resident):
    src_slot, dst_slot = slot_of(src_hnd), slot_of(dst_hnd)
    plain_src = mode == "quantise"  # the plain side is the source
    lb: Any = plain_parts.layer_base if plain_parts is not None else None
    to: Any = plain_parts.token_offset if plain_parts is not None else None
    hs: Any = plain_parts.head_stride if plain_parts is not None else None

    if mode == "copy":
        @device_function
        def move_token(lane, s_tok, d_tok, a):
            (first_layer, num_layers, heads, _, src_table, src_page_bytes, src_block, dst_table, dst_page_bytes,
             dst_block) = a
            groups = per_head
            total = heads * groups
            s_t = s_tok % src_block
            d_t = d_tok % dst_block
            for layer in range(first_layer, first_layer + num_layers):
                for kind in range(2):
                    s = side_base(src_table, layer, s_tok, src_page_bytes, src_block, kind)
                    d = side_base(dst_table, layer, d_tok, dst_page_bytes, dst_block, kind)
                    s_scales = s + heads * src_block * groups * 8
                    d_scales = d + heads * dst_block * groups * 8
                    i = lane
                    while i < total:
                        h = i // groups
                        g = i - h * groups
                        ss = src_slot(s_t, h, heads, src_block)
                        ds = dst_slot(d_t, h, heads, dst_block)
                        store_i64(d + ds * groups * 8 + g * 8, load_i64(s + ss * groups * 8 + g * 8))
                        if (g & 3) == 0:
                            store_i32(d_scales + ds * groups + g, load_i32(s_scales + ss * groups + g))
                        i += WARP_SIZE
    else:
        nv_slot = dst_slot if mode == "quantise" else src_slot
        encode, decode = group_ops(dtype)

        @device_function
        def move_token(lane, s_tok, d_tok, a):
            (first_layer, num_layers, heads, _, plain_k, plain_v, plain_item, plain_dim, plain_page, table,
             page_bytes, block, k_scale, v_scale, k_unscale, v_unscale, thresholds) = a
            groups = per_head
            p_tok = s_tok if plain_src else d_tok
            n_tok = d_tok if plain_src else s_tok
            total = heads * groups
            p_off = to(p_tok, plain_dim, plain_item, heads, plain_page)
            p_stride = hs(plain_dim, plain_item, heads, plain_page)
            t = n_tok % block
            scales_at = heads * block * groups * 8  # a side's scale region, past its data
            for layer in range(first_layer, first_layer + num_layers):
                pk = lb(plain_k, layer, plain_dim, plain_item, heads, plain_page) + p_off
                pv = lb(plain_v, layer, plain_dim, plain_item, heads, plain_page) + p_off
                nk = side_base(table, layer, n_tok, page_bytes, block, 0)
                nv = nk + (page_bytes >> 1)
                base = 0
                while base < total:  # the whole warp, every pass: the scales' shuffles
                    i = base + lane
                    j = i + WARP_SIZE
                    h = i // groups
                    g = i - h * groups
                    h2 = j // groups
                    g2 = j - h2 * groups
                    plain_at = h * p_stride + g * 32
                    plain_at2 = h2 * p_stride + g2 * 32
                    slot = nv_slot(t, h, heads, block)
                    slot2 = nv_slot(t, h2, heads, block)
                    data_at = slot * groups * 8 + g * 8
                    data_at2 = slot2 * groups * 8 + g2 * 8
                    scale_at = scales_at + slot * groups + (g & ~3)
                    scale_at2 = scales_at + slot2 * groups + (g2 & ~3)
                    if plain_src:  # K and V read before either is converted
                        k0, k1, k2, k3 = fetch_plain(i < total, pk + plain_at)
                        v0, v1, v2, v3 = fetch_plain(i < total, pv + plain_at)
                        encode(lane, i < total, k0, k1, k2, k3, nk + data_at, nk + scale_at, g, k_scale, k_unscale,
                               thresholds)
                        encode(lane, i < total, v0, v1, v2, v3, nv + data_at, nv + scale_at, g, v_scale, v_unscale,
                               thresholds + V_ROWS)
                        base += WARP_SIZE
                    else:  # two passes of K and V in flight: a load from host memory waits on the link
                        ck, sk = fetch_codes(i < total, nk + data_at, nk + scale_at)
                        cv, sv = fetch_codes(i < total, nv + data_at, nv + scale_at)
                        ck2, sk2 = fetch_codes(j < total, nk + data_at2, nk + scale_at2)
                        cv2, sv2 = fetch_codes(j < total, nv + data_at2, nv + scale_at2)
                        decode(i < total, pk + plain_at, ck, sk, g, k_scale)
                        decode(i < total, pv + plain_at, cv, sv, g, v_scale)
                        decode(j < total, pk + plain_at2, ck2, sk2, g2, k_scale)
                        decode(j < total, pv + plain_at2, cv2, sv2, g2, v_scale)
                        base += 2 * WARP_SIZE

    @device_function
    def token_args(first_layer, num_layers, heads, groups, plain_k, plain_v, plain_item, plain_dim, plain_page,
                   src_table, src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale, v_scale,
                   k_unscale, v_unscale, thresholds):
        """What ``move_token`` reads, for this mode."""
        if mode == "copy":
            return (first_layer, num_layers, heads, groups, src_table, src_page_bytes, src_block, dst_table,
                    dst_page_bytes, dst_block)
        if plain_src:
            return (first_layer, num_layers, heads, groups, plain_k, plain_v, plain_item, plain_dim, plain_page,
                    dst_table, dst_page_bytes, dst_block, k_scale, v_scale, k_unscale, v_unscale, thresholds)
        return (first_layer, num_layers, heads, groups, plain_k, plain_v, plain_item, plain_dim, plain_page,
                src_table, src_page_bytes, src_block, k_scale, v_scale, k_unscale, v_unscale, thresholds)

    @device_function
    def move_items(lane, first, count, src_indices, dst_indices, src_token_limit, dst_token_limit, error_flag, a):
        """The warp's items ``first .. first + count`` (out of bounds: skipped and flagged)."""
        j = 0
        while j < count:
            s_tok = load_i64(src_indices + (first + j) * 8)
            d_tok = load_i64(dst_indices + (first + j) * 8)
            if in_bounds(lane, s_tok, d_tok, src_token_limit, dst_token_limit, error_flag):
                move_token(lane, s_tok, d_tok, a)
            j += 1

    def nvfp4_kv(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit, dst_token_limit,
                 num_layers, heads, groups, error_flag, plain_k, plain_v, plain_item, plain_dim, plain_page, src_table,
                 src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale, v_scale, k_unscale,
                 v_unscale, thresholds):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        first = (cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)) * items_per_warp
        a = token_args(first_layer, num_layers, heads, groups, plain_k, plain_v, plain_item, plain_dim, plain_page,
                       src_table, src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale, v_scale,
                       k_unscale, v_unscale, thresholds)
        move_items(lane, first, min(items_per_warp, num_items - first), src_indices, dst_indices, src_token_limit,
                   dst_token_limit, error_flag, a)

    def nvfp4_resident(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                       dst_token_limit, num_layers, heads, groups, error_flag, plain_k, plain_v, plain_item, plain_dim,
                       plain_page, src_table, src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale,
                       v_scale, k_unscale, v_unscale, thresholds, layers_done, arrivals):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        first = (cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)) * items_per_warp
        count = min(items_per_warp, num_items - first)
        layer = 0
        while layer < num_layers:
            a = token_args(first_layer + layer, 1, heads, groups, plain_k, plain_v, plain_item, plain_dim, plain_page,
                           src_table, src_page_bytes, src_block, dst_table, dst_page_bytes, dst_block, k_scale,
                           v_scale, k_unscale, v_unscale, thresholds)
            move_items(lane, first, count, src_indices, dst_indices, src_token_limit, dst_token_limit, error_flag, a)
            cuda.syncthreads()  # every warp of the block has stored its share of the layer
            if cuda.threadIdx.x == 0:
                layer_landed(layer, cuda.gridDim.x, layers_done, arrivals)
            layer += 1

    plain = "" if plain_parts is None else f"_{plain_parts.name}"
    order = f"_{'hnd' if src_hnd else 'nhd'}_{'hnd' if dst_hnd else 'nhd'}"
    fn, args = (nvfp4_resident, ResidentArgs) if resident else (nvfp4_kv, Nvfp4Args)
    check_parameters(fn, args)
    fn.__name__ = fn.__qualname__ = f"nvfp4_{'resident_' if resident else ''}{mode}_{dtype}{plain}{order}_g{per_head}"
    return kernel(fn, max_registers=64)


def get_kernel(mode, plain_parts, src_hnd, dst_hnd, dtype="bfloat16", groups=8, resident=False):
    """The kernel for one (mode, plain side's ``LayoutParts`` or None, NVFP4 orders, plain dtype, ``groups``: a head's
    ``D / 16``, compiled in, so that a group's head is a division by a constant), built on first request and
    memoised (a compiled kernel, not a plan: no setting changes it). ``resident``: the resident loader's NVFP4
    build (``kernels.resident``, parameters ``ResidentArgs``): the same per-token copy one layer after another
    on the load's few blocks, each layer published as it lands."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return memoised(_build_kernel, mode, plain_parts, bool(src_hnd), bool(dst_hnd), plain_dtype(dtype), int(groups),
                    bool(resident))


def kernel_ptx(mode, plain_parts, src_hnd, dst_hnd, dtype="bfloat16", cc=(9, 0), groups=8):
    """PTX of one NVFP4 kernel for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(mode, plain_parts, src_hnd, dst_hnd, dtype, groups), SIGNATURE, cc)
