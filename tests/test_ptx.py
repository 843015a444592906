"""The GPU kernels compile for sm_90 with the seed's cache-hinted loads and stores (no GPU needed).

Runs in a subprocess without NUMBA_ENABLE_CUDASIM, since the simulator has no compiler.
"""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, re
from kvnumba.kernels import SEED_KERNELS, kernel_ptx
out = {}
for (src, dst, mla), name in SEED_KERNELS.items():
    ptx = kernel_ptx(src, dst, mla, cc=(9, 0))
    out[name] = {"target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "ops": sorted(set(re.findall(r"(?:ld|st)\.global\.[a-z0-9.]+", ptx))),
                 "local": ".local" in ptx}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx_report():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode and "NVVM" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("libNVVM is not installed (pip install 'numba-cuda[cu13]')")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_seed_kernel_compiles_for_sm90(ptx_report):
    assert len(ptx_report) == 10
    for name, report in ptx_report.items():
        assert report["target"] == "sm_90", name


def test_cache_hinted_loads_and_stores(ptx_report):
    for name, report in ptx_report.items():
        ops = set(report["ops"])
        # the seed's 8-byte forms, and the 16-byte forms used when alignment allows
        assert {"ld.global.nc.b64", "st.global.cg.b64", "ld.global.nc.v2.u64", "st.global.cg.v2.u64"} <= ops, name
        # nothing else touches global memory: no uncached or plain loads/stores slipped in
        assert ops <= {"ld.global.nc.b64", "st.global.cg.b64", "ld.global.nc.v2.u64", "st.global.cg.v2.u64"}, name
        assert not report["local"], f"{name} spills to local memory"
