"""``Codec``: what the package must know of a quantised KV format, in one object.

A codec says how wide its codes are, how many elements share a scale and what a scale is, *where the
scales live*, and its NumPy reference (``quantise``/``dequantise``, the definition the kernels match bit
for bit). Where the scales live decides how a copy moves a token: beside the codes (one run a head), in an
array of their own beside the cache (kvnumba's FP8: ``kv.Fp8View``'s scales view, one float32 per token,
layer, K/V and head), or in a region of the page (vLLM's NVFP4: a head's codes and scales are two runs of
the same page). The kernels that inline its device encode and decode are named by ``kernels``; the plan of
a copy with a view of this codec on a side is found by ``family`` (``kvnumba.plan.build``).
"""
from __future__ import annotations

from enum import Enum
from typing import Any


class ScaleHome(Enum):
    """Where a codec's scales are kept."""

    NONE = "none"  # unscaled codes: nothing beside them
    ARRAY = "array"  # a separate array shaped like the cache, one scale per (token, layer, K/V, head)
    PAGE = "page"  # a region of each page, after the codes of the same side


class Codec:
    """A quantised format (see the module docstring). Subclasses set the class attributes and define
    ``quantise`` and ``dequantise`` over arrays whose last axis is a head's elements."""

    name: str = ""
    family: str = ""  # the plan that copies it: "fp8", "nvfp4"
    code_bits: int = 8  # bits of one element's code
    group: int = 0  # elements that share a scale (0: the whole head)
    scale_dtype: Any = None  # NumPy dtype of one scale
    scales: ScaleHome = ScaleHome.NONE
    kernels: str = ""  # the module whose ops(codec, dtype) gives the device functions (kernels.factory.codec_ops)

    def code_bytes(self, head_dim: int) -> int:
        """Bytes of a head's codes."""
        return head_dim * self.code_bits // 8

    def scale_count(self, head_dim: int) -> int:
        """Scales of a head."""
        return 1 if self.group == 0 else head_dim // self.group

    def quantise(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def dequantise(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<codec {self.name}: {self.code_bits}-bit codes, scales {self.scales.value}>"


__all__ = ["Codec", "ScaleHome"]
