"""kvnumba.config: every environment variable kvnumba reads, read there only, validated with errors that
name the variable, and documented on the docs' Settings page (docs/guides/settings.md)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvnumba
from kvnumba import config

pytestmark = pytest.mark.smoke  # in the one-minute subset

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.joinpath("kvnumba").rglob("*.py"), *ROOT.joinpath("scripts").rglob("*.py")])


# --- each variable: good values, and junk naming the variable ------------------------------------------

@pytest.mark.parametrize("text,want", [("1", True), ("true", True), (" YES ", True), ("On", True),
                                       ("0", False), ("false", False), ("no", False), ("OFF", False), ("", False)])
def test_check_flag_values(monkeypatch, text, want):
    monkeypatch.setenv("KVNUMBA_CHECK", text)
    assert config.always_check() is want


def test_check_flag_unset_is_off(monkeypatch):
    monkeypatch.delenv("KVNUMBA_CHECK", raising=False)
    assert config.always_check() is False


@pytest.mark.parametrize("text,want", [("", "auto"), ("page", "page"), (" Bindings ", "bindings"), ("CUDART", "cudart")])
def test_batch_copy_route_values(monkeypatch, text, want):
    monkeypatch.setenv("KVNUMBA_BATCH_COPY", text)
    assert config.batch_copy_route() == want


# variable, junk value, reader, the whole message
JUNK = [
    ("KVNUMBA_CHECK", "maybe", config.always_check,
     "KVNUMBA_CHECK must be one of 1, true, yes, on (on) or 0, false, no, off (off), got 'maybe'"),
    ("KVNUMBA_CHECK", "2", config.always_check,
     "KVNUMBA_CHECK must be one of 1, true, yes, on (on) or 0, false, no, off (off), got '2'"),
    ("KVNUMBA_BATCH_COPY", "Fast", config.batch_copy_route,
     "KVNUMBA_BATCH_COPY must be one of auto, cudart, bindings, page, got 'fast'"),
    ("KVNUMBA_CHUNK_BYTES", "64MiB", config.chunk_bytes,
     "KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '64MiB'"),
    ("KVNUMBA_CHUNK_BYTES", "0", config.chunk_bytes, "KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '0'"),
    ("KVNUMBA_LOAD_PATH", "tma", config.load_path, "KVNUMBA_LOAD_PATH must be one of auto, staged, register, got 'tma'"),
    ("KVNUMBA_REQUIRE_GPU", "always", config.require_gpu,
     "KVNUMBA_REQUIRE_GPU must be one of 1, true, yes, on (on) or 0, false, no, off (off), got 'always'"),
    ("KVNUMBA_RESULTS", "/no/such/folder", config.results_dir, "KVNUMBA_RESULTS must be a folder, got '/no/such/folder'"),
    ("NUMBA_ENABLE_CUDASIM", "yes", config.simulator_setting,
     "NUMBA_ENABLE_CUDASIM must be 1 (Numba's CUDA simulator) or 0 (the GPU), got 'yes'"),
]


@pytest.mark.parametrize("name,text,read,message", JUNK, ids=lambda v: v if isinstance(v, str) else "")
def test_junk_value_is_a_value_error_naming_the_variable(monkeypatch, name, text, read, message):
    monkeypatch.setenv(name, text)
    with pytest.raises(kvnumba.SettingError) as info:  # a ValueError
        read()
    assert str(info.value) == message
    assert config.problems()[name] == message  # what the command line refuses to run with


def test_every_variable_has_a_junk_test():
    assert {name for name, *_ in JUNK} == {*config.VARIABLES, config.SIMULATOR_VARIABLE}


@pytest.mark.parametrize("text,want", [(None, None), ("", None), ("1", True), ("0", False), (" 2 ", True)])
def test_simulator_setting_is_read_as_numba_reads_it(monkeypatch, text, want):
    if text is None:
        monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    else:
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", text)
    assert config.simulator_setting() is want


def test_settings_lists_what_the_user_set(monkeypatch):
    for name in (*config.VARIABLES, config.SIMULATOR_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "register")
    monkeypatch.setenv("KVNUMBA_CHECK", "maybe")
    assert config.settings() == {"KVNUMBA_CHECK": "maybe", "KVNUMBA_LOAD_PATH": "register"}
    assert list(config.problems()) == ["KVNUMBA_CHECK"]
    monkeypatch.setattr(config, "_set_here", {"NUMBA_ENABLE_CUDASIM"})  # set by kvnumba itself: not a setting
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert "NUMBA_ENABLE_CUDASIM" not in config.settings()


@pytest.mark.needs_target
def test_junk_batch_copy_route_refuses_a_copy_engine_call(monkeypatch):
    """Read at the call: the call raises, naming the variable, and copies nothing."""
    monkeypatch.setenv("KVNUMBA_BATCH_COPY", "fast")
    src = [np.arange(32, dtype=np.uint8).reshape(4, 8), np.arange(32, 64, dtype=np.uint8).reshape(4, 8)]
    dst = [np.zeros((1, 1, 4, 8), np.uint8), np.zeros((1, 1, 4, 8), np.uint8)]
    idx = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^KVNUMBA_BATCH_COPY must be one of"):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, idx, idx, 4)
    with pytest.raises(ValueError, match=r"^KVNUMBA_BATCH_COPY must be one of"):
        kvnumba.batch_copy_available()
    assert not dst[0].any() and not dst[1].any()
    monkeypatch.setenv("KVNUMBA_BATCH_COPY", "page")
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, idx, idx, 4)
    assert (dst[0][0, 0] == src[0]).all() and (dst[1][0, 0] == src[1]).all()


def _python(check, code):
    env = dict(os.environ, KVNUMBA_CHECK=check, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_check_is_read_at_import():
    """What the ``always_check`` fixture stands for: ``KVNUMBA_CHECK=1`` in the environment of a fresh process."""
    on = _python("1", "import kvnumba.checks.guard as g; print(g.ALWAYS_CHECK)")
    assert on.returncode == 0, on.stderr[-2000:]
    assert on.stdout.strip() == "True"
    junk = _python("sometimes", "import kvnumba.checks.guard as g")
    assert junk.returncode != 0
    assert junk.stderr.strip().splitlines()[-1] == ("kvnumba.errors.SettingError: KVNUMBA_CHECK must be one of 1, true, "
                                                    "yes, on (on) or 0, false, no, off (off), got 'sometimes'")


def test_a_bad_setting_fails_the_first_use_not_the_import():
    """``import kvnumba`` works (so ``kvnumba info`` can say what is wrong); every public name but the exception
    classes raises the SettingError, each time; catching it by its class works."""
    code = """
import kvnumba as kv
print("imported")
for attempt in range(2):
    try:
        kv.transfer_kv_per_layer
    except kv.SettingError as err:
        print("refused:", err)
print(issubclass(kv.SettingError, ValueError), kv.NoGpuError.__name__)
"""
    done = _python("maybe", code)
    assert done.returncode == 0, done.stderr[-2000:]
    message = "KVNUMBA_CHECK must be one of 1, true, yes, on (on) or 0, false, no, off (off), got 'maybe'"
    assert done.stdout.splitlines() == ["imported", f"refused: {message}", f"refused: {message}", "True NoGpuError"]


# --- read in one place, documented ---------------------------------------------------------------------

# Read the environment only to hand it on to the processes they start: the Jupyter kernel (JUPYTER_PATH,
# PYTHONPATH), the two checkouts' workers and compilers (PYTHONPATH, the checkout first).
CHILD_ENVIRONMENT = {"scripts/render_notebooks.py", "scripts/ab_host_cost.py", "scripts/ptx_diff.py"}


def test_only_config_reads_the_environment():
    reads = re.compile(r"os\.environ\.get|os\.getenv|os\.environ\[[^]]+\](?!\s*=)|environ\.setdefault")
    readers = [str(path.relative_to(ROOT)) for path in SOURCES
               if path.name != "config.py" and reads.search(path.read_text())]
    assert set(readers) <= CHILD_ENVIRONMENT
    assert "KVNUMBA_" not in (ROOT / "scripts/render_notebooks.py").read_text()


def test_every_variable_named_in_the_code_is_a_config_variable():
    named = set()
    for path in SOURCES:
        named |= set(re.findall(r"\bKVNUMBA_[A-Z_]+\b", path.read_text()))
    assert named == set(config.VARIABLES)


def test_the_settings_page_documents_every_variable():
    page = ROOT.joinpath("docs", "guides", "settings.md").read_text()
    documented = re.findall(r"^\| `([A-Z_]+)` \|", page, flags=re.M)
    assert documented == [*config.VARIABLES, config.SIMULATOR_VARIABLE]


# --- kvnumba.config.override: settings for a block, from Python -----------------------------------

def test_override_sets_validates_and_restores(monkeypatch):
    from kvnumba.api.transfer import plain
    from kvnumba.checks import guard

    monkeypatch.delenv("KVNUMBA_LOAD_PATH", raising=False)
    cache = plain("transfer_kv_per_layer_mla")._cache
    cache.entries[("stale",)] = None  # any cached plan is dropped on entry and on exit
    with config.override(load_path="register", check=True):
        assert config.load_path() == "register"
        assert guard.ALWAYS_CHECK is True
        assert ("stale",) not in cache.entries
        cache.entries[("stale",)] = None
    assert ("stale",) not in cache.entries
    assert config.load_path() == "auto" and "KVNUMBA_LOAD_PATH" not in os.environ
    assert guard.ALWAYS_CHECK is config.always_check()


def test_override_refuses_bad_values_and_names_before_changing_anything(monkeypatch):
    monkeypatch.setenv("KVNUMBA_LOAD_PATH", "staged")
    with pytest.raises(ValueError, match="^KVNUMBA_LOAD_PATH must be one of auto, staged, register, got 'tma'"):
        with config.override(load_path="tma"):
            pass
    assert os.environ["KVNUMBA_LOAD_PATH"] == "staged"
    with pytest.raises(TypeError, match="unknown settings load_pth"):
        with config.override(load_pth="register"):
            pass


# --- override from several threads, and its tuning values -------------------------------------------

# Two blocks, A then B, entered and left in every order (A and B in two threads: each step waits for the
# one before it); each sets a variable and a tuning value.
ORDERS = {"B closes first (nested)": ["A+", "B+", "B-", "A-"], "A closes first (overlapping)": ["A+", "B+", "A-", "B-"]}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("before", [None, "register"])
def test_overlapping_overrides_from_two_threads_restore_everything(monkeypatch, order, before):
    import threading

    from kvnumba.kernels.warp_copy import CopyShape

    if before is None:
        monkeypatch.delenv("KVNUMBA_LOAD_PATH", raising=False)
    else:
        monkeypatch.setenv("KVNUMBA_LOAD_PATH", before)
    values = {"A": ("staged", CopyShape(words=1)), "B": ("auto", CopyShape(words=4))}
    steps = ORDERS[order]
    turn = [threading.Event() for _ in steps] + [threading.Event()]
    turn[0].set()
    seen = {}

    def block(name):
        enter, leave = steps.index(f"{name}+"), steps.index(f"{name}-")
        turn[enter].wait(30)
        with config.override(load_path=values[name][0], copy_shape=values[name][1]):
            seen[f"{name}+"] = (os.environ.get("KVNUMBA_LOAD_PATH"), config.tuning("copy_shape"))
            turn[enter + 1].set()
            turn[leave].wait(30)
        seen[f"{name}-"] = (os.environ.get("KVNUMBA_LOAD_PATH"), config.tuning("copy_shape"))
        turn[leave + 1].set()

    threads = [threading.Thread(target=block, args=(name,)) for name in "AB"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # The latest block entered that is still open wins; after the last one, everything is as before.
    assert seen["A+"] == values["A"] and seen["B+"] == values["B"]
    first_out, last_out = steps[2][0], steps[3][0]
    assert seen[f"{first_out}-"] == values[last_out]
    assert seen[f"{last_out}-"] == (before, None)
    assert os.environ.get("KVNUMBA_LOAD_PATH") == before and config.tuning("copy_shape") is None
    assert not config._open and not config._before


def _bad_tuning():
    from kvnumba.kernels.staged import StagedShape
    from kvnumba.kernels.warp_copy import CopyShape

    return [
        ({"copy_shape": (2, True, True, "nc")}, TypeError,
         r"^copy_shape must be a kvnumba\.kernels\.warp_copy\.CopyShape or None, got tuple"),
        ({"copy_shape": CopyShape(words="2")}, TypeError, r"^copy_shape\.words must be int .*got str '2'"),
        ({"copy_shape": CopyShape(wide=1)}, TypeError, r"^copy_shape\.wide must be bool .*got int 1"),
        ({"staged_shape": "large"}, TypeError, r"^staged_shape must be a kvnumba\.kernels\.staged\.StagedShape"),
        ({"staged_shape": StagedShape(stages=3.0)}, TypeError, r"^staged_shape\.stages must be int"),
        ({"map_store": object()}, TypeError, r"^map_store must be a kvnumba\.plan\.tensor_maps\.MapStore or None"),
        ({"l2_promotion": "L2_512B"}, kvnumba.SettingError, r"^l2_promotion must be one of NONE, L2_64B"),
        ({"host_index_checks": "no"}, TypeError, r"^host_index_checks must be True, False or None, got str"),
        ({"load_path": "register", "copy_shape": [1]}, TypeError, r"^copy_shape must be"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_tuning())))
def test_override_refuses_bad_tuning_values_before_changing_anything(monkeypatch, case):
    values, error, match = _bad_tuning()[case]
    monkeypatch.delenv("KVNUMBA_LOAD_PATH", raising=False)
    before = dict(config._tuning)
    with pytest.raises(error, match=match):
        with config.override(**values):
            pass
    assert config._tuning == before and "KVNUMBA_LOAD_PATH" not in os.environ and not config._open


@pytest.mark.needs_target
def test_a_setting_changed_under_override_reaches_the_next_fp8_copy():
    """FP8 copies' plans are cached plans like the others: kv.clear_plan_caches() and config.override drop them."""
    import numpy as np

    import kvnumba as kv
    from kvnumba.api.transfer import plain as plain_transfer
    from kvnumba.plan.fp8_plan import Fp8Plan
    from tests.fp8.cases import copy_plan, make_fp8
    from tests.helpers.placement import PLACE

    rng = np.random.default_rng(0)
    plain = kv.LayerFirst(*(PLACE["host"](rng.normal(size=(2, 8, 2, 16)).astype(np.float16)) for _ in range(2)))
    _, fp8 = make_fp8("LayerFirst", 2, 8, 4, 2, 16, dtype="float16")
    idx = np.arange(2, dtype=np.int64)
    kv.copy(plain, fp8, idx, idx)
    assert copy_plan(plain, fp8).host_index_checks
    with config.override(host_index_checks=False):
        assert not copy_plan(plain, fp8).host_index_checks
        kv.copy(plain, fp8, idx, idx)
    assert copy_plan(plain, fp8).host_index_checks
    cached = plain_transfer("copy")._cache.entries
    assert any(isinstance(entry.plan, Fp8Plan) for entry in cached.values())  # kv.copy's one cache holds it
    kv.clear_plan_caches()
    assert not cached
