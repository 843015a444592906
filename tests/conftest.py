import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kvnumba.driver.target import SIMULATOR  # noqa: E402
from placement import ON_GPU  # noqa: E402


def pytest_report_header(config):
    return f"kvnumba target: {'Numba CUDA simulator' if SIMULATOR else ('GPU' if ON_GPU else 'CUDA target, no GPU')}"


# --- fixtures that change how kvnumba runs, for one test (monkeypatch undoes them) ---------------------
# Plans are cached by value across calls (and so across tests): a fixture that changes how plans are
# built starts and ends with empty plan caches.

@pytest.fixture
def fresh_plans():
    """Empty plan caches before and after the test (``kvnumba.clear_plan_caches``)."""
    from kvnumba.api.transfer import clear_plan_caches

    clear_plan_caches()
    yield
    clear_plan_caches()


@pytest.fixture
def device_path(monkeypatch, fresh_plans):
    """Indices the host can read (everything on the simulator) skip the host-side bounds check and take
    the device path, the kernel's guard, as indices in GPU memory do on a GPU."""
    from kvnumba.api.kernel_plan import KernelPlan

    monkeypatch.setattr(KernelPlan, "_check_host_indices", lambda self, src, dst, window: None)


@pytest.fixture
def always_check(monkeypatch, fresh_plans):
    """Every call as if given ``check=True``: what ``KVNUMBA_CHECK=1`` sets at import
    (tests/test_config.py checks that it does)."""
    from kvnumba.checks import guard

    monkeypatch.setattr(guard, "ALWAYS_CHECK", True)


@pytest.fixture
def batch_runtime(monkeypatch):
    """``batch_runtime(rt)`` makes every copy-engine call of the test use ``rt`` (a
    ``kvnumba.driver.batch_copy`` runtime, e.g. over a stand-in binding); returns ``rt``."""
    from kvnumba.driver import batch_copy

    def install(runtime):
        monkeypatch.setattr(batch_copy, "runtime", lambda: runtime)
        return runtime

    return install


@pytest.fixture
def staged_ring(monkeypatch, fresh_plans):
    """``staged_ring(shape)`` builds the test's staged kernels with another ring
    (``kvnumba.kernels.staged.StagedShape``) than the tuned one."""
    from kvnumba.kernels import staged

    def use(shape):
        monkeypatch.setattr(staged, "SHAPE", shape)
        return shape

    return use


@pytest.fixture
def forced_copy_shape(monkeypatch, fresh_plans):
    """``forced_copy_shape(shape)`` builds every kernel of the test with one inner-loop shape
    (``kvnumba.kernels.warp_copy.CopyShape``) instead of the tuned table's."""
    from kvnumba.kernels import factory

    def force(shape):
        monkeypatch.setattr(factory, "copy_shape_for", lambda src, dst, mla: shape)
        return shape

    return force


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
