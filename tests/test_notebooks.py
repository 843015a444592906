"""The notebooks, as committed and as they run.

They are committed executed, with their outputs and pictures, so that GitHub shows them
(``scripts/render_notebooks.py``): 00, 01, 02 and 04 from Numba's CUDA simulator, 03 from the saved H200
run, 06, 07 and 08 from both (07's GPU figures once ``scripts/results/h200-2026-12-03-fp8-13ad9fa.json`` is saved,
08's timeline once ``scripts/timeline.py`` has saved one). The exercises' solutions (``notebooks/solutions/``)
run too, so that they stay true. Here each is executed again, top to bottom, in a Jupyter kernel on this interpreter (on the
simulator when there is no GPU), the way the render script does it, in memory: a cell that raises
fails the test, and the committed files are never written."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvnumba.driver.target import SIMULATOR

try:
    import nbclient  # noqa: F401
    import nbformat
except ImportError:  # the test extra installs both: missing in CI (the simulator) is a failure
    if SIMULATOR:
        raise
    pytest.skip("nbclient/nbformat not installed on this GPU machine", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 300_000  # what a reader downloads to see one on GitHub
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.py"))
FROM_THE_SIMULATOR = {"00_the_copy_kernel", "01_layouts", "02_hicache_round_trip", "04_prototype_a_layout",
                      "05_disaggregated_handoff", "06_transfers_under_load", "07_kv_on_the_wire_fp8", "08_why_offload"}
# 07 plots the FP8 bench run once it is saved (``bench.py --only fp8``), and says so until then
FP8_RUN = "h200-2026-12-03-fp8-13ad9fa.json"
FP8_SAVED = (ROOT / "scripts" / "results" / FP8_RUN).is_file()
# 08 draws the newest ``*-timeline-*.json`` that scripts/timeline.py saved on a GPU, and says so until there is one
TIMELINE_SAVED = any((ROOT / "scripts" / "results").glob("*-timeline-*.json"))
FROM_SAVED_RUNS = {"03_performance": "h200.json", "06_transfers_under_load": "h200-2026-12-01-overlap.json",
                   "08_why_offload": "h200-2026-12-01-overlap.json",
                   **({"07_kv_on_the_wire_fp8": FP8_RUN} if FP8_SAVED else {})}
PICTURES = {"00_the_copy_kernel": 1, "01_layouts": 1, "02_hicache_round_trip": 1, "03_performance": 2,
            "04_prototype_a_layout": 0, "05_disaggregated_handoff": 0, "06_transfers_under_load": 3,
            "07_kv_on_the_wire_fp8": 1 + FP8_SAVED, "08_why_offload": 2 + TIMELINE_SAVED}
# Notebooks that teach: each has an exercise (a TODO cell) whose solution is in notebooks/solutions/<stem>.py.
EXERCISES = {"00_the_copy_kernel", "01_layouts", "02_hicache_round_trip", "03_performance", "04_prototype_a_layout",
             "05_disaggregated_handoff", "06_transfers_under_load", "07_kv_on_the_wire_fp8", "08_why_offload"}
NEEDS_NIXL = {"05_disaggregated_handoff"}  # kvnumba.remote: marked nixl (the README's install line brings NIXL)
RUNS = [pytest.param(p, id=p.stem, marks=[pytest.mark.nixl] if p.stem in NEEDS_NIXL else []) for p in NOTEBOOKS]


def _render_script():
    spec = importlib.util.spec_from_file_location("render_notebooks", ROOT / "scripts" / "render_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _render_script()


def _outputs(notebook):
    return [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]


def _kinds(notebook):
    """Per code cell, the kinds of its outputs: stream names, or the MIME types of displayed data."""
    return [[o.get("name") or o.output_type if "data" not in o else sorted(o.data)
             for o in render.coalesce_streams(c.outputs)]
            for c in notebook.cells if c.cell_type == "code"]


def test_notebooks_found():
    assert [p.name for p in NOTEBOOKS] == ["00_the_copy_kernel.ipynb", "01_layouts.ipynb",
                                           "02_hicache_round_trip.ipynb", "03_performance.ipynb",
                                           "04_prototype_a_layout.ipynb", "05_disaggregated_handoff.ipynb",
                                           "06_transfers_under_load.ipynb", "07_kv_on_the_wire_fp8.ipynb",
                                           "08_why_offload.ipynb"]
    assert set(PICTURES) == {p.stem for p in NOTEBOOKS}
    assert [p.stem for p in SOLUTIONS] == sorted(EXERCISES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_executed_with_outputs(path):
    """Rendered top to bottom (``python scripts/render_notebooks.py``), small, saying where it ran, and
    without the metadata that changes from run to run."""
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size:,} B; keep the pictures small"
    notebook = nbformat.read(path, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: not executed top to bottom: run scripts/render_notebooks.py"
    outputs = _outputs(notebook)
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == PICTURES[path.stem]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    if path.stem in FROM_THE_SIMULATOR:
        assert "executed on Numba's CUDA simulator" in text
    if path.stem in FROM_SAVED_RUNS:  # 03 and 06 plot saved H200 runs
        assert f"records from scripts/results/{FROM_SAVED_RUNS[path.stem]}" in text and "device: NVIDIA H200" in text
    assert notebook.metadata == render.STORED_METADATA
    assert not [c for c in notebook.cells if "execution" in c.metadata]


@pytest.mark.parametrize("path", RUNS)
def test_notebook_runs(path):
    before = path.read_bytes()
    on_simulator = SIMULATOR or not _gpu()
    fresh = render.execute(path, simulator=on_simulator)  # a cell that raises raises CellExecutionError here
    assert not [o for o in _outputs(fresh) if o.output_type == "error"]
    assert path.read_bytes() == before  # executed in memory: the committed file is untouched
    if on_simulator or path.stem not in FROM_THE_SIMULATOR:
        # The committed outputs are this source's, run the same way: the same kinds of output, cell by cell.
        assert _kinds(fresh) == _kinds(nbformat.read(path, as_version=4)), \
            f"{path.name}: its stored outputs are stale: run scripts/render_notebooks.py"


def _gpu():
    from kvnumba.driver.target import gpu_available

    return gpu_available()


def test_render_script_saves_what_it_executes(tmp_path):
    """``render_notebooks.py PATH`` writes the executed notebook back, cleaned for storage."""
    path = tmp_path / "tiny.ipynb"
    cells = ["print(6 * 7)", "import os; print(os.environ['NUMBA_ENABLE_CUDASIM'])"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook.metadata = {"kernelspec": {"name": "other", "display_name": "Other"}, "language_info": {"name": "python", "version": "3.x"}}
    nbformat.write(notebook, path)
    jupyter_path = os.environ.get("JUPYTER_PATH")
    render.main([str(path)])
    assert os.environ.get("JUPYTER_PATH") == jupyter_path  # its kernelspec was temporary
    saved = json.loads(path.read_text())
    assert ["".join(c["outputs"][0]["text"]) for c in saved["cells"]] == ["42\n", "1\n"]
    assert [c["execution_count"] for c in saved["cells"]] == [1, 2]
    assert saved["metadata"] == render.STORED_METADATA
    assert all("execution" not in c["metadata"] for c in saved["cells"])


def test_notebook_07_says_whether_the_gpu_run_is_saved():
    """07 reads the FP8 bench's H200 run; until it is saved the notebook says so and plots only what it computes."""
    notebook = nbformat.read(ROOT / "notebooks" / "07_kv_on_the_wire_fp8.ipynb", as_version=4)
    text = "".join(o.get("text", "") for o in _outputs(notebook) if o.output_type == "stream")
    assert (f"scripts/results/{FP8_RUN} is not there yet" in text) is not FP8_SAVED
    assert "codes and scales bit-exact" in text and "dequantised, bit-exact" in text


FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:GB/s|TB/s|us\b|µs)")


def _saved_data(notebook):
    """The text of every saved result file a notebook's code names (``"<name>.json"``), found as it finds them."""
    from kvnumba.tools import results

    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    found = [results.find(name) for name in set(re.findall(r"[\w.-]+\.json", code))]
    return "\n".join(path.read_text() for path in found if path is not None)


def _numbers_as(text, decimals):
    """Every number of ``text`` rounded to ``decimals`` places, as the prose would write it."""
    return {f"{float(n):.{decimals}f}" for n in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_of_the_prose_is_printed_or_saved(path):
    """A GB/s or µs figure in a notebook's Markdown also appears in an output of that notebook, or (rounded as
    written) in the data file it loads: the prose never states a measurement the data does not show."""
    notebook = nbformat.read(path, as_version=4)
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    shown = "".join(o.get("text", "") for o in _outputs(notebook) if o.output_type == "stream")
    data = _saved_data(notebook)
    unbacked = []
    for match in FIGURE.finditer(prose):
        number = match.group(1)
        decimals = len(number.split(".")[1]) if "." in number else 0
        if number not in shown and match.group(0) not in data and number not in _numbers_as(data, decimals):
            unbacked.append(match.group(0))
    assert not unbacked, f"{path.name}: figures in its prose that no output or saved file shows: {unbacked}"


def test_the_readme_quotes_the_bench_runs_prepared_host_time():
    """The README's range of prepared per-layer host time from the bench run is the saved run's (notebook 03), over
    the kernel loads (the copy-engine ``direct`` ones spend their time submitting copies)."""
    saved = json.loads((ROOT / "scripts" / "results" / "h200.json").read_text())
    times = [r["prepared_host_us"] for r in saved["records"]
             if r["op"].startswith("transfer_kv_per_layer") and "direct" not in r["op"] and r.get("prepared_host_us")]
    assert f"has {min(times):.1f}-{max(times):.1f} us prepared" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("stem", sorted(EXERCISES))
def test_a_teaching_notebook_has_an_exercise_and_its_solution_runs(stem):
    """A TODO cell that says what to do when left blank, a link to its solution, and the solution, run as a
    student would run it (on the simulator), checking itself."""
    notebook = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    todo = [c for c in notebook.cells if c.cell_type == "code" and "TODO" in c.source]
    assert todo, f"{stem}: no exercise"
    assert all("then run this cell again" in "".join(o.get("text", "") for o in c.outputs) for c in todo)
    assert f"(solutions/{stem}.py)" in "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(ROOT / "notebooks" / "solutions" / f"{stem}.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip()


def test_the_block_quota_figures_come_from_the_saved_data():
    data = json.loads((ROOT / "scripts" / "results" / "h200-block-quota.json").read_text())
    staged = data["gbps"]["kvnumba, staged"][data["block_quota"].index(2)]
    notebook = nbformat.read(ROOT / "notebooks" / "02_hicache_round_trip.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert f"kvnumba's load reaches {staged:.0f} GB/s" in text


def test_notebook_03_finds_its_data_wherever_it_runs(tmp_path):
    """Run from a folder outside the repository (a copy of the notebook there): the saved H200 run is found
    through the kvnumba it imports (the checkout), and through KVNUMBA_RESULTS."""
    copy = tmp_path / "elsewhere" / "03_performance.ipynb"
    copy.parent.mkdir()
    copy.write_bytes((ROOT / "notebooks" / "03_performance.ipynb").read_bytes())
    fresh = render.execute(copy, simulator=True)
    first = "".join(o.get("text", "") for o in [c for c in fresh.cells if c.cell_type == "code"][0].outputs)
    saved = json.loads((ROOT / "scripts" / "results" / "h200.json").read_text())
    assert first.startswith(f"{len(saved['records'])} records from scripts/results/h200.json"), first
    from kvnumba.tools import results

    assert results.find("h200.json") == ROOT / "scripts" / "results" / "h200.json"


def test_kvnumba_results_names_the_folder(tmp_path, monkeypatch):
    from kvnumba.tools import results

    (tmp_path / "h200.json").write_text('{"meta": {}, "records": []}')
    monkeypatch.setenv("KVNUMBA_RESULTS", str(tmp_path))
    assert results.find("h200.json") == tmp_path / "h200.json"
    assert results.load("h200.json") == {"meta": {}, "records": []}
    assert results.find("nothing.json") is None
    with pytest.raises(FileNotFoundError, match=r"nothing\.json not found \(looked in: .*\); set KVNUMBA_RESULTS"):
        results.load("nothing.json")


@pytest.mark.skipif(not SIMULATOR, reason="the trace is the simulator's (on a GPU the loads are PTX)")
def test_the_simulator_trace_records_each_lane_and_nothing_when_off():
    """What notebook 00 draws: inside ``recording()`` each lane's stores, in its order; outside, no list at all."""
    import numpy as np

    import kvnumba
    from kvnumba.kernels.simulator import trace

    item = 512
    src, dst = np.arange(2 * item, dtype=np.uint8).reshape(2, 1, item), np.zeros((2, item), np.uint8)
    src_v, dst_v = src.copy(), np.zeros_like(dst)

    def load():
        kvnumba.transfer_kv_per_layer_pf_lf(src, dst, src_v, dst_v, np.array([1]), np.array([0]), 0, item, item,
                                            block_quota=1, num_warps_per_block=1)

    with trace.recording() as accesses:
        with pytest.raises(RuntimeError, match="already being recorded"):
            with trace.recording():
                pass
        load()
    assert trace.ACCESSES is None
    base = dst.ctypes.data
    stores = [a for a in accesses if a.op == "st" and base <= a.address < base + item]
    assert len(stores) == item // 8 and {a.nbytes for a in stores} == {8} and {a.block for a in stores} == {0}
    for lane in range(32):
        mine = [a.address - base for a in stores if a.thread == lane]
        assert mine == [8 * (lane + 32 * step) for step in range(item // 256)]
    assert (dst[0] == src[1, 0]).all()
    load()  # off: nothing is recorded anywhere
    assert trace.ACCESSES is None and len(accesses) > 0


def test_the_timeline_script_says_it_needs_a_gpu_and_writes_nothing(tmp_path):
    """08's timeline comes from ``scripts/timeline.py`` on a GPU; on the simulator it says so and saves no file."""
    if not SIMULATOR:
        pytest.skip("on a GPU the script measures (scripts/timeline.py)")
    out = tmp_path / "timeline.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "timeline.py"), "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "needs a GPU" in run.stderr
    assert not out.exists()
