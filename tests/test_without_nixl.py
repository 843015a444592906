"""Without NIXL (an install that left out the README's second ``pip install``), every test is collected and
runs; only the tests marked ``nixl`` fail, each with one line saying what to install.

NIXL is hidden from a pytest run in a subprocess by ``tests/helpers/no_nixl.py``, on the simulator."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NIXL_MISSING

ROOT = Path(__file__).resolve().parent.parent
NEEDS_NIXL = ["tests/remote/test_agents.py", "tests/remote/test_processes.py"]

pytestmark = pytest.mark.smoke


def _pytest(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's (xdist) settings
    env.update(NUMBA_ENABLE_CUDASIM="1", COLUMNS="400",  # summary lines in full
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.helpers.no_nixl", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_whole_suite_is_collected():
    pytest.importorskip("nbclient", reason="the test extra is not installed here (the GPU machine): the notebook tests "
                        "cannot be collected on the simulator without it")
    run = _pytest("--collect-only", "-q", "tests")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", run.stdout, flags=re.M), run.stdout[-500:]


def test_only_the_remote_tests_fail_each_in_one_line():
    run = _pytest("-q", "-rf", "tests/remote/test_plan.py", *NEEDS_NIXL)  # test_plan.py needs no NIXL
    out = run.stdout
    failed = int(re.search(r"(\d+) failed", out).group(1))
    passed = int(re.search(r"(\d+) passed", out).group(1))
    assert run.returncode == 1 and failed > 100 and passed >= 3, out[-3000:]
    summary = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(summary) == failed
    assert all(line.endswith(" - Failed: " + NIXL_MISSING) for line in summary), summary[:3]
    assert {line.removeprefix("FAILED ").split("::")[0] for line in summary} == set(NEEDS_NIXL)
    assert "Traceback" not in out
