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

magnitudes = _asm(_MAGNITUDES, 4)  # the PTX texts: kvnumba.kernels.fp8's, defined before its GPU branch


def make_quantise8(fmt, dtype):
    return _asm(_quantise8(fmt, dtype), 3)


def make_dequantise4(fmt, dtype):
    return _asm(_dequantise4(fmt, dtype), 2)
