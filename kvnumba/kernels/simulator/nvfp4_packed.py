"""The simulator's twins of ``kernels.nvfp4_packed``'s PTX: the same steps on Python ints and NumPy float32 scalars
(products rounded to nearest even, as ``mul.rn``): codes counted against a row of thresholds, elements from two
products and ``cvt.rn``, so that the simulated kernel runs the GPU's arithmetic, not the reference's."""
import ml_dtypes
import numpy as np

from .words import f32_bits, f32_from_bits

__all__ = ["make_decode4", "make_decode4_unit", "make_encode16"]

E2M1_BITS = (0, 0x3F000000, 0x3F800000, 0x3FC00000, 0x40000000, 0x40400000, 0x40800000, 0x40C00000)


def make_encode16():
    def encode16(w0, w1, w2, w3, t01, t23, t45, t67):
        rows = [int(t) & 0xFFFF for t in (t01, t01 >> 32, t23, t23 >> 32, t45, t45 >> 32, t67)]
        codes = 0
        for e, word in enumerate(int(w) >> s & 0xFFFF for w in (w0, w1, w2, w3) for s in (0, 16, 32, 48)):
            codes |= (sum((word & 0x7FFF) >= t for t in rows) | (word >> 12 & 8)) << 4 * e
        return codes - (1 << 64) if codes >> 63 else codes  # the int64 the GPU's register holds

    return encode16


def make_decode4(dtype):
    plain = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16

    def decode4(codes, sf_bits, gs_bits):
        out = 0
        for e in range(4):
            c = int(codes) >> 4 * e & 0xF
            with np.errstate(all="ignore"):
                p = f32_from_bits(E2M1_BITS[c & 7]) * f32_from_bits(sf_bits) * f32_from_bits(gs_bits)
                half = int(np.array([p], np.float32).astype(plain).view(np.uint16)[0])
            out |= (half ^ (c & 8) << 12) << 16 * e
        return out - (1 << 64) if out >> 63 else out

    return decode4


def make_decode4_unit(dtype):
    decode4 = make_decode4(dtype)
    one = f32_bits(1)

    def decode4_unit(codes, sf_bits):  # the products are exact: decode4's with a global scale of 1
        return decode4(codes, sf_bits, one)

    return decode4_unit
