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
    compiled = "compiled call: check, fill, submit"  # the entry points: stream, indices, copies and batch in one
    for row in rows:
        assert row["host_us"] > 0 and row["timed_us"] > 0
        assert row["stages"]["batch call" if row["case"].startswith("copy") else compiled] > 0
    by_case = {r["case"]: r["stages"] for r in rows}
    assert "batch call" not in by_case["per_layer_direct_pf_lf"]
    assert by_case["copy ce lf"]["one pass (check, runs, addresses)"] > 0
    assert "per_layer_direct_pf_lf" in capsys.readouterr().out


ROUTE_COSTS = SCRIPT.with_name("route_costs.py")


def _route_costs():
    spec = importlib.util.spec_from_file_location("route_costs", ROUTE_COSTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_route_costs_measures_both_routes_and_restores_the_runtime():
    script = _route_costs()
    runtime, submit = batch_copy.runtime, batch_copy.PreparedBatch.submit
    rows = script.measure([64], calls=1, groups=1)
    assert batch_copy.runtime is runtime and batch_copy.PreparedBatch.submit is submit
    assert [(r["route"], r["view"]) for r in rows] == [("copy_engine", "lf"), ("kernel", "lf"),
                                                       ("copy_engine", "pfd"), ("kernel", "pfd")]
    # one page of 64 tokens, K and V: two runs, each one copy
    assert [r["copies"] for r in rows if r["route"] == "copy_engine"] == [2, 2]
    assert all(r["us"] > 0 and r["bytes"] == 64 * 2048 * 2 for r in rows)


def test_route_costs_fits_the_line_routes_reads():
    script = _route_costs()
    rows = [{"route": "copy_engine", "copies": c, "bytes": None, "us": 30 + 0.5 * c} for c in (2, 16, 256)]
    rows += [{"route": "kernel", "copies": None, "bytes": b, "us": 40 + b / 45e3} for b in (2**18, 2**21, 2**25)]
    fields = script.fit(rows)
    assert fields == {"engine_fixed_us": 30.0, "engine_per_copy_us": 0.5, "kernel_fixed_us": 40.0,
                      "kernel_bytes_per_us": 45000.0}
    line = script.host_cost_line(fields)
    assert line == ("HOST_COST = HostCost(engine_fixed_us=30.0, engine_per_copy_us=0.5, kernel_fixed_us=40.0, "
                    "kernel_bytes_per_us=45000.0)")
    from kvnumba.plan import routes

    assert eval(line.split(" = ", 1)[1], {"HostCost": routes.HostCost}) == routes.HostCost(**fields)
    flat = [{"route": "copy_engine", "copies": c, "bytes": None, "us": 30.0 - c} for c in (2, 16)] + rows[3:]
    with pytest.raises(ValueError, match="slope at or below zero"):
        script.fit(flat)


def test_routes_holds_one_line_as_route_costs_prints_it():
    """The model's constants are the script's line, pasted whole: one line of routes.py, equal to HOST_COST."""
    from kvnumba.plan import routes

    lines = [line for line in Path(routes.__file__).read_text().splitlines() if line.startswith("HOST_COST = ")]
    assert lines == [_route_costs().host_cost_line(routes.HOST_COST._asdict())]
