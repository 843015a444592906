"""PTX of kvnumba's kernels for the real CUDA target, in a fresh Python (NVVM compiles; no GPU needed)."""
import json
import os
import subprocess
import sys

import pytest


def ptx_report(script, timeout):
    """The JSON that ``script`` prints last, run with ``NUMBA_ENABLE_CUDASIM=0``; a skip where libNVVM is missing."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode and "NVVM" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("libNVVM is not installed (pip install 'numba-cuda[cu13]')")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
