"""On a machine with a GPU and no setting, kvnumba runs on the GPU, silently; KVNUMBA_REQUIRE_GPU=1 is then
satisfied; NUMBA_ENABLE_CUDASIM=1 still chooses the simulator. Each in a fresh process (the choice is made at
``import kvnumba``)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import warnings
warnings.simplefilter("error")  # any warning of kvnumba's would fail here
warnings.simplefilter("ignore", DeprecationWarning)  # libraries' own (numba-cuda's, with some NumPy versions)
import numpy as np
import kvnumba as kv
from kvnumba.driver.target import CHOICE, SIMULATOR
from kvnumba.testing import device_array, to_numpy
src = device_array(np.arange(16 * 64, dtype=np.uint8).reshape(16, 64))
dst = device_array(np.zeros((16, 64), np.uint8))
kv.transfer_kv_per_layer_mla(src, dst, device_array(np.array([3, 5])), device_array(np.array([0, 1])), item_size=64)
assert (to_numpy(dst)[1] == to_numpy(src)[5]).all()
print(SIMULATOR, CHOICE.reason)
"""


def _run(**env):
    environ = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "KVNUMBA_REQUIRE_GPU")}
    environ.update(env, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=environ, capture_output=True, text=True,
                          timeout=600)


def test_no_setting_runs_on_the_gpu_without_a_word():
    done = _run()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "a", "CUDA", "driver"]


def test_require_gpu_is_satisfied():
    done = _run(KVNUMBA_REQUIRE_GPU="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("False")


def test_the_simulator_can_still_be_chosen():
    done = _run(NUMBA_ENABLE_CUDASIM="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "NUMBA_ENABLE_CUDASIM=1"]
