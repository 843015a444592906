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
    exec(compile(_python_blocks()[index], f"README.md python block {index}", "exec"), {})
