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


def test_resume_runs_only_the_missing_cases(tmp_path, capsys, monkeypatch):
    """A full run split over processes: --json keeps every finished row of a killed run, --resume adds only
    the cases the file lacks (the sglang block's rows too, one by one), old rows first, no duplicates."""
    bench = _bench()
    out = tmp_path / "bench.json"

    def cases():
        return [r["case"] for r in json.loads(out.read_text())["records"]]

    mla = ["--quick", "--only", "mla_pf_lf", "--json", str(out), "--resume"]
    write, writes = bench.write_json, []

    def killed_after_two_rows(*args):  # the process is killed while it measures the third case
        write(*args)
        writes.append(1)
        if len(writes) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(bench, "write_json", killed_after_two_rows)
    with pytest.raises(KeyboardInterrupt):
        bench.main(mla)
    monkeypatch.setattr(bench, "write_json", write)
    first = json.loads(out.read_text())["records"]
    assert len(first) == 2 and os.listdir(tmp_path) == ["bench.json"]  # no temporary file left behind

    capsys.readouterr()
    bench.main(mla)
    data = json.loads(out.read_text())
    assert data["records"][:2] == first and len(data["records"]) == 3
    assert cases() == ["transfer_kv_per_layer_mla_pf_lf h2d mla", "transfer_kv_per_layer_mla_pf_lf d2d mla",
                       "transfer_kv_per_layer_mla_pf_lf h2d mla 8tok"]
    assert "bench: 2 cases already in" in capsys.readouterr().err

    bench.main(mla)  # everything is there: nothing is measured, the file is left as it was
    assert json.loads(out.read_text()) == data
    assert "nothing left to run" in capsys.readouterr().err

    bench.main(mla[:3] + ["sglang"] + mla[3:])  # another --only: its new rows come after the old ones
    data = json.loads(out.read_text())
    sglang = bench.sglang_shapes.cases(bench.QUICK)
    # one fresh-view row per per-layer entry point, two layer loops, two misses
    assert cases() == cases()[:3] + sglang and len(sglang) == len(bench.sglang_shapes.per_layer_entry_points()) + 2 + 2
    assert [run["cases"] for run in data["meta"]["runs"]] == [2, 1, len(sglang)]

    lost = {sglang[0], sglang[-2]}  # two sglang rows missing (a file cut short, say): only they are measured again
    data["records"] = [r for r in data["records"] if r["case"] not in lost]
    out.write_text(json.dumps(data))
    bench.main(mla[:3] + ["sglang"] + mla[3:])
    assert sorted(cases()) == sorted(set(cases())) and set(cases()[-2:]) == lost and len(cases()) == 3 + len(sglang)
    assert "bench: 10 cases already in" in capsys.readouterr().err

    with pytest.raises(SystemExit, match="cannot resume"):  # rows of another shape are not mixed in
        bench.main(["--only", "mla_pf_lf", "--json", str(out), "--resume"])


def test_quick_overlap_runs_every_route(tmp_path, capsys):
    """``--only overlap --quick``: every route of every layout once, idle (the simulator has no compute)."""
    bench = _bench()
    out = tmp_path / "overlap.json"
    bench.main(["--only", "overlap", "--quick", "--json", str(out), "--quiet"])
    data = json.loads(out.read_text())
    routes = [r["route"] for r in data["records"]]
    assert data["meta"]["section"] == "overlap" and len(routes) == len(set(routes)) == 19 + 5 * 5 + 3 + 2
    for layout in ("page-first", "page-head", "layer-first", "page-unified", "mla page-first"):  # one launch
        assert {f"{layout} resident loader bq={bq}" for bq in (1, 2, 4)} | {f"{layout} kv.copy all layers bq=2"} \
            | {f"{layout} resident loader bq=2, high-priority stream"} <= set(routes)
    for layout in ("layer-first", "page-unified", "page-first"):  # host indices: auto's route recorded
        assert {r.get("auto_took") for r in data["records"] if r["route"] == f"{layout} resident load auto (host indices)"
                } <= {"copy_engine", "kernel"}
    for layout in ("layer-first", "page-first", "page-head", "mla page-first"):
        assert {f"{layout} kernel", f"{layout} kernel beside compute (one warp per SM)"} <= set(routes)
    assert {"layer-first direct (copy engine)", "page-first-direct direct (copy engine)"} <= set(routes)
    assert {f"page-unified kv.copy auto, {g} (host indices)" for g in ("1 head group", "2 head groups")} <= set(routes)
    assert {"page-first-direct kv.copy auto (host indices)", "page-first-direct kv.copy kernel"} <= set(routes)
    assert all(r["idle_seconds"] > 0 and r["bytes"] > 0 for r in data["records"])
    by_route = {r["route"]: r for r in data["records"]}  # whether a per-layer row's kernel plan bound the staged kernel
    assert isinstance(by_route["page-unified kv.copy auto, 2 head groups (host indices)"]["staged_bound"], bool)
    assert not {"staged_bound"} & (by_route["layer-first direct (copy engine)"].keys()
                                   | by_route["page-unified resident loader bq=1"].keys())
    assert "overlap page-head kernel on SM lanes (8 SMs) 8tok" in capsys.readouterr().out


FP8_ROWS = ["fp8 backup e4m3 kv.copy bq=2", "fp8 backup nvfp4 kv.copy bq=2", "fp8 backup bf16 kv.copy bq=2",
            "fp8 backup bf16 transfer_kv_all_layer_lf_pf bq=2", "fp8 backup bf16 transfer_kv_all_layer_lf_pf bq=2 [seed]"]
FP8_ROWS += [f"fp8 load {fmt} {api} bq={bq}{seed}" for bq in (4, 2)
             for fmt, api, seed in (("e4m3", "kv.copy", ""), ("nvfp4", "kv.copy", ""), ("bf16", "kv.copy", ""),
                                    ("bf16", "transfer_kv_per_layer_pf_lf", ""),
                                    ("bf16", "transfer_kv_per_layer_pf_lf", " [seed]"))]
FP8_ROWS += [f"fp8 {what} nvfp4 kv.copy bq={bq}" for bq in (8, 16, 32) for what in ("backup", "load")]  # NVFP4 alone
FP8_ROWS += [f"fp8 under compute {row.removeprefix('fp8 ')}" for row in FP8_ROWS if "bq=2" in row]
FP8_ROWS += [f"fp8 under compute load {fmt} kv.load_resident bq=2" for fmt in ("e4m3", "nvfp4")]


def test_quick_fp8_runs_every_row(tmp_path, capsys):
    """``--only fp8 --quick``: every FP8-on-the-wire row once on tiny buffers (the under-compute rows idle, the
    simulator has no compute), each FP8 call first checked bit for bit against kvnumba.quant_reference, the
    targets and the table printed last, with a table cell for every row."""
    bench = _bench()
    out = tmp_path / "fp8.json"
    # kvnumba stands for the seed: the seed's rows call its entry points by the same names
    bench.main(["--only", "fp8", "--quick", "--reference", "kvnumba", "--json", str(out), "--quiet", "--commit",
                "0123abc", "--machine", "sim"])
    data = json.loads(out.read_text())
    meta, records = data["meta"], data["records"]
    assert (meta["section"], meta["commit"], meta["machine"], meta["shape"]["layers"]) == ("fp8", "0123abc", "sim", 2)
    assert meta["kvnumba_from"] == os.path.realpath(os.path.join(HERE, "..", "kvnumba"))  # the checkout's package
    assert [r["case"] for r in records] == FP8_ROWS
    assert [t[1] for t in meta["targets"]] == FP8_ROWS[:1] * 2 + ["fp8 load e4m3 kv.copy bq=4", "fp8 load e4m3 kv.copy bq=2",
                                                               "fp8 backup nvfp4 kv.copy bq=2", "fp8 load nvfp4 kv.copy bq=4",
                                                               "fp8 backup nvfp4 kv.copy bq=16", "fp8 load nvfp4 kv.copy bq=16"]
    tokens, layers = meta["shape"]["tokens"], meta["shape"]["layers"]
    for r in records:
        fp8 = r["format"] == "e4m3"
        assert r["verified"] is (True if r["format"] != "bf16" else None), r["case"]
        per_token = 2 * 2048 * (layers if r["what"] == "backup" else 1)  # bf16 K and V of 8 heads of 128
        assert r["bf16_bytes"] == tokens * per_token
        assert r["link_per_bf16"] == ((1024 + 32) / 2048 if fp8 else 576 / 2048 if r["format"] == "nvfp4" else 1.0)
        assert r["link_bytes"] == r["bf16_bytes"] * r["link_per_bf16"]
        speeds = ["idle_gbps", "idle_link_gbps"] if "under compute" in r["case"] else ["bf16_gbps", "link_gbps"]
        assert all(r[key] > 0 for key in speeds) and ("host_us" in r) != ("under compute" in r["case"])
    printed = capsys.readouterr().out
    assert all(case in printed for case in FP8_ROWS)
    targets = printed[printed.index("FP8 on the wire: targets"):].splitlines()
    assert [line.split()[-1] for line in targets[1:9]] == ["PASS"] + ["MISS"] * 7  # simulator
    assert targets[10] == "GB/s of bf16 bytes (link GB/s)" and len(targets) == 10 + 2 + 3 + 6 + 4
    assert all(line.count("(") == 5 for line in targets[12:15])  # idle: the five ways of a transfer, each measured
    assert all(line.count("(") == 1 for line in targets[15:21])  # NVFP4's own quotas: its column alone


@pytest.mark.parametrize("fmt", ["e4m3", "nvfp4"])
@pytest.mark.parametrize("what", ["backup", "load"])
def test_fp8_rows_refuse_wrong_bytes(monkeypatch, what, fmt):
    """An FP8 call that leaves its destination as it was (here: one that does nothing) stops the run before it
    is timed: the check against kvnumba.quant_reference finds the poisoned tokens."""
    bench = _bench()
    import fp8_wire  # on the path bench.py put it on

    copy = fp8_wire.kv.copy

    def skips_fp8(src, dst, *args, **kwargs):
        if not isinstance(dst if what == "backup" else src, fp8_wire.kv.Fp8View if fmt == "e4m3" else fp8_wire.kv.Nvfp4View):
            copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(fp8_wire.kv, "copy", skips_fp8)
    with pytest.raises(AssertionError, match="differ from kvnumba.quant_reference"):
        bench.main(["--only", "fp8", f"{what} {fmt}", "--quick", "--quiet"])
