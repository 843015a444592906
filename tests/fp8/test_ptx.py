"""The FP8 kernels compile for sm_90 (no GPU needed): IEEE float32 division and multiplication (no
approximations, no flush to zero), the warp's amax by shuffles, cache-hinted loads and stores, no local
memory; the wide quantiser and the pipelined dequantiser convert with the GPU's packed FP8 instructions,
and the pipelined one reads through asynchronous copies into shared memory. Runs in a subprocess with
NUMBA_ENABLE_CUDASIM=0, as tests/kernels/test_ptx.py does; skipped where libNVVM is not installed. Five
kernels (the general one per mode, the two fast ones): 1-10 s each on a 2-core machine."""

import re

import pytest

from tests.helpers.ptx import ptx_report as run_ptx_script

SCRIPT = r"""
import json, re
from kvnumba.layouts import PageFirstDirect
from kvnumba.layouts.vllm import BLOCKS, HEAD_MAJOR_BLOCKS
from kvnumba.kernels import dequantise_pipelined, layouts as L, quantise_wide, scaled_copy
from kvnumba.quant import E4M3, E5M2
cases = {"quantise": (scaled_copy, L.PAGE_FIRST, BLOCKS, False, "quantise", E4M3, "bfloat16"),
         "dequantise": (scaled_copy, HEAD_MAJOR_BLOCKS, L.PAGE_HEAD, False, "dequantise", E5M2, "float16"),
         "copy": (scaled_copy, L.LAYER_TABLE, PageFirstDirect.parts, True, "copy", E4M3, "bfloat16"),
         "wide quantise": (quantise_wide, L.LAYER_TABLE, L.PAGE_FIRST, False, E4M3, "bfloat16"),
         "pipelined dequantise": (dequantise_pipelined, L.PAGE_FIRST, L.LAYER_TABLE, False, E5M2, "float16")}
out = {}
for name, (module, *args) in cases.items():
    ptx = module.kernel_ptx(*args, cc=(9, 0))
    out[name] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "ops": sorted(set(re.findall(r"(?:ld|st)\.global\.[a-z0-9.]+", ptx))),
                 "float": sorted(set(re.findall(r"(?:div|mul|fma)\.[a-z0-9.]*f32", ptx))),
                 "cvt": sorted(set(re.findall(r"cvt\.rn\.[a-z0-9.]*(?:e4m3x2|e5m2x2|bf16x2|f16x2)[a-z0-9.]*", ptx))),
                 "u16x2": "max.u16x2" in ptx, "shfl": "shfl.sync.bfly" in ptx, "vote": "vote.sync.any" in ptx,
                 "async": sorted(set(re.findall(r"cp\.async\.[a-z_.]+(?: \[[^]]*\], \[[^]]*\], \d+)?", ptx))),
                 "local": ".local" in ptx}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    return run_ptx_script(SCRIPT, timeout=900)


def test_fp8_kernels_compile_for_sm90(report):
    assert set(report) == {"quantise", "dequantise", "copy", "wide quantise", "pipelined dequantise"}
    for name, r in report.items():
        assert r["target"] == "sm_90", name
        assert not r["local"], f"{name} spills to local memory"


def test_float32_arithmetic_is_ieee(report):
    # division for the scale, its inverse (and where the inverse overflows); multiplication by the inverse.
    # PTX's mul.f32 rounds to nearest even (as mul.rn.f32), without flushing subnormals
    for name in ("quantise", "wide quantise"):
        assert set(report[name]["float"]) - {"mul.f32", "mul.rn.f32"} == {"div.rn.f32"}, report[name]["float"]
    assert report["dequantise"]["float"] in (["mul.f32"], ["mul.rn.f32"])
    assert report["quantise"]["shfl"]


def test_the_wide_kernels_convert_with_packed_instructions(report):
    """Eight codes by four cvt...x2 a lane-word, each head's amax by max.u16x2 and shuffles, the odd passes
    found by a warp vote."""
    assert report["wide quantise"]["cvt"] == ["cvt.rn.satfinite.e4m3x2.f32"]
    assert report["wide quantise"]["u16x2"] and report["wide quantise"]["shfl"] and report["wide quantise"]["vote"]
    assert set(report["pipelined dequantise"]["cvt"]) == {"cvt.rn.f16x2.e5m2x2", "cvt.rn.f16x2.f32"}


def test_the_pipelined_kernel_reads_through_asynchronous_copies(report):
    """Codes 8 bytes and scales 4 a lane by cp.async into shared memory, in groups it waits for; no load of
    global memory but the items' indices (and a layer table's entries)."""
    kinds = {re.sub(r" \[.*\], (\d+)$", r" \1", op) for op in report["pipelined dequantise"]["async"]}
    assert kinds == {"cp.async.ca.shared.global 8", "cp.async.ca.shared.global 4", "cp.async.commit_group",
                     "cp.async.wait_group"}, kinds
    assert report["pipelined dequantise"]["ops"] == ["ld.global.nc.b64", "st.global.cg.b64", "st.global.cg.v2.b64"]


def test_cache_hinted_memory_operations(report):
    for name, r in report.items():
        assert all(op.startswith(("ld.global.nc", "st.global.cg")) for op in r["ops"]), (name, r["ops"])


TAKES_SCRIPT = r"""
import json, re
from numba import cuda, types
from kvnumba.kernels.fp8 import ops
out = {}
for fmt in ("e4m3", "e5m2"):
    takes = ops(fmt, "bfloat16").takes

    def kernel(flags, words):
        flags[0] = 1 if takes(words[0], words[1], words[2]) else 0

    ptx, _ = cuda.compile_ptx(kernel, (types.int64[:], types.int64[:]), cc=(9, 0))
    out[fmt] = sorted({int(v) for v in re.findall(r"and\.b64\s+%rd\d+, %rd\d+, (\d+);", ptx)})
print(json.dumps(out))
"""


def test_the_packed_test_of_16_codes_looks_at_every_byte():
    """The packed ``takes`` (``kernels.fp8``) tests each code's magnitude plus a carry for a top bit. Done on whole
    int64 words, a top byte's sum overflows the sign bit, and NVVM, taking signed overflow never to happen, dropped
    the top byte of each word (masks 0x007F7F7F7F7F7F7F and 0x0080808080808080): on an H200 NaN codes there
    went through the packed conversions (2026-12-03). On 32-bit halves every byte is masked and tested."""
    masks = run_ptx_script(TAKES_SCRIPT, timeout=300)
    for fmt, found in masks.items():
        assert {0x7F7F7F7F, 0x80808080, 0x7F800000} <= set(found), (fmt, [hex(m) for m in found])
        assert all(m < 1 << 32 for m in found), (fmt, [hex(m) for m in found])
