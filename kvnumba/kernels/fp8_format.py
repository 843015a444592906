"""The FP8 formats' constants, defined once: the NumPy reference (``kvnumba.quant_reference``, which says what
the format is byte for byte) and the kernels (``kvnumba.kernels.fp8``) read them here."""
from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np


class Fp8Format(NamedTuple):
    """One FP8 format's constants (see the module docstring)."""

    name: str
    dtype: Any  # the ml_dtypes type
    max_value: float  # FMT_MAX
    max_code: int  # the code of +FMT_MAX
    nan_code: int  # the code of a NaN (| 0x80 for a negative one)
    exponent_bits: int
    mantissa_bits: int
    bias: int


FORMATS = {
    "e4m3": Fp8Format("e4m3", ml_dtypes.float8_e4m3fn, 448.0, 0x7E, 0x7F, 4, 3, 7),
    "e5m2": Fp8Format("e5m2", ml_dtypes.float8_e5m2, 57344.0, 0x7B, 0x7E, 5, 2, 15),
}

PLAIN_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
CANONICAL_NAN = {"bfloat16": 0x7FC0, "float16": 0x7E00}


def fp8_format(fmt: str) -> Fp8Format:
    """The format named ``fmt`` (``"e4m3"`` or ``"e5m2"``); ``ValueError`` otherwise."""
    found = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if found is None:
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2', got {fmt!r}")
    return found


def plain_dtype(dtype: Any) -> str:
    """``"bfloat16"`` or ``"float16"`` for a dtype (NumPy, ml_dtypes, torch or its name); ``TypeError``
    otherwise."""
    name = str(getattr(dtype, "name", dtype)).removeprefix("torch.")
    if name in ("bfloat16", "float16"):
        return name
    if name == "half":
        return "float16"
    raise TypeError(f"an FP8 cache quantises bfloat16 or float16 values, got dtype {dtype!r}")


__all__ = ["CANONICAL_NAN", "FORMATS", "PLAIN_DTYPES", "Fp8Format", "fp8_format", "plain_dtype"]
