"""The FP8 codecs' device functions (``kvnumba.quant.fp8``'s ``E4M3``, ``E5M2``), bit exact with the codec's
reference: ``ops(codec, dtype)`` gives every device function the kernels inline for one codec and plain dtype
(``Fp8Ops``), found by the kernels through ``kernels.factory.codec_ops``.

The exact element functions take every input, with integer bit operations on int64 values (Numba has no FP8
type) and IEEE-rounded float32 arithmetic (``kernels.words``), the same code on the GPU and the simulator.
Rounding float32 bits ``u`` into ``E`` exponent bits (bias ``B``) and ``M`` mantissa bits, to nearest even:

- normal result: ``r = u - ((127 - B) << 23)``, ``q = (r + 2**(S-1) - 1 + ((r >> S) & 1)) >> S`` with
  ``S = 23 - M`` (a carry moves into the exponent by itself);
- subnormal result: the float32 significand ``1.m`` shifted right by ``24 - M - biased``, rounded the same
  way; a float32 subnormal gives 0;
- above the largest finite magnitude: the largest finite (FP8: saturation) or infinity (float16).

The packed conversions (``packed_ops``) convert several elements an instruction with the GPU's own
``cvt...e4m3x2``/``e5m2x2`` (compute capability 9.0) for the heads the format treats plainly; the kernels send
every other head through the exact functions. On the simulator their NumPy twins (``kernels.simulator.fp8``)
are chosen here once, at import.
"""
import functools
from typing import Any, NamedTuple

from ..driver.target import SIMULATOR
from ..quant.fp8 import CANONICAL_NAN, fp8_format, plain_dtype
from .jit import device_function
from .words import f32_div, f32_mul, store_pair

__all__ = ["EXPONENT_MASK", "Fp8Ops", "bf16_from_f32", "dequantiser", "magnitudes", "make_dequantise4", "make_narrow",
           "make_quantise8", "make_widen", "narrow", "ops", "packed_ops", "quantiser", "widen", "word_dequantiser"]

# The packed conversions' PTX, one text an operation (``$0`` the int64 result, ``$1``... the int64 operands): the GPU
# branch below makes each an intrinsic; numba-cuda-mlir's port (scripts/mlir_port/fp8.py), an ``inline_ptx`` call.
_MAGNITUDES = """
.reg .b32 a<8>;
mov.b64 {a0, a1}, $1;
mov.b64 {a2, a3}, $2;
mov.b64 {a4, a5}, $3;
mov.b64 {a6, a7}, $4;
and.b32 a0, a0, 0x7FFF7FFF; and.b32 a1, a1, 0x7FFF7FFF; and.b32 a2, a2, 0x7FFF7FFF; and.b32 a3, a3, 0x7FFF7FFF;
and.b32 a4, a4, 0x7FFF7FFF; and.b32 a5, a5, 0x7FFF7FFF; and.b32 a6, a6, 0x7FFF7FFF; and.b32 a7, a7, 0x7FFF7FFF;
max.u16x2 a0, a0, a1; max.u16x2 a2, a2, a3; max.u16x2 a4, a4, a5; max.u16x2 a6, a6, a7;
max.u16x2 a0, a0, a2; max.u16x2 a4, a4, a6; max.u16x2 a0, a0, a4;
shr.u32 a1, a0, 16; and.b32 a0, a0, 0xFFFF; max.u32 a0, a0, a1;
cvt.u64.u32 $0, a0;"""


def _widen_pair(word, first):
    """PTX: float32 registers ``x{first}``, ``x{first + 1}`` from the two elements of 32-bit ``word``."""
    return {
        "bfloat16": f"shl.b32 t, {word}, 16; mov.b32 x{first}, t;\n"
                    f"and.b32 t, {word}, 0xFFFF0000; mov.b32 x{first + 1}, t;",
        "float16": f"mov.b32 {{h0, h1}}, {word}; cvt.f32.f16 x{first}, h0; cvt.f32.f16 x{first + 1}, h1;",
    }


def _quantise8(fmt, dtype):
    """Eight elements (two words, ``$1``, ``$2``) times the scale's float32 bits (``$3``), as eight codes."""
    widen = "\n".join(_widen_pair(f"a{i}", 2 * i)[dtype] for i in range(4))
    scale = "\n".join(f"mul.rn.f32 x{i}, x{i}, s;" for i in range(8))
    narrow = "\n".join(f"cvt.rn.satfinite.{fmt}x2.f32 c{i}, x{2 * i + 1}, x{2 * i};" for i in range(4))
    return f"""
.reg .b32 a<4>, t, lo, hi;
.reg .b16 h0, h1, c<4>;
.reg .f32 x<8>, s;
mov.b64 {{a0, a1}}, $1;
mov.b64 {{a2, a3}}, $2;
cvt.u32.u64 t, $3; mov.b32 s, t;
{widen}
{scale}
{narrow}
mov.b32 lo, {{c0, c1}};
mov.b32 hi, {{c2, c3}};
mov.b64 $0, {{lo, hi}};"""


def _dequantise4(fmt, dtype):
    """Four codes (``$1``) times the scale's float32 bits (``$2``), as four elements in one word."""
    narrow = {"bfloat16": "bf16x2", "float16": "f16x2"}[dtype]
    return f"""
.reg .b32 w, t, p0, p1, lo, hi;
.reg .b16 c0, c1, g<4>;
.reg .f32 y<4>, s;
cvt.u32.u64 w, $1;
mov.b32 {{c0, c1}}, w;
cvt.rn.f16x2.{fmt}x2 p0, c0;
cvt.rn.f16x2.{fmt}x2 p1, c1;
mov.b32 {{g0, g1}}, p0;
mov.b32 {{g2, g3}}, p1;
cvt.f32.f16 y0, g0; cvt.f32.f16 y1, g1; cvt.f32.f16 y2, g2; cvt.f32.f16 y3, g3;
cvt.u32.u64 t, $2; mov.b32 s, t;
mul.rn.f32 y0, y0, s; mul.rn.f32 y1, y1, s; mul.rn.f32 y2, y2, s; mul.rn.f32 y3, y3, s;
cvt.rn.{narrow}.f32 lo, y1, y0;
cvt.rn.{narrow}.f32 hi, y3, y2;
mov.b64 $0, {{lo, hi}};"""


if SIMULATOR:
    from .simulator.fp8 import magnitudes, make_dequantise4, make_quantise8
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    def _asm(body, inputs):
        """An intrinsic running PTX ``body`` on ``inputs`` (2, 3, 4 or 8) int64 operands (``$1``...), giving an
        int64 (``$0``); NVFP4's packed conversions (``kernels.nvfp4_packed``) use it too."""
        def codegen(context, builder, sig, values):
            asm = ir.InlineAsm(ir.FunctionType(_I64, [_I64] * inputs), "{\n" + body + "\n}", "=l" + ",l" * inputs)
            return builder.call(asm, [context.cast(builder, v, t, types.int64) for v, t in zip(values, sig.args)])

        def typed(*args):
            return types.int64(*args), codegen

        # an intrinsic's typer names its operands (Numba does not lower a *args one)
        by_arity = {2: lambda typingctx, a, b: typed(a, b),
                    3: lambda typingctx, a, b, c: typed(a, b, c),
                    4: lambda typingctx, a, b, c, d: typed(a, b, c, d),
                    8: lambda typingctx, a, b, c, d, e, f, g, h: typed(a, b, c, d, e, f, g, h)}
        return intrinsic(by_arity[inputs])

    magnitudes = _asm(_MAGNITUDES, 4)

    def make_quantise8(fmt, dtype):
        return _asm(_quantise8(fmt, dtype), 3)

    def make_dequantise4(fmt, dtype):
        return _asm(_dequantise4(fmt, dtype), 2)


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


EXPONENT_MASK = {"bfloat16": 0x7F80, "float16": 0x7C00}  # magnitude bits from here up: infinities and NaNs
ONE_BITS = 0x3F800000  # float32 1.0


@functools.lru_cache(maxsize=None)
def quantiser(fmt, dtype):
    """``(magnitude, scale_of, inverse_of, quantise)`` device functions for elements of ``dtype``
    (bfloat16 or float16 bits) into ``fmt`` (see ``Fp8Ops``; the amax of a head is the largest magnitude:
    magnitudes order as their bits do)."""
    f, name = fp8_format(fmt), plain_dtype(dtype)
    exponent_mask = EXPONENT_MASK[name]
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


def packed_ops(f, dtype):
    """``(magnitudes, quantise8, dequantise4, special, takes, store)`` for the FP8 codec ``f`` and the plain
    ``dtype`` (``Fp8Ops`` says what each does; ``ops`` memoises them with the exact functions)."""
    dequantise4 = make_dequantise4(f.name, dtype)
    # A byte's magnitude plus its distance to ``f.special_from`` carries into its top bit. Tested on 32-bit
    # halves: on whole int64 words a top byte's sum would overflow the sign bit, which NVVM takes never to
    # happen, and it dropped that byte's test.
    carry = 0x01010101 * (0x80 - f.special_from)

    @device_function
    def special(word):
        low = (word & 0x7F7F7F7F) + carry
        high = ((word >> 32) & 0x7F7F7F7F) + carry
        return ((low | high) & 0x80808080) != 0

    @device_function
    def takes(scale_bits, low, high):
        return ((scale_bits & 0x7F800000) != 0x7F800000) & (not (special(low) | special(high)))  # no branch

    @device_function
    def store(address, low, high, scale_bits):
        store_pair(address, dequantise4(low, scale_bits), dequantise4(low >> 32, scale_bits))
        store_pair(address + 16, dequantise4(high, scale_bits), dequantise4(high >> 32, scale_bits))

    return magnitudes, make_quantise8(f.name, dtype), dequantise4, special, takes, store


class Fp8Ops(NamedTuple):
    """One FP8 codec's device functions for one plain dtype (``ops``); the exact ones take every input, the
    packed ones (``packed_ops``, int64 bits) finite elements and inverses, codes that are not NaN (nor e5m2
    infinities) and finite scales."""

    magnitude: Any  # b -> magnitude bits, 0 for NaN and ±inf (``quantiser``)
    scale_of: Any  # amax magnitude bits -> scale bits
    inverse_of: Any  # scale bits -> bits of 1 / scale, 0 where the format divides (a zero scale, or inf)
    quantise: Any  # (b, scale_bits, inverse_bits) -> code
    dequantise: Any  # (c, scale_bits) -> plain bits (``dequantiser``)
    dequantise_word: Any  # four codes -> a word of four plain values, exactly (``word_dequantiser``)
    magnitudes: Any  # packed: the largest magnitude bits (inf and NaN included) of 16 elements in four words
    quantise8: Any  # packed: 8 codes of two words of elements times an inverse, saturated
    dequantise4: Any  # packed: a word of 4 plain values of the low 4 codes times a scale
    special: Any  # whether a word of 8 codes holds one the packed conversions do not take
    takes: Any  # whether the packed conversions take 16 codes (two words) with a scale, without a branch
    store_chunk: Any  # 16 codes times a scale, packed, as 32 bytes at an address (16-byte stores where aligned)


@functools.lru_cache(maxsize=None)
def ops(codec, dtype):
    """``Fp8Ops`` of ``codec`` (an ``Fp8Codec`` or its name) for elements of the plain ``dtype``."""
    f, name = fp8_format(codec), plain_dtype(dtype)
    packed = packed_ops(f, name)
    return Fp8Ops._make((*quantiser(f, name), dequantiser(f, name), word_dequantiser(f, name), *packed))
