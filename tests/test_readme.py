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
