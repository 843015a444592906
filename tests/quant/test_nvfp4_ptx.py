"""The NVFP4 kernels compile for sm_90 (no GPU needed): no local memory, IEEE float32 (no approximate reciprocal,
no flush to zero but the reference's own), the scales gathered by shuffles, and memory moved in 8-byte words of
codes and 4-byte words of scales (never a byte at a time: a load of NVFP4 pages from host memory crosses the link
in wide reads), cache-hinted. Runs in a subprocess with NUMBA_ENABLE_CUDASIM=0; skipped where libNVVM is not
installed. Four kernels: 1-20 s each on a 2-core machine."""
import pytest

from tests.helpers.ptx import ptx_report

SCRIPT = r"""
import json, re
from kvnumba.kernels import nvfp4, nvfp4_load, layouts as L
cases = {"quantise": ("quantise", L.LAYER_TABLE, False, True, "bfloat16"),
         "dequantise": ("dequantise", L.PAGE_FIRST, True, False, "float16"),
         "copy": ("copy", None, False, True, "bfloat16")}
out = {}
ptxs = {name: nvfp4.kernel_ptx(*args, cc=(9, 0)) for name, args in cases.items()}
ptxs["load"] = nvfp4_load.kernel_ptx(L.LAYER_TABLE, False, "bfloat16", 8, cc=(9, 0))
for name, ptx in ptxs.items():
    out[name] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1), "local": ".local" in ptx,
                 "ops": sorted(set(re.findall(r"(?:ld|st)\.global\.[a-z0-9.]+", ptx))),
                 "float": sorted(set(re.findall(r"(?:div|mul|fma|rcp|add)\.[a-z0-9.]*f32", ptx))),
                 "shfl": "shfl.sync.idx" in ptx, "prmt": "prmt.b32" in ptx, "hset": "set.ge.f16x2.f16x2" in ptx,
                 "cvt": sorted(set(re.findall(r"cvt\.rn\.[a-z0-9]+x2\.f32", ptx))),
                 "async": sorted(set(re.findall(r"cp\.async\.ca\.shared\.global \[[^]]*\], \[[^]]*\], \d+", ptx)))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    return ptx_report(SCRIPT, timeout=900)


def test_they_compile_for_sm90_without_local_memory(report):
    for name, r in report.items():
        assert r["target"] == "sm_90" and not r["local"], name


def test_float32_arithmetic_is_ieee(report):
    allowed = {"mul.f32", "mul.rn.f32", "add.f32", "add.rn.f32", "rcp.rn.f32", "div.rn.f32"}
    assert set(report["quantise"]["float"]) <= allowed
    assert report["quantise"]["shfl"]
    assert set(report["dequantise"]["float"]) == {"mul.f32", "mul.rn.f32"} and report["copy"]["float"] == []


def test_memory_moves_in_words(report):
    for name, r in report.items():
        if name == "load":
            continue  # its reads are asynchronous copies (below)
        assert all(op.startswith(("ld.global.nc", "st.global.cg")) for op in r["ops"]), (name, r["ops"])
        assert {op.rsplit(".", 1)[1] for op in r["ops"]} <= {"b32", "b64"}, (name, r["ops"])
    assert "ld.global.nc.v2.b64" in report["quantise"]["ops"]  # a group's bfloat16 in two 16-byte loads
    assert "st.global.cg.v2.b64" in report["dequantise"]["ops"]  # and out in two 16-byte stores


def test_the_packed_conversions_are_inline(report):
    """e2m1 codes by the packed path (a row of thresholds compared two elements at a time, byte permutes) and
    elements by byte tables and packed conversions, in registers: no local memory, checked above."""
    assert report["quantise"]["prmt"] and report["quantise"]["hset"] and report["dequantise"]["prmt"]
    assert report["dequantise"]["cvt"] == ["cvt.rn.f16x2.f32"]


def test_the_pipelined_load_reads_by_asynchronous_copies(report):
    """Codes 8 bytes and scale words 4 bytes a copy, into shared memory; its global accesses are its stores (16
    bytes where aligned) and the item indices and layer table it reads."""
    load = report["load"]
    assert sorted({a.rsplit(", ", 1)[1] for a in load["async"]}) == ["4", "8"]
    assert "st.global.cg.v2.b64" in load["ops"] and load["prmt"] and not load["local"]
