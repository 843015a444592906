"""Packed NVFP4 conversions for ``kernels.nvfp4``: a lane's 16 elements in 32-bit registers, branch-free, bit for
bit ``kvnumba.quant.nvfp4``'s definitions on the inputs they take (the kernel sends every other group through its
exact element functions). sm_90 has no e2m1 conversion (``cvt...e2m1x2`` is sm_100a's), so quantising counts
thresholds made on the host (``threshold_table``) and dequantising looks its values up:

- ``encode16(w0, w1, w2, w3, t01, t23, t45, t67)``: the 16 e2m1 codes (int64, element ``k`` in bits
  ``4k..4k+3``) of the bfloat16/float16 elements in four 8-byte words, by a row of ``threshold_table`` (four
  8-byte words: seven thresholds, each in both 16-bit halves). ``e2m1(|x| * out)`` does not decrease with
  ``|x|``'s magnitude bits, so the code of an element is the number of the row's thresholds its bits reach:
  compared two at a time as float16 bit patterns (``set.ge.f16x2``: the patterns below 0x7C00 are finite and
  order as their bits), counted in float16 on the float pipe, half the integer work of rounding the products.
  The signs are ``x``'s (``out`` is not negative), gathered by byte permutes. Magnitudes below 0x7C00 only.
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

__all__ = ["NEVER", "THRESHOLDS", "decode4_ptx", "decode4_unit_ptx", "decoder", "encode16_ptx", "encoder",
           "threshold_table", "unit_decoder"]


def _signs(words, acc):
    """PTX: the signs of the 8 elements of 32-bit ``words`` (bits 15 and 31 of each) into bit 3 of their nibbles
    of ``acc``: bytes 1 and 3 of the four words gathered, then shifted into place."""
    a, b, c, d = words
    return (f"prmt.b32 s0, {a}, {b}, 0x7351; prmt.b32 s1, {c}, {d}, 0x7351;\n"
            "prmt.b32 s2, s0, s1, 0x5410; prmt.b32 s3, s0, s1, 0x7632;\n"
            "shr.u32 s2, s2, 4; and.b32 s2, s2, 0x08080808; and.b32 s3, s3, 0x80808080;\n"
            f"or.b32 {acc}, {acc}, s2; or.b32 {acc}, {acc}, s3;")


def _codes(word, j, acc):
    """PTX: the e2m1 magnitude codes of the two elements of 32-bit ``word`` (pair ``j`` of the register ``acc``
    gathers) by the row's thresholds ``t0``..``t6``: ``1024 + `` the count of those a magnitude reaches, summed in
    float16 (exact), whose low bits are the code."""
    counts = "\n".join(f"set.ge.f16x2.f16x2 s, m, t{i}; add.rn.f16x2 c, c, s;" for i in range(7))
    return (f"and.b32 m, {word}, 0x7FFF7FFF; mov.b32 c, 0x64006400;\n{counts}\n"
            "and.b32 c, c, 0x000F000F; shr.u32 s, c, 12; or.b32 c, c, s; and.b32 c, c, 0xFF;\n"
            f"mad.lo.u32 {acc}, c, {1 << 8 * (j % 4)}, {acc};")


def encode16_ptx():
    """The PTX body of ``encode16`` (operands ``$1``..``$8``, result ``$0``)."""
    body = "\n".join(_codes(f"a{j}", j, "lo" if j < 4 else "hi") for j in range(8))
    return f"""
.reg .b32 a<8>, t<8>, m, c, s, lo, hi, s<4>;
mov.b64 {{a0, a1}}, $1;
mov.b64 {{a2, a3}}, $2;
mov.b64 {{a4, a5}}, $3;
mov.b64 {{a6, a7}}, $4;
mov.b64 {{t0, t1}}, $5;
mov.b64 {{t2, t3}}, $6;
mov.b64 {{t4, t5}}, $7;
mov.b64 {{t6, t7}}, $8;
mov.b32 lo, 0;
mov.b32 hi, 0;
{body}
{_signs(('a0', 'a1', 'a2', 'a3'), 'lo')}
{_signs(('a4', 'a5', 'a6', 'a7'), 'hi')}
mov.b64 $0, {{lo, hi}};"""


# e2m1's magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bfloat16: the high bytes (``hb``) and the low bytes (``lb``) of
# codes ``i``'s, looked up by ``prmt``
_BF16_BYTES = """mov.b32 th0, 0x3F3F3F00; mov.b32 th1, 0x40404040; mov.b32 tl0, 0xC0800000; mov.b32 tl1, 0xC0804000;
prmt.b32 hb, th0, th1, i; prmt.b32 lb, tl0, tl1, i;"""
# The codes' signs (bits 3, 7, 11, 15 of ``c``) flipped into the four elements of ``lo`` and ``hi``
_SIGNS = """and.b32 cs, c, 0x8888;
mul.lo.u32 t, cs, 0x1001000; and.b32 t, t, 0x80008000; xor.b32 lo, lo, t;
mul.lo.u32 t, cs, 0x10010; and.b32 t, t, 0x80008000; xor.b32 hi, hi, t;
mov.b64 $0, {lo, hi};"""


def decode4_ptx(dtype):
    """The PTX body of ``decode4`` into ``dtype`` (operands ``$1``..``$3``, result ``$0``)."""
    narrow = {"bfloat16": "bf16x2", "float16": "f16x2"}[dtype]
    return f"""
.reg .b32 c, i, th0, th1, tl0, tl1, hb, lb, x<4>, s, g, lo, hi, cs, t;
cvt.u32.u64 c, $1;
cvt.u32.u64 s, $2;
cvt.u32.u64 g, $3;
and.b32 i, c, 0x7777;
{_BF16_BYTES}
prmt.b32 x0, lb, hb, 0x40CC; prmt.b32 x1, lb, hb, 0x51CC;
prmt.b32 x2, lb, hb, 0x62CC; prmt.b32 x3, lb, hb, 0x73CC;
mul.rn.f32 x0, x0, s; mul.rn.f32 x1, x1, s; mul.rn.f32 x2, x2, s; mul.rn.f32 x3, x3, s;
mul.rn.f32 x0, x0, g; mul.rn.f32 x1, x1, g; mul.rn.f32 x2, x2, g; mul.rn.f32 x3, x3, g;
cvt.rn.{narrow}.f32 lo, x1, x0;
cvt.rn.{narrow}.f32 hi, x3, x2;
{_SIGNS}"""


def decode4_unit_ptx(dtype):
    """The PTX body of ``decode4_unit`` into ``dtype`` (operands ``$1``, ``$2``, result ``$0``): with a global scale
    of 1, ``e2m1(c) * |sf|`` is the element exactly (at most six significant bits, within range), so two packed
    products (``fma.rn.*x2`` adding -0, which keeps a product's zero) make the four elements, from e2m1's values in
    the plain type looked up by ``prmt`` (float16's low bytes are all zero: one table)."""
    if dtype == "bfloat16":
        pair, scale = "bf16x2", "shr.u32 s, s, 16;"
        values = _BF16_BYTES + "\nprmt.b32 lo, lb, hb, 0x5140; prmt.b32 hi, lb, hb, 0x7362;"
    else:
        pair, scale = "f16x2", "mov.b32 f, s; cvt.rn.f16.f32 h, f; mov.b32 s, {h, h};"
        values = ("mov.b32 th0, 0x3E3C3800; mov.b32 th1, 0x46444240;\nprmt.b32 hb, th0, th1, i;\n"
                  "prmt.b32 lo, hb, hb, 0x1808; prmt.b32 hi, hb, hb, 0x3828;")
    return f"""
.reg .b32 c, i, th0, th1, tl0, tl1, hb, lb, s, f, z, lo, hi, cs, t;
.reg .b16 h;
cvt.u32.u64 c, $1;
cvt.u32.u64 s, $2;
mov.b32 z, 0x80008000;
{scale}
prmt.b32 s, s, s, 0x1010;
and.b32 i, c, 0x7777;
{values}
fma.rn.{pair} lo, lo, s, z;
fma.rn.{pair} hi, hi, s, z;
{_SIGNS}"""


if SIMULATOR:
    from .simulator.nvfp4_packed import make_decode4, make_decode4_unit, make_encode16
else:
    from .fp8 import _asm  # one helper for inline PTX on int64 operands

    def make_encode16():
        return _asm(encode16_ptx(), 8)

    def make_decode4(dtype):
        return _asm(decode4_ptx(dtype), 3)

    def make_decode4_unit(dtype):
        return _asm(decode4_unit_ptx(dtype), 2)


@functools.lru_cache(maxsize=None)
def encoder():
    """``encode16`` (see the module docstring; the thresholds hold the plain dtype)."""
    return make_encode16()


THRESHOLDS = 8  # 32-bit words a row: seven thresholds, each in both halves, and a pad
NEVER = 0x7C00  # float16 +inf's bits: no finite magnitude reaches it


@functools.lru_cache(maxsize=64)
def threshold_table(k_unscale_bits, v_unscale_bits, dtype):
    """``uint32 [2, 128, THRESHOLDS]``: for K then V (``unscale``: the float32 bits of ``rcp(1 / global_scale)``)
    and each e4m3 scale code, the seven magnitude bits (``x & 0x7FFF``) at which ``e2m1(|x| * out)`` first reaches
    codes 1..7, ``out`` the kernel's for that code (``rcp(e4m3(code) * unscale)``, 0 for a zero scale), the
    reference's arithmetic throughout; ``NEVER`` where no magnitude below 0x7C00 does (the packed path takes only
    those: bfloat16 magnitudes from there on go element by element). Codes whose ``out`` is not finite (and NaN's,
    0x7F) have rows of ``NEVER``: their groups go element by element."""
    import ml_dtypes
    import numpy as np

    from ..quant.nvfp4 import _e2m1, _rcp
    from ..quant.fp8 import PLAIN_DTYPES

    magnitudes = np.arange(NEVER, dtype=np.uint16)
    x = magnitudes.view(PLAIN_DTYPES[plain_dtype(dtype)]).astype(np.float32)
    sf = np.arange(128, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    table = np.full((2, 128, THRESHOLDS), NEVER * 0x10001, np.uint32)
    for kind, unscale in enumerate((k_unscale_bits, v_unscale_bits)):
        with np.errstate(all="ignore"):
            out = np.where(sf != 0, _rcp(sf * np.uint32(unscale).view(np.float32)), np.float32(0)).astype(np.float32)
            for code in np.nonzero(np.isfinite(out))[0]:
                codes = _e2m1((x * out[code]).astype(np.float32))  # non-decreasing in the magnitude bits
                first = np.searchsorted(codes, np.arange(1, 8), side="left").astype(np.uint32)
                table[kind, code, :7] = first * 0x10001
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=None)
def decoder(dtype):
    """``decode4`` into ``dtype`` (see the module docstring)."""
    return make_decode4(plain_dtype(dtype))


@functools.lru_cache(maxsize=None)
def unit_decoder(dtype):
    """``decode4_unit(codes, sf_bits)``: ``decode4`` with a global scale of 1, by packed products
    (``decode4_unit_ptx``)."""
    return make_decode4_unit(plain_dtype(dtype))
