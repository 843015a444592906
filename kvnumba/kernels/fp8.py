"""The FP8 codecs' device functions (``kvnumba.quant.fp8``'s ``E4M3``, ``E5M2``: ``Fp8Codec.kernels`` names this
module), bit exact: float32 <-> e4m3fn / e5m2, bfloat16 / float16 <-> float32, one element's quantisation and
dequantisation as the codec's reference defines them, and ``ops(codec, dtype)``: every device function the
kernels inline for one codec and plain dtype, made from the codec's constants (the exact element functions
here, the packed ones of ``kernels.fp8_packed``). The kernels take the codec and find these through
``kernels.factory.codec_ops``, so a codec of the same shape (8-bit codes, a float32 scale a head in an array
of its own) plugs into the same kernels with an ``ops`` of its own.

Written with integer bit operations on int64 values (a float's bits), plus float32 division and
multiplication where the format asks for them (``float32(x) * inv``, ``float32(x) / scale`` where ``inv``
overflows, ``float32(decode(c)) * scale``):
Numba has no FP8 type, and the same code runs on the GPU (compiled device functions, the float32
operations IEEE-rounded: no fast math) and on the simulator (plain Python, float32 arithmetic in NumPy
float32 scalars; ``kernels.words`` holds the bit casts of both worlds).

Rounding from float32 bits ``u`` (finite) into a format of ``E`` exponent bits (bias ``B``) and ``M``
mantissa bits, to nearest even:

- normal result (biased exponent ``e - 127 + B >= 1``): ``r = u - ((127 - B) << 23)`` (the exponent
  rebiased), ``q = (r + 2**(S-1) - 1 + ((r >> S) & 1)) >> S`` with ``S = 23 - M``; a carry moves into the
  exponent by itself;
- subnormal result: the float32 significand ``1.m`` (24 bits) shifted right by ``24 - M - biased`` with
  the same rounding (a carry gives the smallest normal); a float32 subnormal gives 0;
- above the largest finite magnitude: the largest finite (FP8: saturation) or infinity (float16).

The functions are made per format by the ``make_*`` factories (closure constants, as the kernel
factory does) and memoised: ``quantiser(codec, dtype)``, ``dequantiser(codec, dtype)``, ``ops(codec, dtype)``
(a codec or its name).
"""
import functools
from typing import Any, NamedTuple

from ..quant.fp8 import CANONICAL_NAN, fp8_format, plain_dtype
from . import fp8_packed
from .jit import device_function
from .words import f32_div, f32_mul

__all__ = ["Fp8Ops", "bf16_from_f32", "dequantiser", "make_narrow", "make_widen", "narrow", "ops", "quantiser",
           "widen", "word_dequantiser"]


def make_narrow(exponent_bits, mantissa_bits, bias, max_magnitude, overflow_magnitude):
    """``narrow(u) -> code``: finite float32 bits ``u`` rounded to nearest even into the format (sign
    kept); magnitudes above ``max_magnitude`` become ``overflow_magnitude``."""
    shift = 23 - mantissa_bits
    rebias = (127 - bias) << 23
    sign_shift = exponent_bits + mantissa_bits
    half = 1 << (shift - 1)

    @device_function
    def narrow(u):
        sign = (u >> 31) & 1
        a = u & 0x7FFFFFFF
        e = a >> 23
        biased = e - 127 + bias
        if biased >= 1:
            r = a - rebias
            q = (r + half - 1 + ((r >> shift) & 1)) >> shift
            if q > max_magnitude:
                q = overflow_magnitude
        elif e == 0:
            q = 0  # a float32 subnormal is far below the smallest subnormal of these formats
        else:
            s = 24 - mantissa_bits - biased
            full = (a & 0x7FFFFF) | 0x800000
            q = 0
            if s < 32:
                q = (full + (1 << (s - 1)) - 1 + ((full >> s) & 1)) >> s
        return (sign << sign_shift) | q

    return narrow


def make_widen(exponent_bits, mantissa_bits, bias, ieee):
    """``widen(c) -> float32 bits`` of a code of the format (exact). ``ieee``: the top exponent holds
    infinities and NaNs (e5m2, float16); else (e4m3fn) only the all-ones magnitude is NaN. NaNs give the
    float32 quiet NaN with their sign."""
    sign_shift = exponent_bits + mantissa_bits
    magnitude_mask = (1 << sign_shift) - 1
    mantissa_mask = (1 << mantissa_bits) - 1
    top = (1 << exponent_bits) - 1
    subnormal_exponent = 1 - bias - mantissa_bits + 127

    @device_function
    def widen(c):
        sign = (c >> sign_shift) & 1
        magnitude = c & magnitude_mask
        e = magnitude >> mantissa_bits
        m = magnitude & mantissa_mask
        if ieee and e == top:
            bits = 0x7F800000 if m == 0 else 0x7FC00000
        elif not ieee and magnitude == magnitude_mask:
            bits = 0x7FC00000
        elif e == 0:
            bits = 0
            if m != 0:
                p = mantissa_bits - 1
                while (m >> p) == 0:
                    p -= 1
                bits = ((subnormal_exponent + p) << 23) | ((m - (1 << p)) << (23 - p))
        else:
            bits = ((e - bias + 127) << 23) | (m << (23 - mantissa_bits))
        return (sign << 31) | bits

    return widen


@device_function
def bf16_from_f32(u):
    """Finite (or infinite) float32 bits to bfloat16 bits, to nearest even (overflow: infinity)."""
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@device_function
def f32_from_bf16(b):
    return b << 16


@functools.lru_cache(maxsize=None)
def narrow(fmt):
    """float32 bits -> code of ``fmt`` (``"e4m3"``, ``"e5m2"``, or ``"float16"``; finite input)."""
    if fmt == "float16":
        return make_narrow(5, 10, 15, 0x7BFF, 0x7C00)
    f = fp8_format(fmt)
    return make_narrow(f.exponent_bits, f.mantissa_bits, f.bias, f.max_code, f.max_code)


@functools.lru_cache(maxsize=None)
def widen(fmt):
    """Code of ``fmt`` (``"e4m3"``, ``"e5m2"``, ``"float16"``, ``"bfloat16"``) -> float32 bits."""
    if fmt == "bfloat16":
        return f32_from_bf16
    if fmt == "float16":
        return make_widen(5, 10, 15, True)
    f = fp8_format(fmt)
    return make_widen(f.exponent_bits, f.mantissa_bits, f.bias, f.ieee)


_EXPONENT_MASK = {"bfloat16": 0x7F80, "float16": 0x7C00}
ONE_BITS = 0x3F800000  # float32 1.0


@functools.lru_cache(maxsize=None)
def quantiser(fmt, dtype):
    """``(magnitude, scale_of, inverse_of, quantise)`` device functions for elements of ``dtype``
    (bfloat16 or float16 bits) into ``fmt`` (see ``Fp8Ops``; the amax of a head is the largest magnitude:
    magnitudes order as their bits do)."""
    f, name = fp8_format(fmt), plain_dtype(dtype)
    exponent_mask = _EXPONENT_MASK[name]
    widen_plain, to_code = widen(name), narrow(f)
    max_bits = f32_bits_of(f.max_value)
    nan_code, max_code = f.nan_code, f.max_code

    @device_function
    def magnitude(b):
        m = b & 0x7FFF
        if (m & exponent_mask) == exponent_mask:
            return 0
        return m

    @device_function
    def scale_of(m):
        return f32_div(widen_plain(m), max_bits)

    @device_function
    def inverse_of(scale_bits):
        if scale_bits == 0:
            return 0
        inverse = f32_div(ONE_BITS, scale_bits)
        if (inverse & 0x7F800000) == 0x7F800000:
            return 0
        return inverse

    @device_function
    def quantise(b, scale_bits, inverse_bits):
        sign = (b >> 15) & 1
        m = b & 0x7FFF
        if (m & exponent_mask) == exponent_mask:
            if m != exponent_mask:
                return (sign << 7) | nan_code
            return (sign << 7) | max_code
        if scale_bits == 0:
            return 0
        if inverse_bits != 0:
            return to_code(f32_mul(widen_plain(b), inverse_bits))
        return to_code(f32_div(widen_plain(b), scale_bits))

    return magnitude, scale_of, inverse_of, quantise


@functools.lru_cache(maxsize=None)
def dequantiser(fmt, dtype):
    """``dequantise(c, scale_bits)``: the bfloat16 (float16) bits of code ``c`` of ``fmt`` times the float32
    whose bits are ``scale_bits`` (a device function)."""
    f, name = fp8_format(fmt), plain_dtype(dtype)
    from_code = widen(f)
    to_plain = bf16_from_f32 if name == "bfloat16" else narrow("float16")
    nan_out = CANONICAL_NAN[name]
    e4m3 = not f.ieee  # only the all-ones magnitude is NaN; else every magnitude above infinity's

    @device_function
    def dequantise(c, scale_bits):
        sign = (c >> 7) & 1
        m = c & 0x7F
        if (e4m3 and m == 0x7F) or (not e4m3 and m > 0x7C):
            return (sign << 15) | nan_out
        p = f32_mul(from_code(c), scale_bits)
        if (p & 0x7FFFFFFF) > 0x7F800000:
            return (sign << 15) | nan_out
        return to_plain(p) & 0xFFFF

    return dequantise


def f32_bits_of(value):
    """The float32 bits of a Python number (host side, for closure constants)."""
    import numpy as np

    return int(np.float32(value).view(np.uint32))


@functools.lru_cache(maxsize=None)
def word_dequantiser(fmt, dtype):
    """``word(c, scale_bits)``: the 8-byte word of bfloat16/float16 bits of the four codes in 4-byte word ``c``
    (the first in its low byte) times the float32 of ``scale_bits`` (a device function)."""
    dequantise = dequantiser(fmt, dtype)

    @device_function
    def word(c, scale_bits):
        # A loop, not four calls: Numba's inliner copies the whole callee (with all it inlines) at each call
        # site, and a kernel's build time grows with the copies (NVVM unrolls the loop again).
        out = 0
        for e in range(4):
            out |= dequantise((c >> (8 * e)) & 0xFF, scale_bits) << (16 * e)
        return out

    return word


class Fp8Ops(NamedTuple):
    """One FP8 codec's device functions for one plain dtype (``ops``); the exact ones take every input, the
    packed ones (``kernels.fp8_packed``) the inputs their docstrings name."""

    magnitude: Any  # b -> magnitude bits, 0 for NaN and ±inf (``quantiser``)
    scale_of: Any  # amax magnitude bits -> scale bits
    inverse_of: Any  # scale bits -> bits of 1 / scale, 0 where the format divides (a zero scale, or inf)
    quantise: Any  # (b, scale_bits, inverse_bits) -> code
    dequantise: Any  # (c, scale_bits) -> plain bits (``dequantiser``)
    dequantise_word: Any  # four codes -> a word of four plain values, exactly (``word_dequantiser``)
    magnitudes: Any  # packed: the largest magnitude bits of 16 elements in four words
    quantise8: Any  # packed: 8 codes of two words of elements times an inverse
    dequantise4: Any  # packed: a word of 4 plain values of the low 4 codes times a scale
    special: Any  # whether a word of 8 codes holds one the packed conversions do not take
    takes: Any  # whether the packed conversions take 16 codes (two words) with a scale
    store_chunk: Any  # 16 codes times a scale, packed, as 32 bytes at an address


@functools.lru_cache(maxsize=None)
def ops(codec, dtype):
    """``Fp8Ops`` of ``codec`` (an ``Fp8Codec`` or its name) for elements of the plain ``dtype``."""
    f, name = fp8_format(codec), plain_dtype(dtype)
    packed = fp8_packed.packed_ops(f, name)
    return Fp8Ops._make((*quantiser(f, name), dequantiser(f, name), word_dequantiser(f, name), *packed))
