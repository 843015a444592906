"""The resident loaders compile for sm_90 (no GPU needed): the register kernel's loads and stores, a block's
arrival (atom.add), the fences and the layer's publication (red.release.sys.max), nothing spilled."""
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
print(json.dumps(out))
"""


def test_resident_loaders_compile_with_their_signals():
    report = ptx_report(SCRIPT, timeout=600)
    assert len(report) == 4
    for name, kernel in report.items():
        assert kernel["target"] == "sm_90", name
        assert not kernel["local"], f"{name}: spills to local memory"
        ops = set(kernel["ops"])
        assert {"atom.global.add.u32", "red.release.sys.global.max.u32", "membar.sys", "bar.sync"} <= ops, name
        assert "ld.global.nc.b64" in ops or "ld.global.nc.v2.u64" in ops, name
