"""kvnumba's quantised formats, one codec a module (``Codec``: ``kvnumba.quant.codec``): FP8 with a float32
scale per head in an array of its own (``E4M3``, ``E5M2``: ``kvnumba.quant.fp8``), and vLLM's NVFP4 pages
(``NVFP4``: ``kvnumba.quant.nvfp4``). Each module holds its codec, its constants and its NumPy reference."""
from .codec import Codec, ScaleHome
from .fp8 import E4M3, E5M2, Fp8Codec
from .nvfp4 import NVFP4, Nvfp4Codec

__all__ = ["E4M3", "E5M2", "NVFP4", "Codec", "Fp8Codec", "Nvfp4Codec", "ScaleHome"]
