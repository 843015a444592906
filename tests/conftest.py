import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kvnumba.driver.target import SIMULATOR  # noqa: E402
from placement import ON_GPU  # noqa: E402


def pytest_report_header(config):
    return f"kvnumba target: {'Numba CUDA simulator' if SIMULATOR else ('GPU' if ON_GPU else 'CUDA target, no GPU')}"


def _gpu_skip_reason():
    """Why ``gpu``-marked tests cannot run here (None on a real GPU)."""
    if ON_GPU:
        return None
    if SIMULATOR:
        return "needs a real CUDA GPU (running on the simulator)"
    return "needs a real CUDA GPU (none found)"


def pytest_collection_modifyitems(config, items):
    # One place decides what runs where: `gpu` tests need a real GPU; `needs_target` tests launch
    # kernels, which the simulator can run too. Markers, not keywords: the package tests/gpu/ would
    # put "gpu" in every keyword set below it, marked or not.
    gpu_reason = _gpu_skip_reason()
    target_reason = None if ON_GPU or SIMULATOR else "needs a GPU or NUMBA_ENABLE_CUDASIM=1"
    for item in items:
        if gpu_reason and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=gpu_reason))
        elif target_reason and item.get_closest_marker("needs_target"):
            item.add_marker(pytest.mark.skip(reason=target_reason))
