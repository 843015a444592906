"""Where kvnumba runs, decided at ``import kvnumba``: the GPU, or Numba's CUDA simulator when there is no CUDA
driver (said once, as a warning naming the setting); ``KVNUMBA_REQUIRE_GPU=1`` turns that into one clear error;
the command line agrees, and ``python -m pytest`` runs with or without ``NUMBA_ENABLE_CUDASIM``."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvnumba.driver import target
from kvnumba.driver.target import NoGpuError, choose
from kvnumba.errors import SettingError

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER = target.driver_missing()  # None on a machine with a CUDA driver
needs_no_driver = pytest.mark.skipif(NO_DRIVER is None, reason="this machine has a CUDA driver: the fallback to the "
                                                               "simulator cannot happen here (choose() is tested above)")


def _gone():
    return "libcuda.so.1 not found"


def _there():
    return None


def _never():
    raise AssertionError("the driver need not be looked for")


# setting, require, numba.cuda imported (None, or whether on the simulator), driver probe ->
# simulator, automatic, reason, refusal (type, start of message)
CASES = [
    ("unset, driver", None, False, None, _there, False, False, "a CUDA driver", None),
    ("unset, no driver", None, False, None, _gone, True, True, "no CUDA driver (libcuda.so.1 not found)", None),
    ("asked for", True, False, None, _never, True, False, "NUMBA_ENABLE_CUDASIM=1", None),
    ("GPU target asked for", False, False, None, _never, False, False, "NUMBA_ENABLE_CUDASIM=0", None),
    ("require, no driver", None, True, None, _gone, False, False, "no CUDA driver (libcuda.so.1 not found)",
     (NoGpuError, "KVNUMBA_REQUIRE_GPU=1, but there is no CUDA driver (libcuda.so.1 not found): install the NVIDIA "
                  "driver, or unset KVNUMBA_REQUIRE_GPU to run on Numba's CUDA simulator")),
    ("require, driver", None, True, None, _there, False, False, "a CUDA driver", None),
    ("require and the simulator", True, True, None, _never, True, False, "NUMBA_ENABLE_CUDASIM=1",
     (NoGpuError, "KVNUMBA_REQUIRE_GPU=1, but NUMBA_ENABLE_CUDASIM=1 asks for Numba's CUDA simulator")),
    ("numba.cuda first, on the simulator", None, False, True, _never, True, False, "NUMBA_ENABLE_CUDASIM=1", None),
    ("numba.cuda first, GPU target, driver", None, False, False, _there, False, False, "a CUDA driver", None),
    ("numba.cuda first, GPU target, no driver", None, False, False, _gone, False, False,
     "no CUDA driver (libcuda.so.1 not found)",
     (NoGpuError, "there is no CUDA driver (libcuda.so.1 not found), and numba.cuda was imported before kvnumba, on "
                  "its GPU target, so kvnumba cannot switch to Numba's CUDA simulator: import kvnumba before "
                  "numba.cuda, or set NUMBA_ENABLE_CUDASIM=1")),
    ("bad setting", SettingError("NUMBA_ENABLE_CUDASIM must be ..."), False, None, _never, False, False,
     "a setting cannot be used: NUMBA_ENABLE_CUDASIM must be ...", (SettingError, "NUMBA_ENABLE_CUDASIM must be")),
    ("bad require", None, SettingError("KVNUMBA_REQUIRE_GPU must be ..."), None, _never, False, False,
     "a setting cannot be used: KVNUMBA_REQUIRE_GPU must be ...", (SettingError, "KVNUMBA_REQUIRE_GPU must be")),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_choice(case):
    _, setting, require, imported, probe, simulator, automatic, reason, refusal = case
    got = choose(setting, require, imported, probe)
    assert (got.simulator, got.automatic, got.reason) == (simulator, automatic, reason)
    if refusal is None:
        assert got.refusal is None
    else:
        assert type(got.refusal) is refusal[0] and str(got.refusal).startswith(refusal[1]), got.refusal


def _python(code, **env):
    """``code`` in a fresh interpreter with this environment less NUMBA_ENABLE_CUDASIM, plus ``env``."""
    environ = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "KVNUMBA_REQUIRE_GPU")}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True,
                          timeout=300)


TRANSFER = """
    import warnings
    warnings.simplefilter("always")
    import numpy as np
    import kvnumba as kv
    src = np.arange(16 * 64, dtype=np.uint8).reshape(16, 64)
    dst = np.zeros_like(src)
    kv.transfer_kv_per_layer_mla(src, dst, np.array([3, 5]), np.array([0, 1]), item_size=64)  # line 8
    kv.transfer_kv_per_layer_mla(src, dst, np.array([3]), np.array([2]), item_size=64)
    print((dst[1] == src[5]).all() and (dst[2] == src[3]).all(), kv.__name__)
"""


@needs_no_driver
def test_without_a_driver_or_a_setting_kvnumba_runs_on_the_simulator_and_says_so_once():
    done = _python(TRANSFER)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "kvnumba"]
    warnings = [line for line in done.stderr.splitlines() if "UserWarning" in line]
    assert warnings == [f"<string>:8: UserWarning: {target.WARNING}"], done.stderr  # at the caller's line, once
    assert "NUMBA_ENABLE_CUDASIM=1" in target.WARNING and "KVNUMBA_REQUIRE_GPU=1" in target.WARNING


def test_the_simulator_asked_for_says_nothing():
    done = _python(TRANSFER, NUMBA_ENABLE_CUDASIM="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UserWarning" not in done.stderr


@needs_no_driver
def test_require_gpu_is_one_clear_error():
    done = _python(TRANSFER, KVNUMBA_REQUIRE_GPU="1")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"kvnumba.errors.NoGpuError: KVNUMBA_REQUIRE_GPU=1, but there is no CUDA driver ({NO_DRIVER}): install the "
        "NVIDIA driver, or unset KVNUMBA_REQUIRE_GPU to run on Numba's CUDA simulator")
    assert 'File "<string>", line 8' in done.stderr  # raised at the first use, in the caller's line
    assert done.stderr.count("File ") <= 3, done.stderr  # a short traceback: the caller, and kvnumba's __getattr__


@needs_no_driver
def test_numba_cuda_imported_first_without_a_driver_says_what_to_do():
    done = _python("from numba import cuda\n" + textwrap.dedent(TRANSFER))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        "kvnumba.errors.NoGpuError: there is no CUDA driver (libcuda.so.1 not found), and numba.cuda was imported "
        "before kvnumba, on its GPU target, so kvnumba cannot switch to Numba's CUDA simulator: import kvnumba before "
        "numba.cuda, or set NUMBA_ENABLE_CUDASIM=1")


def _cli(*args, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "KVNUMBA_REQUIRE_GPU",
                                                               "KVNUMBA_CHECK")}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvnumba", *args], env=environ, capture_output=True, text=True,
                          timeout=300)


@needs_no_driver
def test_the_command_line_agrees():
    info = _cli("info")
    assert info.returncode == 0 and info.stderr == "", info.stderr
    assert (f"GPU:                   Numba's CUDA simulator (no CUDA driver ({NO_DRIVER}), chosen by kvnumba; NumPy "
            "arrays stand for GPU memory)") in info.stdout.splitlines()
    assert "settings:              none set" in info.stdout.splitlines()  # kvnumba's own NUMBA_ENABLE_CUDASIM is not one
    demo = _cli("demo")
    assert demo.returncode == 0, demo.stderr
    assert demo.stderr.splitlines() == [f"kvnumba: no CUDA driver ({NO_DRIVER}): running on Numba's CUDA simulator "
                                        "(set NUMBA_ENABLE_CUDASIM=1 to choose it, or KVNUMBA_REQUIRE_GPU=1 to refuse)"]
    refused = _cli("demo", KVNUMBA_REQUIRE_GPU="1")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.splitlines() == [f"kvnumba demo: error: KVNUMBA_REQUIRE_GPU=1, but there is no CUDA driver "
                                           f"({NO_DRIVER}): install the NVIDIA driver, or unset KVNUMBA_REQUIRE_GPU "
                                           "to run on Numba's CUDA simulator"]
    reported = _cli("info", "--json", KVNUMBA_REQUIRE_GPU="1")
    assert reported.returncode == 1 and '"target": "none"' in reported.stdout
    assert reported.stderr.startswith("kvnumba info: error: KVNUMBA_REQUIRE_GPU=1, but there is no CUDA driver")


@pytest.mark.parametrize("args", [["info"], ["convert", "a.npy", "b.npy", "--from", "lf", "--to", "pf"], ["demo"]])
def test_a_bad_setting_is_one_line_for_every_command(args):
    done = _cli(*args, KVNUMBA_CHECK="maybe")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"kvnumba {args[0]}: error: KVNUMBA_CHECK must be one of 1, true, yes, on (on) "
                                        "or 0, false, no, off (off), got 'maybe': fix or unset it"]
    assert ("KVNUMBA_CHECK=maybe (cannot be used)" in done.stdout) == (args == ["info"])  # info still reports


def test_help_and_version_work_whatever_the_settings():
    from kvnumba import __version__

    helped = _cli("--help", KVNUMBA_CHECK="maybe")
    assert helped.returncode == 0 and "usage: kvnumba" in helped.stdout and helped.stderr == ""
    version = _cli("--version", KVNUMBA_CHECK="maybe")
    assert version.returncode == 0 and version.stdout == f"kvnumba {__version__}\n"


def test_pytest_runs_without_the_setting(tmp_path):
    """``python -m pytest`` without NUMBA_ENABLE_CUDASIM: kernels run (on the simulator, without a GPU), and a
    GPU-only test is skipped, with the reason, when it runs."""
    # Not the outer run's pytest settings either (an xdist worker's PYTEST_XDIST_* would make the inner
    # run's plugins think they are under xdist).
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM" and not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "tests/safety/test_bad_calls.py::test_kernel_guard_skips_and_flags",
                           "tests/views/test_copy.py::test_torch_views", "tests/safety/test_validation.py"],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if NO_DRIVER is not None:
        assert "needs a real CUDA GPU (kvnumba runs on Numba's CUDA simulator: no CUDA driver" in done.stdout
    assert " passed" in done.stdout.splitlines()[-1]


def test_host_has_one_meaning_and_one_definition():
    """``HOST`` is the device number of host memory (-1), assigned once, in the driver layer (the lowest); CUDA's
    memory-type codes have names of their own (``MEMORY_HOST``, ``MEMORY_DEVICE``). Every module of kvnumba
    that has a ``HOST`` has that one."""
    import ast
    import importlib
    import pathlib

    import kvnumba
    from kvnumba.driver import pointers

    root = pathlib.Path(kvnumba.__file__).parent
    assigned = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id in ("HOST", "DEVICE"):
                        assigned.setdefault(name.id, []).append(str(path.relative_to(root)))
    assert assigned == {"HOST": ["driver/pointers.py"]}, assigned
    assert pointers.HOST == -1 and (pointers.MEMORY_HOST, pointers.MEMORY_DEVICE) == (1, 2)
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("kvnumba", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if module == "kvnumba.__main__":  # runs the command line
            continue
        found = getattr(importlib.import_module(module), "HOST", pointers.HOST)
        assert found is pointers.HOST, (module, found)
