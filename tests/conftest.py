import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kvnumba.driver.target import SIMULATOR  # noqa: E402
from placement import ON_GPU  # noqa: E402


def pytest_report_header(config):
    return f"kvnumba target: {'Numba CUDA simulator' if SIMULATOR else ('GPU' if ON_GPU else 'CUDA target, no GPU')}"


def pytest_collection_modifyitems(config, items):
    if ON_GPU or SIMULATOR:
        return
    skip = pytest.mark.skip(reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1")
    for item in items:
        if "needs_target" in item.keywords:
            item.add_marker(skip)
