"""kvnumba.compat.install_sgl_kernel: SGLang's imports of ``sgl_kernel.kvcacheio`` resolve to kvnumba.

Import resolution, names and signatures, idempotence, clean uninstall, a real ``sgl_kernel`` (a fake
one written to a temporary folder) left in place or refused, and transfers through the alias checked
against ``kvnumba.reference``. ``tests/compat/test_gpu_sgl_kernel_alias.py`` does the transfers on a GPU.
"""
import importlib
import inspect
import sys
import textwrap

import numpy as np
import pytest

import kvnumba
from kvnumba import compat, reference
from tests.helpers.placement import device, host, to_numpy

pytestmark = pytest.mark.smoke  # in the one-minute subset

POISON = 0xA5

# SGLang's sgl_kernel/kvcacheio.py, read from its source: each function's required parameters in
# order, then the trailing ones with their defaults (num_warps_per_block is 16 only on ROCm).
LAUNCH = {"block_quota": 2, "num_warps_per_block": 32}
KV = ("src_k", "dst_k", "src_v", "dst_v", "src_indices", "dst_indices")
TABLES = ("src_k_layers", "dst_k_layers", "src_v_layers", "dst_v_layers", "src_indices", "dst_indices")
TO_PF = ("src_k_layers", "dst_k", "src_v_layers", "dst_v", "src_indices", "dst_indices")
MLA = ("src", "dst", "src_indices", "dst_indices")
SGLANG = {
    "transfer_kv_per_layer": (KV + ("item_size",), LAUNCH),
    "transfer_kv_per_layer_pf_lf": (KV + ("layer_id", "item_size", "src_layout_dim"), LAUNCH),
    "transfer_kv_per_layer_ph_lf": (KV + ("layer_id", "item_size", "src_layout_dim", "page_size", "head_num"),
                                    LAUNCH),
    "transfer_kv_all_layer": (TABLES + ("item_size", "num_layers"), LAUNCH),
    "transfer_kv_all_layer_lf_pf": (TO_PF + ("item_size", "dst_layout_dim", "num_layers"), LAUNCH),
    "transfer_kv_all_layer_lf_ph": (TO_PF + ("item_size", "dst_layout_dim", "num_layers", "page_size", "head_num"),
                                    LAUNCH),
    "transfer_kv_direct": (("src_layers", "dst_layers", "src_indices", "dst_indices", "page_size"), {}),
    "transfer_kv_per_layer_direct_pf_lf": (("src_ptrs", "dst_ptrs", "src_indices", "dst_indices", "layer_id",
                                            "page_size"), {}),
    "transfer_kv_all_layer_direct_lf_pf": (("src_ptrs", "dst_ptrs", "src_indices", "dst_indices", "page_size"), {}),
    "transfer_kv_per_layer_mla": (MLA + ("item_size",), LAUNCH),
    "transfer_kv_per_layer_mla_pf_lf": (MLA + ("layer_id", "item_size", "src_layout_dim"), LAUNCH),
    "transfer_kv_all_layer_mla": (("src_layers", "dst_layers", "src_indices", "dst_indices", "item_size",
                                   "num_layers"), LAUNCH),
    "transfer_kv_all_layer_mla_lf_pf": (("src_layers", "dst", "src_indices", "dst_indices", "item_size",
                                         "dst_layout_dim", "num_layers"), LAUNCH),
}


def _sgl_modules():
    return {name: module for name, module in sys.modules.items() if name == "sgl_kernel" or
            name.startswith("sgl_kernel.")}


@pytest.fixture(autouse=True)
def clean_imports():
    """Every test starts and ends with no hook, and no sgl_kernel imported (the fake real one included)."""
    compat.uninstall_sgl_kernel()
    assert not _sgl_modules(), "an earlier test left sgl_kernel imported"
    meta_path = list(sys.meta_path)
    yield
    compat.uninstall_sgl_kernel()
    for name in _sgl_modules():
        del sys.modules[name]
    assert sys.meta_path == meta_path


@pytest.fixture
def real_sgl_kernel(tmp_path, monkeypatch):
    """A stand-in for an installed SGLang sgl_kernel: a package with other kernels, its own kvcacheio,
    and an __init__ that re-exports from kvcacheio as SGLang's does."""
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""\
        from sgl_kernel.kvcacheio import transfer_kv_per_layer, transfer_kv_per_layer_mla
        from sgl_kernel.other import rmsnorm
        REAL = True
        """))
    (package / "other.py").write_text("def rmsnorm():\n    return 'real rmsnorm'\n")
    (package / "kvcacheio.py").write_text("".join(f"def {name}(*args, **kwargs):\n    return 'real'\n\n\n"
                                                  for name in SGLANG))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return package


def test_both_import_forms_and_import_module_resolve_to_kvnumba():
    alias = compat.install_sgl_kernel()
    import sgl_kernel.kvcacheio
    from sgl_kernel.kvcacheio import transfer_kv_all_layer_lf_pf, transfer_kv_per_layer_pf_lf

    assert sgl_kernel.kvcacheio is alias
    assert importlib.import_module("sgl_kernel.kvcacheio") is alias
    assert sys.modules["sgl_kernel.kvcacheio"] is alias
    assert transfer_kv_per_layer_pf_lf is kvnumba.transfer_kv_per_layer_pf_lf
    assert transfer_kv_all_layer_lf_pf is kvnumba.transfer_kv_all_layer_lf_pf


def test_the_alias_has_exactly_sglangs_names_and_they_are_kvnumbas_functions():
    alias = compat.install_sgl_kernel()
    public = {name for name in vars(alias) if not name.startswith("_")}
    assert public == set(SGLANG) == set(alias.__all__)
    assert len(SGLANG) == 13
    for name in SGLANG:
        assert getattr(alias, name) is getattr(kvnumba, name)


@pytest.mark.parametrize("name", list(SGLANG))
def test_signatures_are_sglangs(name):
    """SGLang's parameters in its order and with its defaults; kvnumba adds only keyword-only ones."""
    required, defaults = SGLANG[name]
    signature = inspect.signature(getattr(compat.install_sgl_kernel(), name))
    positional = [p for p in signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert tuple(p.name for p in positional) == required + tuple(defaults)
    assert {p.name: p.default for p in positional if p.default is not p.empty} == defaults
    extra = [p for p in signature.parameters.values() if p.kind is not p.POSITIONAL_OR_KEYWORD]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra)


def test_install_is_idempotent():
    first = compat.install_sgl_kernel()
    hooks = len(sys.meta_path)
    assert compat.install_sgl_kernel() is first
    assert len(sys.meta_path) == hooks
    import sgl_kernel.kvcacheio

    assert compat.install_sgl_kernel() is sgl_kernel.kvcacheio is first


def test_uninstall_restores_sys_modules_and_the_import_path():
    modules, meta_path = set(sys.modules), list(sys.meta_path)
    compat.install_sgl_kernel()
    import sgl_kernel.kvcacheio  # noqa: F401

    compat.uninstall_sgl_kernel()
    assert set(sys.modules) == modules
    assert sys.meta_path == meta_path
    with pytest.raises(ModuleNotFoundError, match="sgl_kernel"):
        import sgl_kernel  # noqa: F401
    compat.uninstall_sgl_kernel()  # a second uninstall does nothing


def test_the_context_manager_installs_for_the_block():
    with compat.sgl_kernel_installed() as alias:
        assert importlib.import_module("sgl_kernel.kvcacheio") is alias
    assert not _sgl_modules()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("sgl_kernel.kvcacheio")


def test_without_sgl_kernel_the_stand_in_package_holds_only_kvcacheio():
    alias = compat.install_sgl_kernel()
    import sgl_kernel

    assert sgl_kernel.kvcacheio is alias  # imported with the package, as SGLang's does
    assert sgl_kernel.transfer_kv_per_layer is kvnumba.transfer_kv_per_layer  # SGLang's re-exports
    assert sgl_kernel.transfer_kv_all_layer_mla is kvnumba.transfer_kv_all_layer_mla
    with pytest.raises(ModuleNotFoundError, match="sgl_kernel.rmsnorm"):
        import sgl_kernel.rmsnorm  # noqa: F401


def test_the_stand_in_has_a_version_that_importlib_metadata_knows():
    import importlib.metadata

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("sgl-kernel")
    compat.install_sgl_kernel()
    import sgl_kernel

    assert sgl_kernel.__version__ == compat.STAND_IN_VERSION == f"{kvnumba.__version__}+kvnumba"
    assert importlib.metadata.version("sgl-kernel") == importlib.metadata.version("sgl_kernel") == sgl_kernel.__version__
    assert "stand-in" in importlib.metadata.metadata("sgl-kernel")["Summary"]
    compat.uninstall_sgl_kernel()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("sgl-kernel")


def test_a_real_sgl_kernel_keeps_its_own_metadata(real_sgl_kernel):
    import importlib.metadata

    compat.install_sgl_kernel()
    with pytest.raises(importlib.metadata.PackageNotFoundError):  # (this fake real one has none)
        importlib.metadata.version("sgl-kernel")


def test_a_real_sgl_kernel_stays_and_only_its_kvcacheio_is_kvnumbas(real_sgl_kernel):
    alias = compat.install_sgl_kernel()
    import sgl_kernel

    assert sgl_kernel.REAL and sgl_kernel.__file__.startswith(str(real_sgl_kernel))
    assert sgl_kernel.rmsnorm() == "real rmsnorm"  # its other kernels work
    assert sgl_kernel.kvcacheio is alias
    assert sgl_kernel.transfer_kv_per_layer is kvnumba.transfer_kv_per_layer  # its re-export got kvnumba's


def test_an_imported_real_kvcacheio_is_refused_unless_replaced_and_comes_back(real_sgl_kernel):
    import sgl_kernel
    import sgl_kernel.kvcacheio

    real = sgl_kernel.kvcacheio
    assert real.transfer_kv_per_layer() == "real"
    with pytest.raises(RuntimeError, match=r"sgl_kernel.kvcacheio is already imported .*replace=True"):
        compat.install_sgl_kernel()
    assert sys.modules["sgl_kernel.kvcacheio"] is real and sgl_kernel.kvcacheio is real

    alias = compat.install_sgl_kernel(replace=True)
    assert sys.modules["sgl_kernel.kvcacheio"] is alias and sgl_kernel.kvcacheio is alias
    from sgl_kernel.kvcacheio import transfer_kv_direct

    assert transfer_kv_direct is kvnumba.transfer_kv_direct
    assert sgl_kernel.transfer_kv_per_layer_mla is kvnumba.transfer_kv_per_layer_mla  # re-export rebound
    assert sgl_kernel.rmsnorm() == "real rmsnorm"

    compat.uninstall_sgl_kernel()
    assert sys.modules["sgl_kernel.kvcacheio"] is real and sgl_kernel.kvcacheio is real
    assert sgl_kernel.transfer_kv_per_layer_mla is real.transfer_kv_per_layer_mla


# --- transfers through the alias, as SGLang calls them ------------------------------------------


@pytest.mark.needs_target
@pytest.mark.parametrize("imported", [False, True], ids=["found", "imported"])
def test_a_module_named_sgl_kernel_is_refused_and_nothing_is_left_behind(tmp_path, monkeypatch, imported):
    """An ``sgl_kernel.py`` (a module, not a package) cannot hold ``kvcacheio``: install refuses it,
    naming the file, and leaves no hook, no module and no state behind."""
    (tmp_path / "sgl_kernel.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    if imported:
        importlib.import_module("sgl_kernel")
    meta_path, modules = list(sys.meta_path), dict(_sgl_modules())
    with pytest.raises(ImportError, match=rf"the sgl_kernel found at .*sgl_kernel\.py is a module, not a package, "
                                          r"so sgl_kernel\.kvcacheio cannot be installed in it; remove or rename it "
                                          r"\(nothing was installed\)"):
        compat.install_sgl_kernel()
    assert sys.meta_path == meta_path and _sgl_modules() == modules and not compat._installed
    assert getattr(sys.modules.get("sgl_kernel"), "X", 1) == 1 and not hasattr(sys.modules.get("sgl_kernel"),
                                                                                 "kvcacheio")
    with pytest.raises(ImportError), compat.sgl_kernel_installed():
        pass
    assert sys.meta_path == meta_path and not compat._installed


def test_a_hicache_backup_and_load_through_the_alias():
    compat.install_sgl_kernel()
    from sgl_kernel.kvcacheio import transfer_kv_all_layer_lf_pf, transfer_kv_per_layer_pf_lf

    rng = np.random.default_rng(0)
    tokens, layers, item = 64, 3, 32
    k, v = (rng.integers(0, 256, (layers, tokens, item), dtype=np.uint8) for _ in range(2))
    gpu_k, gpu_v = [device(k[i]) for i in range(layers)], [device(v[i]) for i in range(layers)]
    pool_k, pool_v = (host(np.full((tokens, layers, item), POISON, np.uint8)) for _ in range(2))
    si = rng.choice(tokens, 16, replace=False).astype(np.int64)
    di = rng.choice(tokens, 16, replace=False).astype(np.int64)
    transfer_kv_all_layer_lf_pf(kvnumba.layer_table(gpu_k), pool_k, kvnumba.layer_table(gpu_v), pool_v,
                                device(si), device(di), item_size=item, dst_layout_dim=layers * item,
                                num_layers=layers)
    want_k, want_v = (np.full((tokens, layers, item), POISON, np.uint8) for _ in range(2))
    reference.transfer_kv_all_layer_lf_pf(list(k), want_k, list(v), want_v, si, di, item, layers * item, layers)
    np.testing.assert_array_equal(to_numpy(pool_k), want_k)
    np.testing.assert_array_equal(to_numpy(pool_v), want_v)

    back_k, back_v = (device(np.full((tokens, item), POISON, np.uint8)) for _ in range(2))
    transfer_kv_per_layer_pf_lf(pool_k, back_k, pool_v, back_v, device(di), device(si), 1, item, layers * item)
    want_k, want_v = (np.full((tokens, item), POISON, np.uint8) for _ in range(2))
    reference.transfer_kv_per_layer_pf_lf(to_numpy(pool_k), want_k, to_numpy(pool_v), want_v, di, si, 1, item,
                                          layers * item)
    np.testing.assert_array_equal(to_numpy(back_k), want_k)
    np.testing.assert_array_equal(to_numpy(back_v), want_v)


@pytest.mark.needs_target
def test_a_copy_engine_transfer_through_the_alias():
    compat.install_sgl_kernel()
    from sgl_kernel.kvcacheio import transfer_kv_direct

    rng = np.random.default_rng(1)
    src = [rng.integers(0, 256, (32, 16), dtype=np.uint8) for _ in range(4)]
    dst = [np.full((32, 16), POISON, np.uint8) for _ in range(4)]
    si, di = np.arange(4, 12, dtype=np.int64), rng.choice(32, 8, replace=False).astype(np.int64)
    placed = [device(d) for d in dst]
    transfer_kv_direct([host(s) for s in src], placed, si, di, page_size=4)
    reference.transfer_kv_direct(src, dst, si, di, 4)
    for got, want in zip(placed, dst):
        np.testing.assert_array_equal(to_numpy(got), want)
