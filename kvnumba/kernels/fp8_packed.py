"""Packed FP8 conversions for the fast kernels (``kernels.quantise_wide``, ``dequantise_pipelined``,
``dequantise_staged``): several elements per instruction with the GPU's own conversions (``cvt...e4m3x2``/
``e5m2x2``, compute capability 9.0), for the heads the format treats plainly. They agree bit for bit with
``kvnumba.quant_reference`` on those inputs; the kernels send every other head through ``kernels.fp8``'s exact
element functions.

Names (made per format and plain dtype by ``packed_ops``, which ``kernels.fp8.ops`` memoises; each returns
int64 bits):

- ``magnitudes(w0, w1, w2, w3)``: the largest magnitude bits (``x & 0x7FFF``) of the 16 bfloat16/float16
  elements in four 8-byte words, infinities and NaNs included (their bits order above every finite
  magnitude, so the kernel sees at once whether a head holds one);
- ``quantise8(w0, w1, inverse_bits)``: the 8 codes of the 8 elements in two words, ``fp8(float32(x) *
  inverse)`` rounded to nearest even and saturated at ±``FMT_MAX``; finite elements and a finite inverse;
- ``dequantise4(codes, scale_bits)``: the 4 bfloat16/float16 elements (one 8-byte word) of the low 4
  codes times the scale, ``float32(decode(c)) * scale`` rounded to nearest even; codes that are not NaN
  (nor e5m2 infinities) and a finite scale, so that no product is NaN;
- ``special(word)``: whether any of a word's 8 codes is one ``dequantise4`` does not take;
- ``takes(scale_bits, low, high)``: whether ``dequantise4`` takes 16 codes (two words) with that scale: a
  finite scale and no special code, in a few whole-word operations (the fast kernels' test before they
  convert a lane's codes straight through);
- ``store(address, low, high, scale_bits)``: a 16-code chunk (two int64 words) dequantised by
  ``dequantise4`` into 32 bytes at ``address`` (the staged kernel's store).

On Numba's CUDA simulator the first three are NumPy twins (``kernels.simulator.fp8_packed``) that compute
the same definitions with ``ml_dtypes``.
"""
from ..driver.target import SIMULATOR
from .jit import device_function
from .words import store_pair

__all__ = ["magnitudes", "make_dequantise4", "make_quantise8", "packed_ops"]

if SIMULATOR:
    from .simulator.fp8_packed import magnitudes, make_dequantise4, make_quantise8
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    def _asm(body, inputs):
        """An intrinsic running PTX ``body`` on ``inputs`` (2, 3 or 4) int64 operands (``$1``...), giving an
        int64 (``$0``)."""
        def codegen(context, builder, sig, values):
            asm = ir.InlineAsm(ir.FunctionType(_I64, [_I64] * inputs), "{\n" + body + "\n}", "=l" + ",l" * inputs)
            return builder.call(asm, [context.cast(builder, v, t, types.int64) for v, t in zip(values, sig.args)])

        def typed(*args):
            return types.int64(*args), codegen

        # an intrinsic's typer names its operands (Numba does not lower a *args one)
        by_arity = {2: lambda typingctx, a, b: typed(a, b),
                    3: lambda typingctx, a, b, c: typed(a, b, c),
                    4: lambda typingctx, a, b, c, d: typed(a, b, c, d)}
        return intrinsic(by_arity[inputs])

    magnitudes = _asm("""
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
    cvt.u64.u32 $0, a0;""", 4)

    def _widen_pair(word, first):
        """PTX: float32 registers ``x{first}``, ``x{first + 1}`` from the two elements of 32-bit ``word``."""
        return {
            "bfloat16": f"shl.b32 t, {word}, 16; mov.b32 x{first}, t;\n"
                        f"and.b32 t, {word}, 0xFFFF0000; mov.b32 x{first + 1}, t;",
            "float16": f"mov.b32 {{h0, h1}}, {word}; cvt.f32.f16 x{first}, h0; cvt.f32.f16 x{first + 1}, h1;",
        }

    def make_quantise8(fmt, dtype):
        widen = "\n".join(_widen_pair(f"a{i}", 2 * i)[dtype] for i in range(4))
        scale = "\n".join(f"mul.rn.f32 x{i}, x{i}, s;" for i in range(8))
        narrow = "\n".join(f"cvt.rn.satfinite.{fmt}x2.f32 c{i}, x{2 * i + 1}, x{2 * i};" for i in range(4))
        return _asm(f"""
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
    mov.b64 $0, {{lo, hi}};""", 3)

    def make_dequantise4(fmt, dtype):
        narrow = {"bfloat16": "bf16x2", "float16": "f16x2"}[dtype]
        return _asm(f"""
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
    mov.b64 $0, {{lo, hi}};""", 2)


def packed_ops(f, dtype):
    """``(magnitudes, quantise8, dequantise4, special, takes, store)`` for the FP8 codec ``f`` and the plain
    ``dtype`` (see the module docstring; ``kernels.fp8.ops`` memoises them with the exact functions)."""
    dequantise4 = make_dequantise4(f.name, dtype)
    special, takes = _special_codes(f)

    @device_function
    def store(address, low, high, scale_bits):
        """The 16 codes of ``low`` and ``high`` (the first in ``low``'s low byte) times the scale, as 32 bytes
        of bfloat16/float16 at ``address``, in two 16-byte stores where ``address`` allows."""
        store_pair(address, dequantise4(low, scale_bits), dequantise4(low >> 32, scale_bits))
        store_pair(address + 16, dequantise4(high, scale_bits), dequantise4(high >> 32, scale_bits))

    return magnitudes, make_quantise8(f.name, dtype), dequantise4, special, takes, store


def _special_codes(f):
    """``special(word)``: whether any of the 8 codes in an int64 word has a magnitude of ``f.special_from`` or
    more (e4m3: a NaN, ``0x7F``; e5m2: an infinity or NaN, ``0x7C`` and up): a byte's magnitude plus the
    distance to that magnitude carries into its top bit. Integer arithmetic, the same on both targets.
    ``takes(scale_bits, low, high)``: whether ``dequantise4`` takes the 16 codes of int64 words ``low`` and
    ``high`` times the float32 whose bits are ``scale_bits``: the scale is finite and neither word holds a
    special code (a test on 32-bit halves: on whole int64 words a top byte's sum would overflow the sign bit,
    which NVVM takes never to happen, and it dropped that byte's test)."""
    carry = 0x01010101 * (0x80 - f.special_from)

    @device_function
    def special(word):
        low = (word & 0x7F7F7F7F) + carry
        high = ((word >> 32) & 0x7F7F7F7F) + carry
        return ((low | high) & 0x80808080) != 0

    @device_function
    def takes(scale_bits, low, high):
        return ((scale_bits & 0x7F800000) != 0x7F800000) & (not (special(low) | special(high)))  # no branch

    return special, takes
