"""The quantised copies' kernels take the codec (``kvnumba.quant``) as a parameter: each is built once per codec
and keyed by it (``kernels.factory.memoised``), and finds the codec's device functions through the module its
``kernels`` names (``factory.codec_ops``), so a codec of the same shape plugs into the same kernels. Pure logic:
building a kernel compiles nothing (the GPU compiles it at its first launch)."""
import ml_dtypes
import pytest

from kvnumba.kernels import dequantise_pipelined, factory, fp8, layouts as L, quantise_wide, scaled_copy
from kvnumba.quant import E4M3, E5M2, Fp8Codec

asked = []


def ops(codec, dtype):
    """The device functions of ``TWIN`` (this module is its ``kernels``): E4M3's, the asking noted."""
    asked.append((codec.name, dtype))
    return fp8.ops(E4M3, dtype)


TWIN = Fp8Codec("twin", ml_dtypes.float8_e4m3fn, 448.0, 0x7E, 0x7F, 4, 3, 7, False, 0x7F)
TWIN.kernels = __name__


def test_each_kernel_is_built_once_per_codec():
    one = scaled_copy.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, "dequantise", E4M3, "bfloat16")
    assert one is scaled_copy.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, "dequantise", E4M3, "bfloat16")
    assert one is not scaled_copy.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, "dequantise", E5M2, "bfloat16")
    wide = quantise_wide.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, E5M2, "float16")
    assert wide is quantise_wide.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, E5M2, "float16")
    assert wide is not one


def test_a_codec_finds_its_device_functions_through_its_kernels_module():
    assert factory.codec_ops(E5M2, "float16") is fp8.ops(E5M2, "float16")
    assert fp8.ops(E5M2, "float16").takes is not fp8.ops(E4M3, "float16").takes  # made from each codec's constants
    asked.clear()
    dequantise_pipelined.get_kernel(L.PAGE_FIRST, L.LAYER_TABLE, False, TWIN, "float16", head_dim=64)
    assert asked == [("twin", "float16")]


def test_the_kernels_refuse_what_is_not_a_codec():
    with pytest.raises(TypeError, match="codec must be a kvnumba.quant.codec.Codec"):
        quantise_wide.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, "e4m3")
    with pytest.raises(ValueError, match="mode must be one of"):
        scaled_copy.get_kernel(L.PAGE_FIRST, L.LAYER_FIRST, False, "convert", E4M3)
