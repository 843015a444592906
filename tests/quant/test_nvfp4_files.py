"""``kvnumba convert --dtype nvfp4`` (``kvnumba.convert.nvfp4_pages``): a file's k and v written as vLLM's NVFP4
pages, one uint8 ``kv_cache`` of ``(L, blocks, 2, block_size, H, D/2 + D/16)``, byte for byte what
``kvnumba.quant_reference.copy`` writes into an ``Nvfp4View`` of the same pages; what does not fit is refused
by name. Pure NumPy: no CUDA needed."""
import numpy as np
import pytest

import kvnumba
from kvnumba import quant_reference as qr
from kvnumba.quant import nvfp4 as q
from kvnumba.tools.cli import main

L, T, H, D, P = 2, 8, 2, 64, 4


def _input(path, seed=0):
    rng = np.random.default_rng(seed)
    k, v = (rng.normal(size=(T, L, H, D)).astype(np.float16) for _ in range(2))  # page_first
    np.savez(path, k=k, v=v)
    return k, v


def _expected(k, v):
    pages = [np.zeros((T // P, 2, P, H, q.full_dim(D)), np.uint8) for _ in range(L)]
    idx = np.arange(T, dtype=np.int64)
    qr.copy(kvnumba.PageFirst(k, v), kvnumba.Nvfp4View(pages), idx, idx)
    return np.stack(pages)


def test_the_file_holds_vllms_pages(tmp_path):
    k, v = _input(tmp_path / "in.npz")
    shapes = kvnumba.convert(tmp_path / "in.npz", "pf", "pf", page_size=P, out=tmp_path / "out.npy", dtype="nvfp4")
    got = np.load(tmp_path / "out.npy")
    assert shapes == {"": (L, T // P, 2, P, H, 36)} and got.dtype == np.uint8
    np.testing.assert_array_equal(got, _expected(k, v))


def test_the_command_line_writes_them_too(tmp_path, capsys):
    k, v = _input(tmp_path / "in.npz", seed=1)
    assert main(["convert", str(tmp_path / "in.npz"), str(tmp_path / "out.npy"), "--from", "pf", "--to", "pf",
                 "--dtype", "nvfp4", "--page-size", str(P), "-q"]) == 0
    assert "vLLM nvfp4 pages" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), _expected(k, v))


def test_what_does_not_fit_is_named(tmp_path):
    _input(tmp_path / "in.npz")
    with pytest.raises(ValueError, match="needs page_size"):
        kvnumba.convert(tmp_path / "in.npz", "pf", "pf", out=tmp_path / "a.npy", dtype="nvfp4")
    with pytest.raises(ValueError, match="do not fill pages of 3"):
        kvnumba.convert(tmp_path / "in.npz", "pf", "pf", page_size=3, out=tmp_path / "a.npy", dtype="nvfp4")
    np.savez(tmp_path / "k_only.npz", k=np.zeros((T, L, H, D), np.float16))
    with pytest.raises(ValueError, match="exactly the tensors 'k' and 'v'"):
        kvnumba.convert(tmp_path / "k_only.npz", "pf", "pf", page_size=P, out=tmp_path / "a.npy", dtype="nvfp4")
    np.savez(tmp_path / "f32.npz", k=np.zeros((T, L, H, D), np.float32), v=np.zeros((T, L, H, D), np.float32))
    with pytest.raises(ValueError, match="nvfp4 quantises bfloat16 or float16"):
        kvnumba.convert(tmp_path / "f32.npz", "pf", "pf", page_size=P, out=tmp_path / "a.npy", dtype="nvfp4")
    assert not (tmp_path / "a.npy").exists()
