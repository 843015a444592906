"""The simulator's twins of ``kernels.fp8``'s GPU conversions: the same definitions in NumPy and
``ml_dtypes`` (float32 products rounded to nearest even, saturation at ±``FMT_MAX``, rounding to nearest
even into FP8 and back into bfloat16/float16)."""
import numpy as np

from ...quant.fp8 import PLAIN_DTYPES, fp8_format
from .words import f32_from_bits

__all__ = ["magnitudes", "make_dequantise4", "make_quantise8"]

_WORD = 0xFFFFFFFFFFFFFFFF


def _elements(words, dtype):
    """The 16-bit elements of int64 words (the first element in the low bits), as float32."""
    packed = np.array([int(w) & _WORD for w in words], np.uint64).view(np.uint16)
    return packed.view(PLAIN_DTYPES[dtype]).astype(np.float32)


def magnitudes(w0, w1, w2, w3):
    return max((int(w) >> shift) & 0x7FFF for w in (w0, w1, w2, w3) for shift in (0, 16, 32, 48))


def make_quantise8(fmt, dtype):
    f = fp8_format(fmt)
    limit = np.float32(f.max_value)

    def quantise8(w0, w1, inverse_bits):
        inverse = f32_from_bits(inverse_bits)
        with np.errstate(over="ignore"):
            scaled = np.clip(_elements((w0, w1), dtype) * inverse, -limit, limit)
        return int(scaled.astype(f.dtype).view(np.uint64)[0])

    return quantise8


def make_dequantise4(fmt, dtype):
    f = fp8_format(fmt)

    def dequantise4(codes, scale_bits):
        scale = f32_from_bits(scale_bits)
        values = np.array([int(codes) & 0xFFFFFFFF], np.uint32).view(np.uint8).view(f.dtype).astype(np.float32)
        with np.errstate(over="ignore"):
            plain = (values * scale).astype(np.float32).astype(PLAIN_DTYPES[dtype])
        return int(plain.view(np.uint64)[0])

    return dequantise4
