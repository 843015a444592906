"""Packed NVFP4 conversions for ``kernels.nvfp4``: a lane's 16 elements in 32-bit registers, branch-free, bit for
bit ``kvnumba.quant.nvfp4``'s definitions on the inputs they take (the kernel sends every other group through its
exact element functions). sm_90 has no e2m1 conversion (``cvt...e2m1x2`` is sm_100a's), so the rounding is
integer and float32 arithmetic:

- ``encode16(w0, w1, w2, w3, out_bits)``: the 16 e2m1 codes (int64, element ``k`` in bits ``4k..4k+3``) of the
  bfloat16/float16 elements in four 8-byte words times ``out`` (float32 bits), for finite elements and a finite
  ``out >= 0``. Per element ``a = min(|x| * out, 6)`` (``|x| * out`` is ``|x * out|``: ``out`` is not negative;
  6 and above give code 7, as the reference's thresholds do); below 2, ``a + 2**22`` rounds ``a`` to nearest even
  in steps of 0.5, e2m1's own up to 2, and its bits less those of ``2**22`` are the code; from 2 on, the bits
  rounded to one mantissa bit (nearest even) are the code once rebiased. The signs are ``x``'s, gathered by
  byte permutes.
- ``decode4(codes, sf_bits, gs_bits)``: the four bfloat16/float16 elements (one 8-byte word) of the low four
  codes, ``e2m1(c) * |sf|`` (exact) ``* gs`` rounded to nearest even in float32, then into the plain type
  (``cvt.rn``), the sign ``c``'s (the caller flips the codes' sign bits where ``sf`` is negative: rounding to
  nearest even is symmetric, so this is the reference's product). ``sf`` not NaN, ``gs`` finite: no NaN.
  The magnitudes come from two byte tables by ``prmt`` (e2m1's eight values are bfloat16s: a high and a low
  byte each).

On Numba's CUDA simulator both are Python twins (``kernels.simulator.nvfp4_packed``) that run the same steps;
``encode16_ptx``/``decode4_ptx`` give the PTX itself, which tests/quant/test_nvfp4_packed.py interprets.
"""
import functools

from ..driver.target import SIMULATOR
from ..quant.fp8 import plain_dtype

__all__ = ["decode4_ptx", "decoder", "encode16_ptx", "encoder"]

def _widen(word, dtype):
    """PTX: float32 ``x0``, ``x1`` of the two (sign-cleared) elements of 32-bit register ``word``."""
    if dtype == "bfloat16":
        return f"shl.b32 x0, {word}, 16; and.b32 x1, {word}, 0xFFFF0000;"
    return f"mov.b32 {{h0, h1}}, {word}; cvt.f32.f16 x0, h0; cvt.f32.f16 x1, h1;"


def _element(x, k, acc):
    """PTX: the e2m1 magnitude code of ``x * o`` (``x`` >= 0) added into nibble ``k`` of ``acc``."""
    return (f"mul.rn.f32 p, {x}, o; min.u32 p, p, 0x40C00000;\n"
            "add.rn.f32 y, p, 0f4A800000; sub.u32 y, y, 0x4A800000;\n"
            "shr.u32 b, p, 22; and.b32 b, b, 1; add.u32 b, b, p; add.u32 b, b, 0xC11FFFFF; shr.u32 b, b, 22;\n"
            f"setp.lt.u32 q, p, 0x40000000; selp.b32 b, y, b, q; mad.lo.u32 {acc}, b, {1 << 4 * k}, {acc};")


def _signs(words, acc):
    """PTX: the signs of the 8 elements of 32-bit ``words`` (bits 15 and 31 of each) into bit 3 of their nibbles
    of ``acc``: bytes 1 and 3 of the four words gathered, then shifted into place."""
    a, b, c, d = words
    return (f"prmt.b32 s0, {a}, {b}, 0x7351; prmt.b32 s1, {c}, {d}, 0x7351;\n"
            "prmt.b32 s2, s0, s1, 0x5410; prmt.b32 s3, s0, s1, 0x7632;\n"
            "shr.u32 s2, s2, 4; and.b32 s2, s2, 0x08080808; and.b32 s3, s3, 0x80808080;\n"
            f"or.b32 {acc}, {acc}, s2; or.b32 {acc}, {acc}, s3;")


def encode16_ptx(dtype):
    """The PTX body of ``encode16`` for ``dtype`` (operands ``$1``..``$5``, result ``$0``)."""
    parts = []
    for j in range(8):  # word j: elements 2j and 2j + 1
        acc = "lo" if j < 4 else "hi"
        parts.append(f"and.b32 m, a{j}, 0x7FFF7FFF;\n{_widen('m', dtype)}\n"
                     f"{_element('x0', (2 * j) % 8, acc)}\n{_element('x1', (2 * j + 1) % 8, acc)}")
    body = "\n".join(parts)
    return f"""
.reg .b32 a<8>, m, x0, x1, p, y, b, o, lo, hi, s<4>;
.reg .b16 h0, h1;
.reg .pred q;
mov.b64 {{a0, a1}}, $1;
mov.b64 {{a2, a3}}, $2;
mov.b64 {{a4, a5}}, $3;
mov.b64 {{a6, a7}}, $4;
cvt.u32.u64 o, $5;
mov.b32 lo, 0;
mov.b32 hi, 0;
{body}
{_signs(('a0', 'a1', 'a2', 'a3'), 'lo')}
{_signs(('a4', 'a5', 'a6', 'a7'), 'hi')}
mov.b64 $0, {{lo, hi}};"""


def decode4_ptx(dtype):
    """The PTX body of ``decode4`` into ``dtype`` (operands ``$1``..``$3``, result ``$0``). The tables: e2m1's
    magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bfloat16, high bytes then low bytes, four a register."""
    narrow = {"bfloat16": "bf16x2", "float16": "f16x2"}[dtype]
    return f"""
.reg .b32 c, i, th0, th1, tl0, tl1, hb, lb, x<4>, s, g, lo, hi, cs, t;
cvt.u32.u64 c, $1;
cvt.u32.u64 s, $2;
cvt.u32.u64 g, $3;
mov.b32 th0, 0x3F3F3F00; mov.b32 th1, 0x40404040;
mov.b32 tl0, 0xC0800000; mov.b32 tl1, 0xC0804000;
and.b32 i, c, 0x7777;
prmt.b32 hb, th0, th1, i;
prmt.b32 lb, tl0, tl1, i;
prmt.b32 x0, lb, hb, 0x40CC; prmt.b32 x1, lb, hb, 0x51CC;
prmt.b32 x2, lb, hb, 0x62CC; prmt.b32 x3, lb, hb, 0x73CC;
mul.rn.f32 x0, x0, s; mul.rn.f32 x1, x1, s; mul.rn.f32 x2, x2, s; mul.rn.f32 x3, x3, s;
mul.rn.f32 x0, x0, g; mul.rn.f32 x1, x1, g; mul.rn.f32 x2, x2, g; mul.rn.f32 x3, x3, g;
cvt.rn.{narrow}.f32 lo, x1, x0;
cvt.rn.{narrow}.f32 hi, x3, x2;
and.b32 cs, c, 0x8888;
mul.lo.u32 t, cs, 0x1001000; and.b32 t, t, 0x80008000; xor.b32 lo, lo, t;
mul.lo.u32 t, cs, 0x10010; and.b32 t, t, 0x80008000; xor.b32 hi, hi, t;
mov.b64 $0, {{lo, hi}};"""


if SIMULATOR:
    from .simulator.nvfp4_packed import make_decode4, make_encode16
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    def _asm(body, inputs):
        """An intrinsic running PTX ``body`` on ``inputs`` (3 or 5) int64 operands (``$1``...), giving an int64."""
        def codegen(context, builder, sig, values):
            asm = ir.InlineAsm(ir.FunctionType(_I64, [_I64] * inputs), "{\n" + body + "\n}", "=l" + ",l" * inputs)
            return builder.call(asm, [context.cast(builder, v, t, types.int64) for v, t in zip(values, sig.args)])

        def typed(*args):
            return types.int64(*args), codegen

        by_arity = {3: lambda typingctx, a, b, c: typed(a, b, c),
                    5: lambda typingctx, a, b, c, d, e: typed(a, b, c, d, e)}
        return intrinsic(by_arity[inputs])

    def make_encode16(dtype):
        return _asm(encode16_ptx(dtype), 5)

    def make_decode4(dtype):
        return _asm(decode4_ptx(dtype), 3)


@functools.lru_cache(maxsize=None)
def encoder(dtype):
    """``encode16`` for elements of ``dtype`` (``"bfloat16"``/``"float16"``; see the module docstring)."""
    return make_encode16(plain_dtype(dtype))


@functools.lru_cache(maxsize=None)
def decoder(dtype):
    """``decode4`` into ``dtype`` (see the module docstring)."""
    return make_decode4(plain_dtype(dtype))
