"""scripts/bench.py --quick runs every case end to end (CI runs it on the simulator; figures mean nothing)."""
import importlib.util
import json
import os
import re

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
    out, err = capsys.readouterr()
    assert "transfer_kv_per_layer_ph_lf h2d mha" in out
    # stderr is not a terminal here: one progress line per case, in order, then a summary
    n = len(data["records"])
    lines = err.splitlines()
    progress = [line for line in lines if line.startswith("bench [")]
    assert [re.sub(r" \(\d+\.\d s\)$", "", line) for line in progress] == [
        f"bench [{i}/{n}] {r['case']}" for i, r in enumerate(data["records"], 1)]
    assert re.fullmatch(rf"bench: {n} cases in \d+\.\d s", lines[-1])
    if plotting:
        assert (tmp_path / "bench.png").stat().st_size > 1000


def test_quiet_run_prints_no_progress(capsys):
    records = _bench().main(["--quick", "--only", "transfer_kv_per_layer_mla_pf_lf", "--quiet"])
    out, err = capsys.readouterr()
    assert records and all("transfer_kv_per_layer_mla_pf_lf" in r["case"] for r in records)
    assert "transfer_kv_per_layer_mla_pf_lf h2d mla" in out
    assert err == ""
