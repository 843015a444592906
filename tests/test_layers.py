"""The package's module graph: no import from a lower layer up to a higher one, and no import loops.

Layers, lowest first (a module may import its own layer and the ones below it):

0. ``errors``, ``config``, ``types``, ``_version``, ``memo``, ``integers``, ``quant`` (the codecs: formats and
   their NumPy references): what every layer uses;
1. ``driver``: CUDA through its bindings (and ``arrays``: memory as the driver sees it);
2. ``kernels``: the CUDA kernels and their parameter block;
3. ``checks``: argument and memory checks (they read the kernels' layouts and bounds);
4. ``layouts``: the cache views, one module per family of layouts (what every wing above reads of a layout);
5. ``plan``: what is built once per geometry (``kvnumba.plan``);
6. ``api``: the public calls (and ``reference``, the NumPy oracle of the same calls);
7. the package's public face: ``kvnumba`` itself, ``convert``, ``compat``, ``remote``;
8. ``tools``: the command line and its helpers (``timing``: the GPU timer of the demo and the scripts), and
   ``testing``, ``__main__``.

Every import counts, for the layers and for loops: at module level, inside functions, and under ``if
TYPE_CHECKING:``. An import that only names a type still ties two modules together (a reader must hold both
to follow either), so a loop of them is a loop. Read with ``ast``: nothing is imported.
"""
import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke  # in the one-minute subset

PACKAGE = Path(__file__).resolve().parent.parent / "kvnumba"

LAYERS = {  # module name (or package prefix) -> layer; the longest match wins
    "kvnumba.errors": 0, "kvnumba.config": 0, "kvnumba.types": 0, "kvnumba._version": 0, "kvnumba.memo": 0,
    "kvnumba.integers": 0, "kvnumba.quant": 0,
    "kvnumba.driver": 1, "kvnumba.arrays": 1,
    "kvnumba.kernels": 2,
    "kvnumba.checks": 3,
    "kvnumba.layouts": 4,
    "kvnumba.plan": 5,
    "kvnumba.api": 6, "kvnumba.reference": 6, "kvnumba.quant_reference": 6,
    "kvnumba": 7, "kvnumba.convert": 7, "kvnumba.compat": 7, "kvnumba.remote": 7,
    "kvnumba.tools": 8, "kvnumba.testing": 8, "kvnumba.__main__": 8,
}
LAYER_NAMES = ["base", "driver", "kernels", "checks", "layouts", "plan", "api", "public face", "tools"]

def _modules():
    """``{module name: path}`` of every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _layer(module):
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)
    return LAYERS[best]


def _imports(module, path, source=None):
    """The package's modules that ``module`` imports (anywhere in its file, ``TYPE_CHECKING`` blocks too), with
    the line of each; ``source``: its text, if not the file's."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from X import name``: the submodule X.name where there is one, else X itself
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # ``import kvnumba.layouts.base`` -> that module
                target = target.rpartition(".")[0]
            if target and target != module and target.split(".")[0] == "kvnumba":
                found.append((target, node.lineno))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_layers_cover_every_module():
    assert "kvnumba.plan.kernel_plan" in MODULES and "kvnumba.driver.launch" in MODULES
    for module in MODULES:
        assert _layer(module) is not None


def test_no_import_goes_up_a_layer():
    upward = [f"{module}:{line} imports {target} ({LAYER_NAMES[_layer(module)]} -> {LAYER_NAMES[_layer(target)]})"
              for module, targets in GRAPH.items() for target, line in targets if _layer(target) > _layer(module)]
    assert upward == []


def _loops():
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(frozenset(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return loops


def test_no_import_loops():
    assert [sorted(loop) for loop in _loops()] == []


def test_the_rules_catch_what_they_forbid():
    """The checks above see through relative, function-level and ``from .. import`` imports."""
    targets = dict(GRAPH["kvnumba.plan.kernel_plan"])
    assert "kvnumba.config" in targets  # from .. import config
    assert "kvnumba.driver.launch" in targets  # from ..driver.launch import ...
    assert "kvnumba.plan.copy_plan" in targets  # from .copy_plan import copy_sides
    assert "kvnumba.plan.per_call" in targets  # from . import per_call
    assert any(t == "kvnumba.driver.pointers" for t, _ in GRAPH["kvnumba.plan.cache"])  # inside a function
    assert _layer("kvnumba.plan.kernel_plan") < _layer("kvnumba.api.transfer")
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..layouts import CacheView\n"
    path = MODULES["kvnumba.api.copy"]
    assert dict(_imports("kvnumba.api.copy", path, typing_only)) == {"kvnumba.layouts": 3}  # a type only: counted


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_says_its_job(module):
    """Each module opens with a docstring (its one job)."""
    tree = ast.parse(MODULES[module].read_text())
    if not tree.body and MODULES[module].name == "__init__.py":
        return  # an empty package marker
    assert ast.get_docstring(tree), f"{module} has no docstring saying its job"
