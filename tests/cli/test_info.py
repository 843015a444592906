"""``kvnumba info`` and ``kvnumba info --json``: the same facts, as text and as JSON."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import kvnumba
from kvnumba.driver.target import SIMULATOR
from kvnumba.tools import cli, info

ROOT = Path(__file__).resolve().parents[2]


def _text(capsys, *args):
    assert cli.main(["info", *args]) == 0
    return {key: value.strip() for key, value in
            (line.split(":", 1) for line in capsys.readouterr().out.splitlines())}


def _json(capsys, *args):
    assert cli.main(["info", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_text_reports_versions_and_target(capsys):
    shown = _text(capsys)
    assert shown["kvnumba"] == kvnumba.__version__
    for key in ("numba", "numba-cuda", "cuda-bindings", "CUDA runtime", "CUDA driver", "GPU", "cudaMemcpyBatchAsync"):
        assert shown[key]
    if SIMULATOR:
        assert shown["GPU"].startswith("Numba's CUDA simulator (")
        assert shown["cudaMemcpyBatchAsync"] == "no"


def test_json_parses_and_holds_the_same_facts(capsys):
    found = _json(capsys)
    assert set(found) == {"kvnumba", "python", "packages", "cuda_runtime", "cuda_driver", "target", "target_reason",
                          "gpu", "batch_copy", "copy_engine_min_bytes", "copy_engine_crossover", "unavailable",
                          "settings", "setting_errors"}
    assert found["copy_engine_min_bytes"] == 64 * 1024 and "measured on" in found["copy_engine_crossover"]
    assert found["kvnumba"] == kvnumba.__version__
    assert found["python"] == platform.python_version()
    assert set(found["packages"]) == {"numpy", "numba", "numba-cuda", "cuda-bindings"}
    assert found["packages"]["numpy"] == __import__("numpy").__version__
    assert found["target"] in ("gpu", "simulator", "none")
    assert found["batch_copy"] in (True, False, None)
    for key, why in found["unavailable"].items():  # every missing value says why
        assert key in ("cuda_runtime", "cuda_driver", "gpu", "batch_copy") and why
    for key in ("cuda_runtime", "cuda_driver", "batch_copy"):
        assert (found[key] is None) == (key in found["unavailable"])
    if SIMULATOR:
        assert found["target"] == "simulator" and found["gpu"] is None and found["batch_copy"] is False
    if found["gpu"] is not None:
        assert found["target"] == "gpu" and found["gpu"]["sms"] > 0 and found["gpu"]["name"]
    # the text is written from the same facts
    text = _text(capsys)
    assert text["kvnumba"] == found["kvnumba"] and text["numpy"] == found["packages"]["numpy"]
    assert text["cudaMemcpyBatchAsync"] == {True: "yes", False: "no", None: text["cudaMemcpyBatchAsync"]}[
        found["batch_copy"]]
    if found["cuda_runtime"] is not None:
        assert text["CUDA runtime"] == found["cuda_runtime"]


def test_a_failing_probe_is_reported_not_raised(capsys, monkeypatch):
    monkeypatch.setenv("KVNUMBA_BATCH_COPY", "fast")
    assert cli.main(["info", "--json"]) == 2  # a bad setting: reported, then one error line
    out, err = capsys.readouterr()
    found = json.loads(out)
    assert err.splitlines() == ["kvnumba info: error: KVNUMBA_BATCH_COPY must be one of auto, cudart, bindings, page, "
                                "got 'fast': fix or unset it"]
    assert found["settings"]["KVNUMBA_BATCH_COPY"] == "fast"
    assert found["setting_errors"]["KVNUMBA_BATCH_COPY"].startswith("KVNUMBA_BATCH_COPY must be one of")
    assert found["batch_copy"] is None
    assert found["unavailable"]["batch_copy"].startswith("SettingError: KVNUMBA_BATCH_COPY must be one of")
    assert cli.main(["info"]) == 2
    shown = {key: value.strip() for key, value in
             (line.split(":", 1) for line in capsys.readouterr().out.splitlines())}
    assert shown["cudaMemcpyBatchAsync"].startswith("unknown (SettingError: KVNUMBA_BATCH_COPY must be")
    assert shown["settings"].split(", ")[0] == "KVNUMBA_BATCH_COPY=fast (cannot be used)"  # others the user set follow


def test_report_writes_each_fact(capsys):
    made_up = {"kvnumba": "9.9", "python": "3.99.0", "packages": {"numpy": "3.0", "numba": None},
               "cuda_runtime": None, "cuda_driver": "13.0", "target": "gpu",
               "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132}, "batch_copy": True,
               "copy_engine_min_bytes": 32768, "copy_engine_crossover": "measured here",
               "unavailable": {"cuda_runtime": "cudaErrorInsufficientDriver"}}
    assert info.report(made_up) == [
        ("kvnumba", "9.9"), ("python", "3.99.0"), ("numpy", "3.0"), ("numba", "not installed"),
        ("CUDA runtime", "unavailable (cudaErrorInsufficientDriver)"),
        ("CUDA driver", "13.0 (supports CUDA up to this version)"),
        ("GPU", "NVIDIA H200 (compute capability 9.0, 132 SMs)"), ("cudaMemcpyBatchAsync", "yes"),
        ("kv.copy route='auto'", "the copy engine for copies of 32 KiB or more on average, else the kernel "
                                 "(measured here)"),
        ("settings", "none set")]
    made_up.update(settings={"KVNUMBA_CHECK": "1", "KVNUMBA_LOAD_PATH": "tma"},
                   setting_errors={"KVNUMBA_LOAD_PATH": "KVNUMBA_LOAD_PATH must be one of ..."})
    assert info.report(made_up)[-1] == ("settings", "KVNUMBA_CHECK=1, KVNUMBA_LOAD_PATH=tma (cannot be used)")


def test_command_line_json_in_a_fresh_process():
    done = subprocess.run([sys.executable, "-m", "kvnumba", "info", "--json"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["kvnumba"] == kvnumba.__version__ and found["target"] in ("gpu", "simulator", "none")


def test_json_option_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["info", "-h"])
    assert "--json" in capsys.readouterr().out
