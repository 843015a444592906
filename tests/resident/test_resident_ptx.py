"""The resident loaders compile for sm_90 (no GPU needed): the register kernel's loads and stores, a block's
arrival (atom.add), the fences and the layer's publication (red.release.sys.max), nothing spilled; the staged build
with the ring's bulk copies and its barriers made again per layer (mbarrier.inval); the wait kernel's acquire
polls."""
from tests.helpers.ptx import ptx_report

SCRIPT = r"""
import json, re
from kvnumba.kernels.resident import resident_ptx
out = {}
for src, dst, mla, narrow in (("pf", "lf", False, False), ("ph", "lf", False, False), ("pf", "lf", True, False),
                              ("pf", "lf", False, True)):
    ptx = resident_ptx(src, dst, mla, cc=(9, 0), narrow=narrow)
    out[f"{src}-{dst}{'-mla' if mla else ''}{'-narrow' if narrow else ''}"] = {
        "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
        "ops": sorted(set(re.findall(r"(?:atom|red|membar|fence|bar|ld\.global|st\.global)[a-z0-9.:]*", ptx))),
        "local": ".local" in ptx}
from kvnumba.kernels.layouts import LAYER_TABLE, PAGE_FIRST
from kvnumba.kernels.resident_staged import resident_staged_ptx
ptx = resident_staged_ptx(PAGE_FIRST, LAYER_TABLE, False)
out["staged"] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "ops": sorted(set(re.findall(r"(?:atom|red|membar|mbarrier|cp\.async\.bulk)[a-z0-9.:_]*", ptx)))}
from kvnumba.kernels.layer_wait import wait_ptx
ptx = wait_ptx()
out["wait"] = {"ops": sorted(set(re.findall(r"(?:ld\.[a-z.]*global|nanosleep)[a-z0-9.:_]*", ptx))),
               "local": ".local" in ptx}
print(json.dumps(out))
"""


def test_resident_loaders_compile_with_their_signals():
    report = ptx_report(SCRIPT, timeout=600)
    staged, wait = report.pop("staged"), report.pop("wait")
    assert "ld.acquire.sys.global.u32" in wait["ops"] and "nanosleep.u32" in wait["ops"], wait["ops"]
    assert not wait["local"]
    assert staged["target"] == "sm_90"
    assert {"mbarrier.inval.shared::cta.b64", "mbarrier.init.shared::cta.b64", "atom.global.add.u32",
            "red.release.sys.global.max.u32", "membar.sys", "cp.async.bulk.global.shared::cta.bulk_group",
            "cp.async.bulk.wait_group"} <= set(staged["ops"])
    assert len(report) == 4
    for name, kernel in report.items():
        assert kernel["target"] == "sm_90", name
        assert not kernel["local"], f"{name}: spills to local memory"
        ops = set(kernel["ops"])
        assert {"atom.global.add.u32", "red.release.sys.global.max.u32", "membar.sys", "bar.sync"} <= ops, name
        assert "ld.global.nc.b64" in ops or "ld.global.nc.v2.u64" in ops, name
