"""kvnumba.plan.spec.SPECS is the one table of entry points: the functions, the reference, the kernels,
the tests and the benchmark all follow it, and every entry point in it is tested."""
import importlib.util
import inspect
from pathlib import Path

import pytest

import kvnumba
from tests.helpers.cases import ENTRY_POINTS
from kvnumba import reference
from kvnumba.plan.spec import DIRECT_ENTRY_POINTS, KERNEL_ENTRY_POINTS, PAGE_FIRST_DIRECT, SPECS
from kvnumba.kernels.layouts import PARTS, Layout

ROOT = Path(__file__).resolve().parents[2]
NAMES = list(SPECS)


def test_the_table_holds_the_seeds_thirteen_and_copy():
    assert len(KERNEL_ENTRY_POINTS) == 10 and len(DIRECT_ENTRY_POINTS) == 3
    assert sorted(KERNEL_ENTRY_POINTS + DIRECT_ENTRY_POINTS + ["copy"]) == sorted(NAMES)


LAUNCH = ("block_quota", "num_warps_per_block", "route")


def _parameters(fn):
    """Every parameter but kvnumba's keyword-only ``stream`` and ``check``."""
    return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("stream", "check")]


@pytest.mark.parametrize("name", NAMES)
def test_public_function_has_the_tables_arguments_and_defaults(name):
    spec = SPECS[name]
    params = _parameters(getattr(kvnumba, name))
    assert tuple(p.name for p in params) == spec.params
    assert {p.name: p.default for p in params if p.default is not p.empty} == spec.defaults
    keyword_only = [p.name for p in inspect.signature(getattr(kvnumba, name)).parameters.values()
                    if p.kind is p.KEYWORD_ONLY]
    assert keyword_only == (["block_quota", "num_warps_per_block", "route"] if name == "copy" else []) + ["stream", "check"]


@pytest.mark.parametrize("name", NAMES)
def test_reference_takes_the_same_arguments(name):
    """The reference moves bytes only: it may leave out the launch shape."""
    params = tuple(p.name for p in _parameters(getattr(reference, name)) if p.name not in LAUNCH)
    assert params == tuple(n for n in SPECS[name].params if n not in LAUNCH)


@pytest.mark.parametrize("name", NAMES)
def test_layouts_roles_and_buffers(name):
    spec = SPECS[name]
    geometry = [n for n in spec.params if spec.role(n) == "geometry"]
    assert list(spec.buffers) == geometry[:len(spec.buffers)]  # a Transfer relies on buffers coming first
    if name == "copy":
        assert spec.src_layout is None and spec.buffers == ("src_view", "dst_view")
    elif spec.kind == "kernel":
        assert spec.src_layout in PARTS and spec.dst_layout in PARTS  # a kernel the factory can build
        assert spec.per_layer == ("layer_id" in spec.params)
    else:
        assert {spec.src_layout, spec.dst_layout} <= {Layout.LAYER_FIRST, PAGE_FIRST_DIRECT}
        assert not spec.per_layer


def test_one_layer_matches_the_names():
    for name, spec in SPECS.items():
        if name != "copy":
            assert spec.one_layer == ("per_layer" in name), name


def test_tests_cover_every_entry_point():
    assert list(ENTRY_POINTS) == KERNEL_ENTRY_POINTS  # kernels/, safety/test_bad_calls
    direct_tests = ROOT.joinpath("tests", "copy_engine", "test_entry_points.py").read_text()
    assert all(name in direct_tests for name in DIRECT_ENTRY_POINTS)
    assert "kv.copy(" in ROOT.joinpath("tests", "views", "test_copy.py").read_text()


def test_benchmark_times_every_entry_point():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert {op for op, _, _ in bench.CASES} == set(KERNEL_ENTRY_POINTS)
    assert {op for op, _, _ in bench.DIRECT_CASES} == set(DIRECT_ENTRY_POINTS)
    assert ("transfer_kv_per_layer_pf_lf", "h2d", "mha") in bench.CASES  # HiCache's load, as SGLang runs it
    assert ("transfer_kv_all_layer_mla_lf_pf", "d2h", "mla") in bench.CASES  # an MLA backup
