"""The README's Python examples run as written (on the simulator in CI, on a GPU there)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = pytest.mark.needs_target


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_python_example_runs(index):
    block = _python_blocks()[index]
    if "kvnumba.remote" in block:
        from kvnumba.driver.target import SIMULATOR
        from kvnumba.remote import nixl_available

        if not nixl_available() and not SIMULATOR:  # the README's install line installs it: CI needs it
            pytest.skip("NIXL is not installed on this GPU machine (../shared/gpu/README.md: the nixl_cu13 bundle)")
    exec(compile(block, f"README.md python block {index}", "exec"), {})


def test_the_file_tree_names_every_module_and_stays_in_the_repository():
    """'How it is built' lists every module of the package, and the README cites no path outside the repository."""
    text = README.read_text()
    tree = text.split("\n## How it is built\n", 1)[1].split("```", 2)[1]
    package = README.parent / "kvnumba"
    modules = sorted(p.relative_to(package) for p in package.rglob("*.py") if p.name != "__init__.py"
                     or p.parent == package)
    missing = [str(m) for m in modules if not re.search(rf"(^|\s){re.escape(m.name)}\s", tree, flags=re.M)]
    assert not missing, f"not in the README's file tree: {missing}"
    assert "../" not in text, "the README cites a path outside the repository"


def test_the_set_up_commands_are_the_newcomers():
    """CI runs the two lines under the set-up comments (.ci/run): an install mypy can follow, and the tests
    without any setting (kvnumba picks the simulator itself)."""
    lines = README.read_text().splitlines()
    install = lines[lines.index("# 1) install, then run the demo") + 1]
    tests = lines[lines.index("# 2) run the tests") + 1]
    assert "--config-settings editable_mode=compat" in install and install.endswith("kvnumba demo")
    assert tests == ".venv/bin/python -m pytest -q"
