# kvnumba.kernels.fp8's GPU names on numba-cuda-mlir: the same PTX bodies, through inline_ptx instead of
# an llvmlite InlineAsm intrinsic ($N operands become inline_ptx's %N; one device function per operand count).
from numba_cuda_mlir import cuda as _cuda
from numba_cuda_mlir.cuda import experimental as _cx
from numba_cuda_mlir.numba_cuda.types import int64 as _int64

_device = _cuda.jit(device=True, inline="always")


def _asm(body, inputs):
    """A device function running PTX ``body`` on ``inputs`` (2, 3 or 4) int64 operands, giving an int64."""
    text = "{\n" + body.replace("$", "%") + "\n}"
    if inputs == 2:
        @_device
        def run(a, b):
            return _int64(_cx.inline_ptx(text, "=l", 0, "l", _int64(a), "l", _int64(b)))
    elif inputs == 3:
        @_device
        def run(a, b, c):
            return _int64(_cx.inline_ptx(text, "=l", 0, "l", _int64(a), "l", _int64(b), "l", _int64(c)))
    else:
        @_device
        def run(a, b, c, d):
            return _int64(_cx.inline_ptx(text, "=l", 0, "l", _int64(a), "l", _int64(b), "l", _int64(c),
                                         "l", _int64(d)))
    return run

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
