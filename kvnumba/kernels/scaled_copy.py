"""The register kernel of a codec with a float32 scale per head in an array of its own (FP8's ``E4M3``,
``E5M2``): it quantises, dequantises, or copies codes and scales, inside the copy, for every head size (the
faster ``kernels.quantise_wide`` and ``kernels.dequantise_pipelined`` take heads of 16 * 2**k and 8 * 2**k);
one memoised kernel per (source layout, destination layout, MLA, mode, codec, plain dtype).

The format is the codec's reference (``kvnumba.quant.fp8``), the arithmetic its device functions
(``factory.codec_ops``). A quantised side is two address sets of one layout (``LayoutParts``): its codes
(items of ``H * D`` bytes) and its scales (items of ``H * 4`` bytes), each with its own ``layout_dim`` (and
layer tables). Every copy goes head by head.

Modes (``MODES``): ``"quantise"`` (plain to FP8), ``"dequantise"`` (FP8 to plain), ``"copy"`` (FP8 to FP8).
Warp ``w`` takes items ``[w * items_per_warp, (w + 1) * items_per_warp)`` (bounds-checked by
``item_copy.in_bounds``: an index outside its side is skipped and the error flag set), every layer, K then V,
head by head; lane ``i`` takes a head's words ``i, i + 32, ...``. Quantising, a lane holds up to ``HELD``
words in registers between the head's amax (``words.group_max``) and its codes, reading again only past them.
"""
from typing import NamedTuple

from numba import cuda, types

from ..quant.codec import Codec
from ..quant.fp8 import E4M3, plain_dtype
from .factory import codec_ops, memoised
from .item_copy import in_bounds
from .jit import WARP_SIZE, device_function, kernel
from .layouts import LayoutParts
from .memory import load_i64
from .params import check_parameters, signature
from .ptx import ptx_of
from .words import group_max, load_i32, store_i32, store_i64

MODES = ("quantise", "dequantise", "copy")


class ScaledArgs(NamedTuple):
    """The codec kernels' parameters, in order (addresses and sizes in bytes). ``*_scales_*`` are a
    quantised side's scales (0 for a plain side); a table layout's ``*_k``/``*_v`` are tables."""

    src_indices: int
    dst_indices: int
    num_items: int
    items_per_warp: int
    first_layer: int
    src_token_limit: int
    dst_token_limit: int
    num_layers: int
    heads: int
    words: int  # D / 4: a head's 8-byte words of bfloat16/float16 (its 4-byte words of codes)
    error_flag: int
    src_k: int
    src_v: int
    src_item: int
    src_dim: int
    src_page: int
    src_scales_k: int
    src_scales_v: int
    src_scales_item: int
    src_scales_dim: int
    dst_k: int
    dst_v: int
    dst_item: int
    dst_dim: int
    dst_page: int
    dst_scales_k: int
    dst_scales_v: int
    dst_scales_item: int
    dst_scales_dim: int


SIGNATURE = signature(ScaledArgs)
HELD = 4  # words a lane keeps in registers between the amax and the codes


@device_function
def head_address(kinds_head, heads, k_base, v_base, stride):
    """Where head ``kinds_head`` of a token's heads starts: K's ``heads`` heads first, then V's."""
    kind = 1 if kinds_head >= heads else 0
    return (v_base if kind else k_base) + (kinds_head - kind * heads) * stride


@device_function
def next_item(lane, first, j, count, src_indices, dst_indices, src_token_limit, dst_token_limit, error_flag):
    """``(j, s_tok, d_tok)``: the warp's first item from ``first + j`` whose indices are in bounds, the ones
    before it skipped and flagged (``item_copy.in_bounds``); ``j == count`` when there is none (the walks of
    ``kernels.dequantise_pipelined`` and ``kernels.nvfp4_load``)."""
    while j < count:
        s_tok = load_i64(src_indices + (first + j) * 8)
        d_tok = load_i64(dst_indices + (first + j) * 8)
        if in_bounds(lane, s_tok, d_tok, src_token_limit, dst_token_limit, error_flag):
            return j, s_tok, d_tok
        j += 1
    return j, 0, 0


def make_head_op(mode, codec, dtype):
    """``op(lane, src, src_scale, dst, dst_scale, words)``: the warp moves one head."""
    ops = codec_ops(codec, dtype)
    if mode == "quantise":
        magnitude, scale_of, inverse_of, quantise = ops.magnitude, ops.scale_of, ops.inverse_of, ops.quantise

        @device_function
        def word_magnitude(w):
            m = 0
            for e in range(4):  # a loop, not four calls: see ``fp8.word_dequantiser``
                m = max(m, magnitude((w >> (16 * e)) & 0xFFFF))
            return m

        @device_function
        def word_codes(w, scale_bits, inverse_bits):
            codes = 0
            for e in range(4):
                codes |= quantise((w >> (16 * e)) & 0xFFFF, scale_bits, inverse_bits) << (8 * e)
            return codes

        @device_function
        def quantise_head(lane, src, src_scale, dst, dst_scale, words):
            held = cuda.local.array(HELD, types.int64)  # a constant size and loop: kept in registers
            m = 0
            for k in range(HELD):
                i = lane + k * WARP_SIZE
                held[k] = load_i64(src + i * 8) if i < words else 0
                m = max(m, word_magnitude(held[k]))
            i = lane + HELD * WARP_SIZE
            while i < words:  # a head longer than the registers hold: its amax read, its codes read again
                m = max(m, word_magnitude(load_i64(src + i * 8)))
                i += WARP_SIZE
            m = group_max(lane, m, WARP_SIZE)
            scale_bits = scale_of(m)
            inverse_bits = inverse_of(scale_bits)
            if lane == 0:
                store_i32(dst_scale, scale_bits)
            for k in range(HELD):
                i = lane + k * WARP_SIZE
                if i < words:
                    store_i32(dst + i * 4, word_codes(held[k], scale_bits, inverse_bits))
            i = lane + HELD * WARP_SIZE
            while i < words:
                store_i32(dst + i * 4, word_codes(load_i64(src + i * 8), scale_bits, inverse_bits))
                i += WARP_SIZE

        return quantise_head

    if mode == "dequantise":
        dequantise_word = ops.dequantise_word

        @device_function
        def dequantise_head(lane, src, src_scale, dst, dst_scale, words):
            scale_bits = load_i32(src_scale)
            i = lane
            while i < words:
                store_i64(dst + i * 8, dequantise_word(load_i32(src + i * 4), scale_bits))
                i += WARP_SIZE

        return dequantise_head

    @device_function
    def copy_head(lane, src, src_scale, dst, dst_scale, words):
        if lane == 0:
            store_i32(dst_scale, load_i32(src_scale))
        i = lane
        while i < words:
            store_i32(dst + i * 4, load_i32(src + i * 4))
            i += WARP_SIZE

    return copy_head


def make_items_copy(src, dst, mla, mode, codec, dtype):
    """``copy_items(lane, first, j, count, step, args)``, ``args`` the tuple of ``ScaledArgs``' values but
    ``num_items`` and ``items_per_warp``, in order (a call of more than 30 arguments compiles
    to a ``*args`` call, which Numba cannot inline): the register path's loop over a warp's items, every
    layer, K/V and head (the kernels here and ``kernels.dequantise_staged``'s items that do not go in bulk)."""
    head_op = make_head_op(mode, codec, dtype)
    src_scaled, dst_scaled = mode != "quantise", mode != "dequantise"
    src_lb, src_to, src_hs = src.layer_base, src.token_offset, src.head_stride
    dst_lb, dst_to, dst_hs = dst.layer_base, dst.token_offset, dst.head_stride
    kinds = 1 if mla else 2

    @device_function
    def copy_token(lane, s_tok, d_tok, args):
        (src_indices, dst_indices, first_layer, src_token_limit, dst_token_limit, num_layers, heads, words, error_flag,
         src_k, src_v, src_item, src_dim, src_page, src_scales_k, src_scales_v, src_scales_item, src_scales_dim, dst_k,
         dst_v, dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim) = args
        s_off = src_to(s_tok, src_dim, src_item, heads, src_page)
        s_stride = src_hs(src_dim, src_item, heads, src_page)
        d_off = dst_to(d_tok, dst_dim, dst_item, heads, dst_page)
        d_stride = dst_hs(dst_dim, dst_item, heads, dst_page)
        ss_off = ss_stride = ds_off = ds_stride = 0  # a plain side has no scales
        if src_scaled:
            ss_off = src_to(s_tok, src_scales_dim, src_scales_item, heads, src_page)
            ss_stride = src_hs(src_scales_dim, src_scales_item, heads, src_page)
        if dst_scaled:
            ds_off = dst_to(d_tok, dst_scales_dim, dst_scales_item, heads, dst_page)
            ds_stride = dst_hs(dst_scales_dim, dst_scales_item, heads, dst_page)
        for layer in range(first_layer, first_layer + num_layers):
            for kind in range(kinds):
                s = src_lb(src_k if kind == 0 else src_v, layer, src_dim, src_item, heads, src_page) + s_off
                d = dst_lb(dst_k if kind == 0 else dst_v, layer, dst_dim, dst_item, heads, dst_page) + d_off
                ss = ds = 0
                if src_scaled:
                    ss = src_lb(src_scales_k if kind == 0 else src_scales_v, layer, src_scales_dim, src_scales_item,
                                heads, src_page) + ss_off
                if dst_scaled:
                    ds = dst_lb(dst_scales_k if kind == 0 else dst_scales_v, layer, dst_scales_dim, dst_scales_item,
                                heads, dst_page) + ds_off
                for head in range(heads):
                    head_op(lane, s + head * s_stride, ss + head * ss_stride, d + head * d_stride,
                            ds + head * ds_stride, words)

    @device_function
    def copy_items(lane, first, j, count, step, args):
        """The warp's items ``first + j``, ``first + j + step``, .. below ``first + count`` (out of bounds:
        skipped and flagged)."""
        src_indices, dst_indices, _, src_token_limit, dst_token_limit, _, _, _, error_flag = args[:9]
        while j < count:
            item = first + j
            s_tok = load_i64(src_indices + item * 8)
            d_tok = load_i64(dst_indices + item * 8)
            if in_bounds(lane, s_tok, d_tok, src_token_limit, dst_token_limit, error_flag):
                copy_token(lane, s_tok, d_tok, args)
            j += step

    return copy_items


def _build_kernel(src, dst, mla, mode, codec, dtype):
    copy_items = make_items_copy(src, dst, mla, mode, codec, dtype)

    def scaled_kv(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit, dst_token_limit,
                  num_layers, heads, words, error_flag, src_k, src_v, src_item, src_dim, src_page, src_scales_k,
                  src_scales_v, src_scales_item, src_scales_dim, dst_k, dst_v, dst_item, dst_dim, dst_page,
                  dst_scales_k, dst_scales_v, dst_scales_item, dst_scales_dim):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        first = warp * items_per_warp
        args = (src_indices, dst_indices, first_layer, src_token_limit, dst_token_limit, num_layers, heads, words,
                error_flag, src_k, src_v, src_item, src_dim, src_page, src_scales_k, src_scales_v, src_scales_item,
                src_scales_dim, dst_k, dst_v, dst_item, dst_dim, dst_page, dst_scales_k, dst_scales_v, dst_scales_item,
                dst_scales_dim)
        copy_items(lane, first, 0, min(items_per_warp, num_items - first), 1, args)

    check_parameters(scaled_kv, ScaledArgs)
    scaled_kv.__name__ = scaled_kv.__qualname__ = f"{mode}_{kernel_name(codec, dtype, src, dst, mla)}"
    return kernel(scaled_kv, max_registers=64)


def kernel_name(codec, dtype, src, dst, mla):
    """The part of a codec kernel's name after its variant: codec, dtype, layouts and MLA."""
    return f"{codec.name}_{dtype}_{src.name}_{dst.name}{'_mla' if mla else ''}"


def codec_key(src, dst, mla, codec, dtype):
    """``(src, dst, mla, codec, dtype)`` checked and normalised, as the codec kernels key them: ``src``/``dst``
    ``LayoutParts``, ``codec`` a ``kvnumba.quant.codec.Codec``, ``dtype`` a plain dtype's name."""
    if not (isinstance(src, LayoutParts) and isinstance(dst, LayoutParts)):
        raise TypeError("src and dst must be kvnumba.kernels.layouts.LayoutParts")
    if not isinstance(codec, Codec):
        raise TypeError(f"codec must be a kvnumba.quant.codec.Codec (kvnumba.quant.E4M3, ...), got {codec!r}")
    return src, dst, bool(mla), codec, plain_dtype(dtype)


def get_kernel(src, dst, mla, mode, codec=E4M3, dtype="bfloat16"):
    """The kernel for one (source layout, destination layout, MLA, mode, codec, plain dtype), built on first
    request and memoised; ``src``/``dst``: ``LayoutParts``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    src, dst, mla, codec, dtype = codec_key(src, dst, mla, codec, dtype)
    return memoised(_build_kernel, src, dst, mla, mode, codec, dtype)


def kernel_ptx(src, dst, mla, mode, codec=E4M3, dtype="bfloat16", cc=(9, 0)):
    """PTX of one kernel for compute capability ``cc`` (needs NVVM, not a GPU; not the simulator)."""
    return ptx_of(get_kernel(src, dst, mla, mode, codec, dtype), SIGNATURE, cc)
