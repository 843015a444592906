"""The GPU kernels compile for sm_90 with the seed's cache-hinted loads and stores (no GPU needed).

Runs in a subprocess with NUMBA_ENABLE_CUDASIM=0, since the simulator has no compiler: the GPU target, even
without a CUDA driver (unset, kvnumba would pick the simulator there).
"""

import pytest

from tests.helpers.ptx import ptx_report as run_ptx_script

SCRIPT = r"""
import json, re
from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS
from kvnumba.kernels.factory import copy_shape_for, kernel_ptx
from kvnumba.kernels.layouts import PARTS
out = {}
for name in KERNEL_ENTRY_POINTS:  # the seed's ten kernels, from the one table of entry points
    spec = SPECS[name]
    ptx = kernel_ptx(spec.src_layout, spec.dst_layout, spec.mla, cc=(9, 0))
    out[name] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "ops": sorted(set(re.findall(r"(?:ld|st)\.global\.[a-z0-9.]+", ptx))),
                 "wide": copy_shape_for(PARTS[spec.src_layout], PARTS[spec.dst_layout], spec.mla).wide,
                 "local": ".local" in ptx}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx_report():
    return run_ptx_script(SCRIPT, timeout=600)


def test_every_seed_kernel_compiles_for_sm90(ptx_report):
    assert len(ptx_report) == 10
    for name, report in ptx_report.items():
        assert report["target"] == "sm_90", name


NARROW = {"ld.global.nc.b64", "st.global.cg.b64"}
WIDE = {"ld.global.nc.v2.u64", "st.global.cg.v2.u64"}


def test_cache_hinted_loads_and_stores(ptx_report):
    assert any(report["wide"] for report in ptx_report.values())
    for name, report in ptx_report.items():
        ops = set(report["ops"])
        # the seed's 8-byte forms always (indices, tables, unaligned items), 16-byte forms where the
        # kernel's copy shape uses them; nothing else touches global memory
        assert NARROW <= ops, name
        assert ops == (NARROW | WIDE if report["wide"] else NARROW), name
        assert not report["local"], f"{name} uses local memory in PTX"


PAGE_UNIFIED_SCRIPT = r"""
import json, re
import kvnumba as kv
from kvnumba.kernels.factory import kernel_ptx
from kvnumba.kernels.layouts import LAYER_FIRST
out = {}
for kinds, groups in ((2, 1), (2, 2), (1, 1)):  # one head group, two (the groups a constant), MLA
    pool = kv.PageUnified.arithmetic(kinds, groups)
    for src, dst in ((pool, LAYER_FIRST), (LAYER_FIRST, pool)):
        ptx = kernel_ptx(src, dst, kinds == 1, cc=(9, 0))
        out[f"{src.name}->{dst.name}"] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                                          "local": ".local" in ptx}
print(json.dumps(out))
"""


def test_the_page_unified_pools_kernels_compile_for_sm90():
    """SGLang's page-unified pool's arithmetic is made per pool shape (K and V or MLA, head groups as constants):
    each compiles, both ways, without local memory."""
    report = run_ptx_script(PAGE_UNIFIED_SCRIPT, timeout=600)
    assert set(report) == {f"{a}->{b}" for p in ("pu", "pu_g2", "pu_mla") for a, b in ((p, "lf"), ("lf", p))}
    for name, one in report.items():
        assert one["target"] == "sm_90" and not one["local"], name
