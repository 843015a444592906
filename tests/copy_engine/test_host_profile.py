"""scripts/direct_host_profile.py on the simulator: every entry point and kv.copy route profiled once at one
page, its stages named, and the stand-in batch call taken out again when it returns."""
import importlib.util
from pathlib import Path

import pytest

from kvnumba.driver import batch_copy
from kvnumba.driver.target import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="on a GPU the script times real copies (the lead's run)")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "direct_host_profile.py"


def _script():
    spec = importlib.util.spec_from_file_location("direct_host_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_times_every_case_and_restores_the_runtime(capsys):
    script = _script()
    runtime = batch_copy.runtime
    rows = script.main(["--tokens", "64", "--indices", "host"])
    assert batch_copy.runtime is runtime
    assert [r["case"] for r in rows] == list(script.CASES)
    for row in rows:
        assert row["host_us"] > 0 and row["timed_us"] > 0 and row["stages"]["batch call"] > 0
    by_case = {r["case"]: r["stages"] for r in rows}
    assert by_case["per_layer_direct_pf_lf"]["one pass (check, runs, addresses)"] > 0
    assert by_case["copy ce lf"]["token offsets"] > 0
    assert "per_layer_direct_pf_lf" in capsys.readouterr().out
