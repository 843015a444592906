"""kvnumba is typed: ``mypy kvnumba`` is clean under the project's settings, the annotations catch misuse,
``py.typed`` ships, and the protocols of ``kvnumba.types`` match what the code accepts at run time."""
import importlib.resources
import inspect
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.arrays import array_info
from kvnumba.driver.streams import stream_handle

ROOT = Path(__file__).resolve().parents[1]

needs_mypy = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (it is in the test extra: pip install -e '.[test]')")


def _mypy(*args):
    """Run mypy from the repository root (its settings are pyproject.toml's [tool.mypy]; its cache is the
    git-ignored .mypy_cache there)."""
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@needs_mypy
def test_mypy_kvnumba_is_clean():
    result = _mypy("kvnumba")
    assert result.returncode == 0, f"mypy kvnumba failed:\n{result.stdout}{result.stderr}"


# Each line ending in "# E: code" must give exactly that mypy error; every other line none.
USAGE = '''
    import numpy as np
    import kvnumba as kv

    class Side:  # a stream known only by the __cuda_stream__ protocol
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 1234)

    class Cai:  # an array known only by __cuda_array_interface__
        @property
        def __cuda_array_interface__(self) -> dict[str, object]:
            return {}

    k = np.zeros((16, 64), np.uint8)
    idx = np.arange(4)
    kv.transfer_kv_per_layer(k, k, k, k, idx, idx, 64, stream=Side())
    kv.transfer_kv_per_layer(Cai(), k, k, k, idx, idx, np.int64(64), 2, 32, stream=7, check=True)
    kv.transfer_kv_per_layer_mla(k, k, idx, idx, 64, stream=None)
    kv.transfer_kv_direct([k], [k], idx, idx, 4)
    load = kv.prepare(kv.transfer_kv_per_layer_pf_lf, item_size=64)
    load(idx, idx, 0)
    load(src_indices=idx, dst_indices=idx, layer_id=0, stream=Side())
    t: kv.Transfer = kv.prepare("transfer_kv_per_layer_mla", src=k, dst=k, item_size=64)
    t(idx, idx)
    copy = kv.prepare(kv.copy, src_view=kv.PageFirst(k[:, None]), dst_view=kv.LayerFirst([k]), layers=0)
    copy(idx, idx, block_quota=1)
    kv.copy(kv.PageFirst(k[:, None]), kv.LayerFirst([k]), idx, idx, layers=range(1))
    converted: np.ndarray = kv.convert(k[None], "lf", kv.PageHead, page_size=4, engine="numpy")
    same_dtype: np.ndarray[tuple[int, ...], np.dtype[np.uint8]] = kv.convert(k[None], "layer_first", "pf")
    shapes: dict[str, tuple[int, ...]] = kv.convert("k.npy", "lf", "pf", out="k_pf.npz", overwrite=True)
    pool: np.ndarray = kv.convert((k[None], k[None]), "lf", "page_unified", page_size=4, head_groups=2)
    pair = kv.convert(pool, kv.PageUnified, "pf", 4)
    k_pf, v_pf = kv.convert(pool, "pu", "pf", 4)
    regrouped: np.ndarray = kv.convert(pool, "pu", "pu", 4, head_groups=1)
    pools: dict[str, tuple[int, ...]] = kv.convert("kv.npz", "lf", "pu", 4, out="pool.npz", head_groups=2)
    table: kv.ArrayLike = kv.layer_table([k, k])
    kv.transfer_kv_per_layer("k", k, k, k, idx, idx, 64)  # E: arg-type
    kv.transfer_kv_per_layer(k, k, k, k, idx, idx, 64.0)  # E: arg-type
    kv.transfer_kv_per_layer(k, k, k, k, idx, idx, 64, stream="side")  # E: arg-type
    kv.transfer_kv_direct(k, [k], idx, idx, 4)  # E: arg-type
    kv.copy(k, k, idx, idx)  # E: arg-type
    kv.convert(k, "lf", "pf", engine="torch")  # E: call-overload
    kv.VllmFlashInfer([k], layout="NDH")  # E: arg-type
    kv.prepare(kv.transfer_kv_per_layer, item_size=64).run  # E: attr-defined
    kv.prepare(kv.transfer_kv_per_layer_pf_lf, itemsize=64)  # E: call-overload
    kv.prepare(kv.transfer_kv_per_layer_mla, src_layout_dim=64)  # E: call-overload
    kv.prepare("transfer_kv_per_layer_mlaa", item_size=64)  # E: call-overload
    kv.prepare(kv.transfer_kv_per_layer_pf_lf, item_size="64")  # E: call-overload
    load(idx, idx, layer=0)  # E: call-arg
    load(src_indices=idx, dst_indices=idx, layer_id="0")  # E: arg-type
    copy(idx, idx, blocks=1)  # E: call-arg
    kv.convert(k[None], "lf", "page_frist")  # E: call-overload
    kv.convert(k[None], "lf", "pfd", page_size=4, out="x.npy")  # E: call-overload
    wrong: str = kv.convert(k[None], "lf", "pf")  # E: assignment
    kv.convert(k[None], "lf", "pf", head_groups=2)  # E: call-overload
    kv.convert((k, k), "lf", "pu", 4, head_groups="2")  # E: call-overload
    one: np.ndarray = kv.convert(pool, "pu", "lf", 4)  # E: assignment
    not_shapes: str = kv.convert("k.npy", "lf", "pf", out="o.npy")  # E: assignment
    not_a_table: str = kv.layer_table([k, k])  # E: assignment
'''


@needs_mypy
def test_annotations_catch_misuse(tmp_path):
    source = textwrap.dedent(USAGE)
    expected = {(number, m.group(1)) for number, line in enumerate(source.splitlines(), 1)
                if (m := re.search(r"# E: ([\w-]+)$", line))}
    (tmp_path / "usage.py").write_text(source)
    result = _mypy(str(tmp_path / "usage.py"))
    found = {(int(m.group(1)), m.group(2))
             for m in re.finditer(r"usage\.py:(\d+): error: .*\[([\w-]+)\]$", result.stdout, re.MULTILINE)}
    assert found == expected, result.stdout + result.stderr


# A user's script, type-checked where a user would: outside the repository, against the installed kvnumba (the
# README's install: an editable install that mypy can follow).
GOOD_SCRIPT = '''
import numpy as np
import kvnumba as kv

k = np.zeros((4, 16, 2, 8), np.uint16)
idx = np.arange(4)
pf = kv.convert(k, "layer_first", "page_first")
kv.transfer_kv_per_layer_mla(k[0], k[1], idx, idx, item_size=32)
load = kv.prepare(kv.transfer_kv_per_layer_pf_lf, src_k=pf, src_v=pf, item_size=32, src_layout_dim=128)
load(idx, idx, 0, dst_k=k[0], dst_v=k[1])
'''
BAD_SCRIPT = GOOD_SCRIPT + '''
kv.convert(k, "layer_first", "page_frist")
kv.prepare(kv.transfer_kv_per_layer_pf_lf, item_sise=32)
'''


@needs_mypy
def test_mypy_finds_the_installed_kvnumba_from_outside_the_repository(tmp_path):
    environ = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "MYPYPATH")}
    (tmp_path / "good.py").write_text(GOOD_SCRIPT)
    (tmp_path / "bad.py").write_text(BAD_SCRIPT)
    good = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "good.py"], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr  # e.g. 'Cannot find implementation or library stub'
    bad = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "bad.py"], cwd=tmp_path, env=environ,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1
    assert set(re.findall(r"^bad\.py:(\d+): error: .*\[([\w-]+)\]$", bad.stdout, re.MULTILINE)) == {
        ("12", "call-overload"), ("13", "call-overload")}, bad.stdout  # a misspelt layout name, a misspelt keyword


def test_the_typed_prepare_is_up_to_date():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "typed_prepare.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_py_typed_ships():
    assert importlib.resources.files("kvnumba").joinpath("py.typed").is_file()
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["kvnumba"]


# --- the protocols against the run-time checks ------------------------------------------------------

class _CudaStream:
    def __cuda_stream__(self):
        return (0, 1234)


class _TorchStream:
    cuda_stream = 1234


class _CupyStream:
    ptr = 1234


class _HandleStream:
    handle = 1234


class _CtypesHandleStream:  # Numba's older streams: a ctypes pointer
    def __init__(self):
        import ctypes

        self.handle = ctypes.c_void_p(1234)


STREAMS = {int: 1234, kv.SupportsCudaStream: _CudaStream(), kv.TorchStreamLike: _TorchStream(),
           kv.CupyStreamLike: _CupyStream(), kv.HandleStreamLike: _HandleStream()}


def test_stream_like_lists_every_kind_stream_accepts():
    assert set(typing.get_args(kv.StreamLike)) == set(STREAMS)


@pytest.mark.parametrize("kind", list(STREAMS), ids=lambda k: k.__name__)
def test_each_stream_like_is_accepted(kind):
    stream = STREAMS[kind]
    assert isinstance(stream, kind)
    assert stream_handle(stream) == 1234


def test_stream_protocols_at_run_time():
    assert stream_handle(_CtypesHandleStream()) == 1234
    assert not isinstance(object(), (kv.SupportsCudaStream, kv.TorchStreamLike, kv.CupyStreamLike,
                                     kv.HandleStreamLike))
    with pytest.raises(TypeError, match="stream must be a CUDA stream"):
        stream_handle(object())


class _Cai:
    def __init__(self, array):
        self._array = array

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._array.shape, "typestr": self._array.dtype.str, "strides": None,
                "data": (self._array.ctypes.data, False), "version": 3}


def test_array_like_matches_what_array_info_takes():
    host = np.arange(8, dtype=np.int64)
    assert set(typing.get_args(kv.ArrayLike)) == {kv.SupportsCudaArrayInterface, kv.TorchTensorLike, np.ndarray}
    cai = _Cai(host)
    assert isinstance(cai, kv.SupportsCudaArrayInterface)
    assert array_info(cai, "x").ptr == host.ctypes.data
    assert array_info(host, "x").nbytes == 64

    class OnlyArrayInterface:  # not an ArrayLike: refused, as the alias's docstring says
        __array_interface__ = host.__array_interface__

    assert not isinstance(OnlyArrayInterface(), kv.SupportsCudaArrayInterface)
    with pytest.raises(TypeError, match="x must be an array"):
        array_info(OnlyArrayInterface(), "x")


def test_torch_tensor_is_array_like():
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, dtype=torch.int64)
    assert isinstance(t, kv.TorchTensorLike)
    assert array_info(t, "t").ptr == t.data_ptr()


def test_public_annotations_resolve_at_run_time():
    # typing.get_type_hints (and tools built on it) can read every public signature.
    for name in kv.__all__:
        obj = getattr(kv, name)
        if inspect.isfunction(obj):
            typing.get_type_hints(obj)
        elif isinstance(obj, type) and obj.__module__.startswith("kvnumba.api"):
            for method in ("__init__", "__call__", "shape", "logical", "buffer_shape"):
                if method in vars(obj):
                    typing.get_type_hints(getattr(obj, method))
