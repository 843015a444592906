"""scripts/bench.py --quick runs every case end to end (CI runs it on the simulator; figures mean nothing)."""
import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.needs_target

HERE = os.path.dirname(os.path.abspath(__file__))


def _bench():
    spec = importlib.util.spec_from_file_location("bench", os.path.join(HERE, "..", "scripts", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_one_record_per_case(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "bench.json"
    argv = ["--quick", "--json", str(out)]
    plotting = importlib.util.find_spec("matplotlib") is not None
    if plotting:
        argv += ["--plot", str(tmp_path / "bench.png")]
    bench.main(argv)
    data = json.loads(out.read_text())
    ops = {r["op"] for r in data["records"]}
    assert {"transfer_kv_per_layer", "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla_lf_pf"} <= ops
    for record in data["records"]:
        assert record["bytes"] > 0 and record["kvnumba_gbps"] > 0 and record["ceiling_gbps"] > 0
    assert "transfer_kv_per_layer_ph_lf h2d mha" in capsys.readouterr().out
    if plotting:
        assert (tmp_path / "bench.png").stat().st_size > 1000
