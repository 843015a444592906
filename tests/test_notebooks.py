"""Every notebook runs top to bottom: in a Jupyter kernel on this interpreter, on the simulator when
there is no GPU (tiny sizes), with matplotlib's Agg backend. Stored notebooks carry no outputs."""
import json
import os
import sys
from pathlib import Path

import pytest

from kvnumba.driver.target import SIMULATOR

try:
    import nbclient
    import nbformat
except ImportError:  # the test extra installs both: missing in CI (the simulator) is a failure
    if SIMULATOR:
        raise
    pytest.skip("nbclient/nbformat not installed on this GPU machine", allow_module_level=True)

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
    """A kernelspec that starts ipykernel on this interpreter, whatever kernels Jupyter knows about."""
    spec = tmp_path / "kernels" / "kvnumba-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kvnumba tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    return "kvnumba-test"


def test_notebooks_found():
    assert [p.name for p in NOTEBOOKS] == ["01_layouts.ipynb", "02_hicache_round_trip.ipynb", "03_performance.ipynb",
                                           "04_prototype_a_layout.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: clear the outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_name):
    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ, MPLBACKEND="Agg", PYDEVD_DISABLE_FILE_VALIDATION="1")
    # The package under test, first on the kernel's path (as pytest sees it: installed or not).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path.parent.parent), os.environ.get("PYTHONPATH")]))
    if SIMULATOR or not _gpu():
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def _gpu():
    from kvnumba.driver.target import gpu_available

    return gpu_available()
