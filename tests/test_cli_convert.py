"""``kvnumba convert`` on real files, ``kvnumba info``: pure logic, no CUDA needed."""
import os
import re
import sys
import types

import numpy as np
import pytest

import kvnumba
from kvnumba.tools import cli, convert_files


def _cache(layers=3, tokens=16, heads=2, head_dim=8, dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, (layers, tokens, heads, head_dim)).astype(dtype)


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("dst", ["page_first", "page_first_direct", "page_head"])
def test_npy_round_trip(tmp_path, capsys, dst):
    lf = _cache()
    np.save(tmp_path / "k.npy", lf)
    assert cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "out.npy"), "--from", "layer_first",
                     "--to", dst, "--page-size", "4"]) == 0
    got = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(got, kvnumba.convert(lf, "layer_first", dst, 4))
    assert cli.main(["convert", str(tmp_path / "out.npy"), str(tmp_path / "back.npy"), "--from", dst, "--to", "lf",
                     "--page-size", "4", "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), lf)
    out, err = capsys.readouterr()
    assert f"out.npy: {dst} {got.shape}" in out
    assert "100%" in err  # the progress bar of the first run (the second was --quiet)
    assert _files(tmp_path) == ["back.npy", "k.npy", "out.npy"]  # no temporary files left


@pytest.mark.parametrize("via", ["option", "env"])
def test_tiny_chunks(tmp_path, capsys, monkeypatch, via):
    lf = _cache(layers=4, tokens=32)
    np.save(tmp_path / "k.npy", lf)
    seen = []
    real = convert_files.Progress.advance
    monkeypatch.setattr(convert_files.Progress, "advance", lambda self, n: (seen.append(n), real(self, n)))
    args = ["convert", str(tmp_path / "k.npy"), str(tmp_path / "ph.npy"), "--from", "lf", "--to", "ph",
            "--page-size", "8"]
    if via == "option":
        args += ["--chunk-bytes", "300"]
    else:
        monkeypatch.setenv(convert_files.CHUNK_ENV, "300")
    assert cli.main(args) == 0
    # one page of one layer is 8 tokens x 2 heads x 8 x 2 B = 256 B: each chunk is one such block
    assert seen == [256] * (4 * 4)
    np.testing.assert_array_equal(np.load(tmp_path / "ph.npy"), kvnumba.convert(lf, "lf", "ph", 8))


@pytest.mark.parametrize("value,want", [(None, 64 << 20), ("", 64 << 20), ("4096", 4096), (" 1 ", 1)])
def test_chunk_bytes_from_the_environment(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(convert_files.CHUNK_ENV, raising=False)
    else:
        monkeypatch.setenv(convert_files.CHUNK_ENV, value)
    assert convert_files.default_chunk_bytes() == want


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", "64M"])
def test_bad_chunk_bytes_in_the_environment_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(convert_files.CHUNK_ENV, value)
    with pytest.raises(ValueError, match=rf"^KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '{re.escape(value)}'$"):
        convert_files.default_chunk_bytes()


def test_chunks_cover_pages_then_layers():
    # (L=2, pages=3, P=2, item=4 B): a column (one page, every layer) is 16 B
    got = list(convert_files.chunks((2, 3, 2, 4), 1, 32))
    assert got == [(slice(0, 2), slice(0, 2)), (slice(0, 2), slice(2, 3))]
    got = list(convert_files.chunks((2, 3, 2, 4), 1, 8))
    assert len(got) == 6 and got[0] == (slice(0, 1), slice(0, 1))


def test_npz_every_array(tmp_path, capsys):
    k, v = _cache(seed=1), _cache(seed=2)
    mla = _cache(heads=1, head_dim=12, seed=3)
    np.savez_compressed(tmp_path / "cache.npz", k=k, v=v, mla=mla)
    assert cli.main(["convert", str(tmp_path / "cache.npz"), str(tmp_path / "pfd.npz"), "--from", "lf",
                     "--to", "page_first_direct", "--page-size", "4", "--chunk-bytes", "64"]) == 0
    with np.load(tmp_path / "pfd.npz") as out:
        assert sorted(out.files) == ["k", "mla", "v"]
        for name, array in (("k", k), ("v", v), ("mla", mla)):
            np.testing.assert_array_equal(out[name], kvnumba.convert(array, "lf", "pfd", 4))
    assert "pfd.npz[mla]: page_first_direct (4, 3, 4, 1, 12)" in capsys.readouterr().out
    assert _files(tmp_path) == ["cache.npz", "pfd.npz"]


def test_bad_shape_writes_nothing(tmp_path, capsys):
    np.save(tmp_path / "k.npy", _cache(tokens=10))
    np.savez(tmp_path / "c.npz", k=_cache(tokens=8), v=_cache(tokens=10))
    assert cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "o.npy"), "--from", "lf", "--to", "pfd",
                     "--page-size", "4"]) == 1
    assert cli.main(["convert", str(tmp_path / "c.npz"), str(tmp_path / "o.npz"), "--from", "lf", "--to", "pfd",
                     "--page-size", "4"]) == 1
    err = capsys.readouterr().err
    assert "page_first_direct needs T divisible by page_size=4: got T=10 (dimension 1 of shape (3, 10, 2, 8))" in err
    assert _files(tmp_path) == ["c.npz", "k.npy"]


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_failure_midway_leaves_no_output_and_keeps_an_old_one(tmp_path, monkeypatch, suffix):
    lf = _cache(layers=2, tokens=16)
    if suffix == ".npy":
        np.save(tmp_path / "in.npy", lf)
    else:
        np.savez(tmp_path / "in.npz", k=lf, v=lf)
    (tmp_path / f"out{suffix}").write_bytes(b"old")
    calls = []

    def fail_on_second_chunk(self, n):
        calls.append(n)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")

    monkeypatch.setattr(convert_files.Progress, "advance", fail_on_second_chunk)
    assert cli.main(["convert", str(tmp_path / f"in{suffix}"), str(tmp_path / f"out{suffix}"), "--from", "lf",
                     "--to", "pf", "--chunk-bytes", "64"]) == 1
    assert len(calls) == 2
    assert (tmp_path / f"out{suffix}").read_bytes() == b"old"
    assert _files(tmp_path) == [f"in{suffix}", f"out{suffix}"]


def test_unknown_layout_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["convert", "a.npy", "b.npy", "--from", "layer_frist", "--to", "pf"])
    assert exit_info.value.code == 2
    assert "unknown layout 'layer_frist': expected one of layer_first, page_first" in capsys.readouterr().err


def test_input_kind_is_checked(tmp_path, capsys):
    (tmp_path / "k.bin").write_bytes(b"")
    assert cli.main(["convert", str(tmp_path / "k.bin"), str(tmp_path / "o.bin"), "--from", "lf", "--to", "pf"]) == 1
    assert "input must be a .npy file or a .npz archive" in capsys.readouterr().err


def test_fortran_ordered_input(tmp_path):
    lf = np.asfortranarray(_cache())
    np.save(tmp_path / "k.npy", lf)
    convert_files.convert_file(tmp_path / "k.npy", tmp_path / "o.npy", "lf", "ph", 4, progress=None)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), kvnumba.convert(np.ascontiguousarray(lf), "lf", "ph", 4))


# --- kvnumba info -----------------------------------------------------------------------------------

def _info(capsys):
    assert cli.main(["info"]) == 0
    return dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())


def test_info_reports_versions_and_target(capsys):
    info = {k: v.strip() for k, v in _info(capsys).items()}
    assert info["kvnumba"] == kvnumba.__version__
    for key in ("numba", "numba-cuda", "cuda-bindings", "CUDA runtime", "CUDA driver", "GPU", "cudaMemcpyBatchAsync"):
        assert info[key]
    from kvnumba.driver.target import SIMULATOR

    if SIMULATOR:
        assert info["GPU"].startswith("simulator")


def test_info_without_direct_module(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvnumba.api.direct", None)  # makes the import fail
    assert _info(capsys)["cudaMemcpyBatchAsync"].strip() == "unknown (kvnumba.api.direct not present)"


@pytest.mark.parametrize("answer,shown", [(True, "yes"), (False, "no"), ("CUDA runtime 12.4 < 12.8", "no: CUDA runtime 12.4 < 12.8")])
def test_info_asks_direct_module(capsys, monkeypatch, answer, shown):
    fake = types.ModuleType("kvnumba.api.direct")
    fake.batch_copy_available = lambda: answer
    monkeypatch.setitem(sys.modules, "kvnumba.api.direct", fake)
    assert _info(capsys)["cudaMemcpyBatchAsync"].strip() == shown


def test_info_survives_a_failing_probe(capsys, monkeypatch):
    fake = types.ModuleType("kvnumba.api.direct")
    fake.batch_copy_available = lambda: 1 / 0
    monkeypatch.setitem(sys.modules, "kvnumba.api.direct", fake)
    assert "ZeroDivisionError" in _info(capsys)["cudaMemcpyBatchAsync"]


def test_console_entry_point_runs_convert(tmp_path):
    """``python -m kvnumba convert`` in a fresh process (no simulator needed: files convert with NumPy)."""
    import subprocess

    np.save(tmp_path / "k.npy", _cache())
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(kvnumba.__file__)), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "kvnumba", "convert", str(tmp_path / "k.npy"),
                           str(tmp_path / "o.npy"), "--from", "lf", "--to", "pf"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), _cache().swapaxes(0, 1))
