"""What every test shares: the report header, fixtures that change how kvnumba runs, and the markers' skips.
tests/ is a package, so pytest puts the checkout on the path and the helpers import as ``tests.helpers.*``."""
import contextlib

import pytest

from kvnumba.driver.target import CHOICE, SIMULATOR
from kvnumba.testing import requires_gpu


def pytest_report_header(config):
    if SIMULATOR:
        return f"kvnumba target: Numba's CUDA simulator ({CHOICE.reason})"
    return f"kvnumba target: the GPU target ({CHOICE.reason})"


# --- fixtures that change how kvnumba runs, for one test ---------------------------------------------
# Through kvnumba.config.override (or monkeypatch, for a stand-in runtime). Plans are cached by value
# across calls (and so across tests): override drops them on entry and exit.

@pytest.fixture
def fresh_plans():
    """Empty plan caches before and after the test (``kvnumba.clear_plan_caches``)."""
    from kvnumba.api.transfer import clear_plan_caches

    clear_plan_caches()
    yield
    clear_plan_caches()


@pytest.fixture
def device_path(fresh_plans):
    """Indices the host can read (everything on the simulator) skip the host-side bounds check and take
    the device path, the kernel's guard, as indices in GPU memory do on a GPU."""
    from kvnumba import config

    with config.override(host_index_checks=False):
        yield


@pytest.fixture
def always_check(fresh_plans):
    """Every call as if given ``check=True``: ``KVNUMBA_CHECK=1`` (tests/test_config.py checks that the
    variable does it at import too)."""
    from kvnumba import config

    with config.override(check=True):
        yield


@pytest.fixture
def batch_runtime(monkeypatch):
    """``batch_runtime(rt)`` makes every copy-engine call of the test use ``rt`` (a
    ``kvnumba.driver.batch_copy`` runtime, e.g. over a stand-in binding); returns ``rt``. The tests' stream
    handles are made up, so the driver is not asked whether they are being captured either (it would
    follow the handle)."""
    from kvnumba.driver import batch_copy, capture

    def install(runtime):
        monkeypatch.setattr(batch_copy, "runtime", lambda: runtime)
        monkeypatch.setattr(capture, "capturing", lambda handle: False)
        return runtime

    return install


@pytest.fixture
def staged_ring(fresh_plans):
    """``staged_ring(shape)`` builds the test's staged kernels with another ring
    (``kvnumba.kernels.staged.StagedShape``) than the tuned one."""
    from kvnumba import config

    with contextlib.ExitStack() as stack:
        def use(shape):
            stack.enter_context(config.override(staged_shape=shape))
            return shape

        yield use


@pytest.fixture
def forced_copy_shape(fresh_plans):
    """``forced_copy_shape(shape)`` builds every kernel of the test with one inner-loop shape
    (``kvnumba.kernels.warp_copy.CopyShape``) instead of the tuned table's."""
    from kvnumba import config

    with contextlib.ExitStack() as stack:
        def force(shape):
            stack.enter_context(config.override(copy_shape=shape))
            return shape

        yield force


def pytest_collection_modifyitems(config, items):
    # One place decides what runs where: `gpu` tests need a real GPU, and get kvnumba.testing.requires_gpu,
    # whose condition is asked when each test runs (collecting them never touches CUDA). Markers, not
    # keywords: `-k gpu` also matches every test whose file or name says gpu (tests/*/test_gpu_*.py), marked or not.
    # `needs_target` tests launch kernels: they need the simulator or a GPU (only NUMBA_ENABLE_CUDASIM=0 on a
    # machine without a GPU has neither). `nixl` tests need NIXL's Python API (kvnumba.remote).
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(requires_gpu)
        elif item.get_closest_marker("needs_target"):
            item.add_marker(_needs_target)
    _without_nixl(items)


# --- NIXL: optional, and its absence is one line per test -------------------------------------------

NIXL_MISSING = ("kvnumba.remote's tests need NIXL: pip install --no-deps \"nixl-cu13>=1.5.1,<2\" "
                "(\"nixl-cu12>=1.5.1,<2\" with a CUDA 12 driver)")


class _NixlMissing(pytest.Item):
    """Stands in for a `nixl` test where NIXL is missing on the simulator (CI, where the README's install line
    brings it; a laptop without it): it fails with one line, and the test's fixtures (agents, peers) are never
    set up."""

    def runtest(self):
        pytest.fail(NIXL_MISSING, pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


def _without_nixl(items):
    needs = [i for i, item in enumerate(items)
             if item.get_closest_marker("nixl") and not item.get_closest_marker("gpu")]
    if not needs:
        return
    from kvnumba.remote import nixl_available

    if nixl_available():
        return
    for i in needs:
        item = items[i]
        if SIMULATOR:
            stand_in = _NixlMissing.from_parent(item.parent, name=item.name)
            stand_in.own_markers = list(item.own_markers)
            stand_in.keywords.update(item.keywords)
            items[i] = stand_in
        else:  # a GPU machine may lack the NIXL bundle: its GPU suite runs without it
            item.add_marker(pytest.mark.skip(reason="NIXL is not installed on this GPU machine"))


# --- the GPU tests' skips: one summary line, not one per test file --------------------------------

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and call.when == "setup" and item.get_closest_marker("gpu") \
            and isinstance(report.longrepr, tuple):
        from kvnumba.testing import gpu_skip_reason

        reason = gpu_skip_reason()
        if reason is not None:  # no GPU here: one reason and one place, which -ra folds into one line
            report.longrepr = (__file__, None, reason)  # "SKIPPED [N] tests/conftest.py: needs a real CUDA GPU ..."
    return report


class _NoTarget:
    """True where kernels cannot run: not the simulator, and no GPU (asked when a test runs)."""

    def __bool__(self):
        from kvnumba.testing import gpu_skip_reason

        return not SIMULATOR and gpu_skip_reason() is not None


_needs_target = pytest.mark.skipif(_NoTarget(), reason="launches kernels: needs a GPU or Numba's CUDA simulator "
                                                       "(NUMBA_ENABLE_CUDASIM=0 is set and no GPU answers)")
