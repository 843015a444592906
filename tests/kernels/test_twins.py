"""The kernels' intrinsics and decorators and their simulator twins (``kvnumba.kernels.simulator``), and the
driver's launch and its twin (``kvnumba.driver.simulated_launch``): each public
module chooses its world once, at import, with one ``if SIMULATOR:`` that imports the twin's names (its
``__all__``), and both worlds define the same names. The GPU's side is read from the source (``ast``), never
imported, so this runs everywhere."""
import ast
import importlib
from pathlib import Path

import pytest
from numba import cuda

from kvnumba.driver.target import SIMULATOR
from kvnumba.kernels.words import group_max

ROOT = Path(__file__).resolve().parents[2]
TWINS = {"kvnumba.kernels.memory": "kvnumba.kernels.simulator.memory",
         "kvnumba.kernels.tma": "kvnumba.kernels.simulator.tma",
         "kvnumba.kernels.jit": "kvnumba.kernels.simulator.jit",
         "kvnumba.kernels.words": "kvnumba.kernels.simulator.words",
         "kvnumba.kernels.fp8": "kvnumba.kernels.simulator.fp8",
         "kvnumba.kernels.async_copy": "kvnumba.kernels.simulator.async_copy",
         "kvnumba.driver.launch": "kvnumba.driver.simulated_launch"}


def _tree(module):
    return ast.parse(ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text())


def _all(tree):
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["__all__"]]
    return ast.literal_eval(value)


def _choice(tree):
    """The module's one top-level ``if SIMULATOR:``."""
    (choice,) = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                 and node.test.id == "SIMULATOR"]
    return choice


def _public_definitions(statements):
    """Public names that ``statements`` define (functions, classes, assignments; not imports)."""
    names = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("public, twin", TWINS.items())
def test_the_world_is_chosen_once_by_importing_the_twin(public, twin):
    tree = _tree(public)
    choice = _choice(tree)
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "SIMULATOR"]
    assert uses == [choice.test], f"{public}: SIMULATOR is read once, at import, not inside its helpers"
    (imported,) = choice.body
    assert isinstance(imported, ast.ImportFrom) and imported.level == 1
    assert f"{public.rsplit('.', 1)[0]}.{imported.module}" == twin
    assert sorted(alias.name for alias in imported.names) == sorted(_all(_tree(twin)))


@pytest.mark.parametrize("public, twin", TWINS.items())
def test_the_gpu_intrinsics_and_their_twins_have_the_same_names(public, twin):
    tree, twin_tree = _tree(public), _tree(twin)
    names = sorted(_all(twin_tree))
    assert sorted(_public_definitions(_choice(tree).orelse)) == names, f"{public}'s GPU intrinsics"
    assert sorted(_public_definitions(twin_tree.body)) == names, f"{twin}'s definitions"
    assert set(names) <= set(_all(tree)), f"{public}.__all__"


@pytest.mark.parametrize("public, twin", TWINS.items())
def test_the_public_module_holds_the_twins_on_the_simulator_only(public, twin):
    module, twin_module = importlib.import_module(public), importlib.import_module(twin)
    for name in twin_module.__all__:
        assert (getattr(module, name) is getattr(twin_module, name)) == SIMULATOR, name


def test_the_twins_refuse_the_addresses_the_gpu_refuses():
    """Each twin checks its access's alignment as the hardware does (``kernels.simulator.alignment``)."""
    import numpy as np

    from kvnumba import errors as kv_errors
    from kvnumba.kernels.simulator import memory, tma, words

    buffer = np.zeros(128, np.int64)
    base = (buffer.ctypes.data + 127) & ~127
    memory.store_u128(base + 16, (1, 2))
    assert tma.load_shared_u128(base + 16) == (1, 2) and words.load_i32(base + 20) == 0
    refused = [(memory.load_u128, (base + 8,)), (memory.store_u64, (base + 4, 0)), (memory.load_i64, (base + 4,)),
               (words.load_i32, (base + 2,)), (words.store_i64, (base + 4, 0)),
               (tma.load_shared_u128, (base + 8,)), (tma.load_shared_i128, (base + 8,)),
               (tma.load_shared_u32, (base + 2,)), (tma.barrier_init, (base + 4, 1)),
               (tma.bulk_store, (base, base + 16, 8)), (tma.bulk_store, (base + 8, base, 16)),
               (tma.tensor_load, (base + 64, base, 0, 0, 0, 0, 0, base))]
    for twin, args in refused:
        with pytest.raises(kv_errors.MisalignedAddressError):
            twin(*args)


def _failing_lane(out, failing_lane):
    """A kernel body whose lane ``failing_lane`` raises before the warp's maximum (``cuda`` a global: the
    simulator swaps its own in)."""
    lane = cuda.threadIdx.x & 31
    if lane == failing_lane:
        raise ValueError("lane failed")
    out[cuda.threadIdx.x] = group_max(lane, lane, 32)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's warp exchanges (Numba's CUDA simulator)")
def test_a_lane_that_fails_frees_its_warp_mates():
    """A lane that raises before a shuffle: the launch fails at once with its error, not after its warp-mates
    time out, and the next launch's warps are its own."""
    import time

    import numpy as np

    kernel = cuda.jit(_failing_lane)
    out = np.zeros(64, np.int64)
    started = time.monotonic()
    with pytest.raises(ValueError, match="lane failed"):
        kernel[1, 64](out, 5)
    kernel[1, 64](out, -1)
    assert (out == 31).all() and time.monotonic() - started < 60
