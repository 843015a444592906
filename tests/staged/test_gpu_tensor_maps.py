"""The staged kernel's tensor maps on a real GPU: every map ``source_maps`` writes is, byte for byte, the
map the driver encodes for its address (``tensor_maps.encode``).

``plan.tensor_maps`` encodes each geometry in full once and writes later maps of it as a copy with the
address replaced (``cuTensorMapReplaceAddress``): every staged plan after the first of its geometry
relies on the two being the same. (The loads themselves are checked byte for byte in ``test_loads.py``
and ``tests/prepare/test_gpu_plans_by_value.py``.)
"""
import ctypes

import pytest

from kvnumba import config
from kvnumba.driver.devices import on_device
from kvnumba.kernels.layouts import PAGE_FIRST, PAGE_HEAD
from kvnumba.plan import tensor_maps

pytestmark = pytest.mark.gpu

GEOMETRIES = {  # source_maps' arguments after the two addresses: layout, nbytes, item, layout_dim, page, heads
    "page-first": (PAGE_FIRST, 64 * 32 * 2048, 2048, 32 * 2048, 64, 8),
    "page-head": (PAGE_HEAD, 64 * 32 * 2048, 2048, 32 * 2048, 64, 8),
}
RUN_LIMITS, STAGE_BYTES = (5, 4), 128 * 1024
ADDRESSES = [(0x7F00_0000_0000, 0x7F00_1000_0000), (0x7E00_2000_0040, 0x7E00_3000_0080)]  # 16-byte aligned


def _written(maps, k_ptr, v_ptr):
    """``(base, run, the 128 bytes)`` of every map ``maps`` holds (K's, then V's)."""
    address, max_run_log2, min_run = maps.args
    out = []
    for b, base in enumerate((k_ptr, v_ptr)):
        for r in range(min_run.bit_length() - 1, max_run_log2 + 1):
            at = address + (b * (max_run_log2 + 1) + r) * tensor_maps.MAP_BYTES
            out.append((base, 1 << r, bytes((ctypes.c_uint8 * tensor_maps.MAP_BYTES).from_address(at))))
    return out


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@pytest.mark.parametrize("promotion", [None, "L2_128B"])
def test_every_written_map_is_the_one_the_driver_encodes(name, promotion):
    layout, nbytes, item, dim, page, heads = GEOMETRIES[name]
    sizes, strides, _, head_major = tensor_maps.geometry(layout, nbytes, item, dim, page, heads)
    with on_device(0), config.override(map_store=tensor_maps.MapStore(), l2_promotion=promotion):
        written = []
        for k_ptr, v_ptr in ADDRESSES:  # the second address's maps are copies of the first's, re-addressed
            maps = tensor_maps.source_maps(layout, k_ptr, v_ptr, nbytes, item, dim, page, heads, False, RUN_LIMITS,
                                           STAGE_BYTES)
            written += _written(maps, k_ptr, v_ptr)
        assert len(written) == 2 * 2 * 4  # two sources, K and V, pieces of 4, 8, 16 and 32 tokens
        for base, run, got in written:
            want = tensor_maps.encode(base, sizes, strides, tensor_maps.box(sizes, head_major, run),
                                      promotion or tensor_maps.L2_PROMOTION)
            assert got == bytes((ctypes.c_uint8 * tensor_maps.MAP_BYTES).from_address(want.getPtr())), (base, run)
