"""The FP8 kernels compile for sm_90 (no GPU needed): IEEE float32 division and multiplication (no
approximations, no flush to zero), the warp's amax by shuffles, cache-hinted loads and stores, no local
memory. Runs in a subprocess with NUMBA_ENABLE_CUDASIM=0, as tests/kernels/test_ptx.py does; skipped
where libNVVM is not installed. Three kernels (one per mode): compiling takes some 25 s a kernel."""

import pytest

from tests.helpers.ptx import ptx_report as run_ptx_script

SCRIPT = r"""
import json, re
from kvnumba.api.views import PageFirstDirect
from kvnumba.kernels import fp8_copy, layouts as L
cases = {"quantise": (L.PAGE_FIRST, L.BLOCKS, False, "quantise", "e4m3", "bfloat16"),
         "dequantise": (L.HEAD_MAJOR_BLOCKS, L.PAGE_HEAD, False, "dequantise", "e5m2", "float16"),
         "copy": (L.LAYER_TABLE, PageFirstDirect.parts, True, "copy", "e4m3", "bfloat16")}
out = {}
for name, args in cases.items():
    ptx = fp8_copy.kernel_ptx(*args, cc=(9, 0))
    out[name] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "ops": sorted(set(re.findall(r"(?:ld|st)\.global\.[a-z0-9.]+", ptx))),
                 "float": sorted(set(re.findall(r"(?:div|mul|fma)\.[a-z0-9.]*f32", ptx))),
                 "shfl": "shfl.sync.bfly" in ptx, "local": ".local" in ptx}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    return run_ptx_script(SCRIPT, timeout=900)


def test_fp8_kernels_compile_for_sm90(report):
    assert set(report) == {"quantise", "dequantise", "copy"}
    for name, r in report.items():
        assert r["target"] == "sm_90", name
        assert not r["local"], f"{name} spills to local memory"


def test_float32_arithmetic_is_ieee(report):
    assert report["quantise"]["float"] == ["div.rn.f32"]
    assert report["dequantise"]["float"] in (["mul.f32"], ["mul.rn.f32"])  # PTX's mul.f32 rounds to nearest even
    assert report["quantise"]["shfl"]


def test_cache_hinted_memory_operations(report):
    for name, r in report.items():
        assert all(op.startswith(("ld.global.nc", "st.global.cg")) for op in r["ops"]), (name, r["ops"])
