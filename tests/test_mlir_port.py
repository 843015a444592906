"""scripts/mlir_port (kvnumba's kernel modules on numba-cuda-mlir) stays in step with the modules it ports: each
port defines the public names of the GPU branch it replaces and takes that branch's place alone. Read from the
source (``ast``): numba-cuda-mlir is not needed. Then scripts/mlir_probe.py runs end to end on numba-cuda (tiny sizes; on the
simulator its figures mean nothing)."""
import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
KERNELS = os.path.join(ROOT, "kvnumba", "kernels")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PORT = _load("mlir_port", os.path.join(ROOT, "scripts", "mlir_port", "__init__.py"))


def _choice(tree):
    (choice,) = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                 and node.test.id == "SIMULATOR"]
    return choice


def _public(statements):
    names = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return {name for name in names if not name.startswith("_")}


def _source(name):
    with open(os.path.join(KERNELS, name + ".py")) as f:
        return f.read()


@pytest.mark.parametrize("name", PORT.PORTS)
def test_each_port_defines_the_names_of_the_gpu_branch_it_replaces(name):
    gpu_branch = _choice(ast.parse(_source(name))).orelse
    with open(os.path.join(ROOT, "scripts", "mlir_port", name + ".py")) as f:
        port = ast.parse(f.read()).body
    assert _public(port) == _public(gpu_branch)


@pytest.mark.parametrize("name", PORT.PORTS)
def test_the_port_takes_the_place_of_the_gpu_branch_alone(name):
    original = ast.parse(_source(name))
    port_file = os.path.join(ROOT, "scripts", "mlir_port", name + ".py")
    (before, _), (port, file), (after, _) = PORT.parts(os.path.join(KERNELS, name + ".py"), port_file)
    with open(port_file) as f:
        assert (port, file) == (f.read(), port_file)
    kept = [ast.dump(node) for node in original.body if node is not _choice(original)]
    assert [ast.dump(node) for node in ast.parse(before).body + ast.parse(after).body] == kept
    # the code after the choice keeps its line numbers (tracebacks name the module's own lines)
    later = [node.lineno for node in original.body if node.lineno > _choice(original).lineno]
    assert [node.lineno for node in ast.parse(after).body] == later


def test_parts_refuses_a_module_without_the_choice(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n")
    with pytest.raises(ValueError, match="if SIMULATOR:"):
        PORT.parts(str(plain), os.path.join(ROOT, "scripts", "mlir_port", "jit.py"))


@pytest.mark.needs_target
def test_the_probe_runs_every_row_on_numba_cuda(tmp_path):
    from kvnumba.driver.target import SIMULATOR

    if not SIMULATOR:
        pytest.skip("the probe's GPU run is a script's job (scripts/mlir_probe.py); here: the simulator's tiny run")
    out = tmp_path / "probe.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mlir_probe.py"), "--worlds", "numba-cuda",
                           "--small", "--budget", "300", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r["row"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {key for _, key, _ in _load("mlir_probe", os.path.join(ROOT, "scripts", "mlir_probe.py")).ROWS}
    for key, row in rows.items():
        if key == "simulator":
            assert row["has_simulator"], row
        else:
            assert row["runs"] and row["bit_exact"], row
            assert row["kernels"], row  # every row's plan took a kernel (the copy engine's too, as its fallback)
    assert any(name.startswith("staged.") for name in rows["h2d-staged"]["kernels"])
    assert rows["direct"]["route"] == "copy_engine"
