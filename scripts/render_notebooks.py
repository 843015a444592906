"""Re-execute the notebooks and save them in place with their outputs, as GitHub shows them.

    python scripts/render_notebooks.py                     # every notebook; 01, 02, 04 on the simulator
    python scripts/render_notebooks.py notebooks/03_performance.ipynb
    python scripts/render_notebooks.py --gpu               # 01, 02, 04, 05 on this machine's GPU

Each notebook runs top to bottom in a Jupyter kernel on this interpreter (nbclient), from the
notebooks folder, with this checkout's kvnumba first on the path and matplotlib's Agg backend; on
Numba's CUDA simulator unless ``--gpu`` (03 plots the saved H200 run and needs neither). What
changes from run to run and tells a reader nothing (cell timings, the kernel's version details) is
left out, so a new render differs only where an output does. tests/test_notebooks.py executes them
the same way (``execute``), in memory, and never saves them.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
KERNEL_NAME = "kvnumba-notebooks"
# What the committed notebooks say about their kernel: the usual one, whatever ran them.
STORED_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}


@contextlib.contextmanager
def _kernel_on_this_interpreter():
    """A kernelspec that starts ipykernel on this interpreter, whatever kernels Jupyter knows about."""
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "kvnumba notebooks", "language": "python"}))
        before = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [folder, before]))
        try:
            yield KERNEL_NAME
        finally:
            if before is None:
                del os.environ["JUPYTER_PATH"]
            else:
                os.environ["JUPYTER_PATH"] = before


def execute(path, simulator=True, timeout=CELL_TIMEOUT_S):
    """The notebook at ``path``, executed top to bottom (in memory; the file is not touched).
    A cell that raises raises ``nbclient.exceptions.CellExecutionError`` here."""
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    # The inline backend, as in Jupyter: display(fig) stores a PNG (Agg would store only "<Figure ...>").
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline", PYDEVD_DISABLE_FILE_VALIDATION="1")
    # This checkout's kvnumba, first on the kernel's path (installed or not).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    with _kernel_on_this_interpreter() as kernel_name:
        client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name=kernel_name, record_timing=False,
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute(env=env)
    return notebook


def coalesce_streams(outputs):
    """Consecutive prints to one stream as one output (the kernel may send them in one message or several)."""
    merged = []
    for output in outputs:
        if output.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                and merged[-1].name == output.name:
            merged[-1].text += output.text
        else:
            merged.append(output)
    return merged


def for_storage(notebook):
    """``notebook`` without what changes from run to run: cell timings, the kernel's details, how a
    cell's printed text happened to be split into messages."""
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    notebook.metadata = nbformat.from_dict(STORED_METADATA)
    return notebook


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to render (default: all of notebooks/)")
    parser.add_argument("--gpu", action="store_true", help="run on this machine's GPU instead of the simulator")
    args = parser.parse_args(argv)
    for path in args.notebooks or NOTEBOOKS:
        notebook = for_storage(execute(path, simulator=not args.gpu))
        nbformat.write(notebook, path)
        print(f"{path}: {path.stat().st_size / 1000:.0f} KB")


if __name__ == "__main__":
    main()
