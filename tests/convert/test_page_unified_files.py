"""``kvnumba convert`` (and ``kv.convert`` of a path) from and to SGLang's page-unified pool: the arrays ``k`` and
``v`` of a ``.npz`` or ``.safetensors`` file pair with the pool ``kv``; MLA arrays one each way. Pure logic, no
CUDA needed. Each error leaves no output and no temporary file."""
import re

import numpy as np
import pytest
import safetensors.numpy  # the test extra installs it

import kvnumba as kv
from kvnumba.convert import unified
from kvnumba.tools import cli
from tests.convert.test_page_unified import _kv, _pool_by_loop

L, T, H, D, P = 2, 8, 4, 4, 4


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def _run(*argv):
    return cli.main(["convert", *map(str, argv), "--quiet"])


@pytest.mark.parametrize("groups", [1, 2])
def test_npz_pair_to_pool_and_back_through_safetensors(tmp_path, capsys, groups):
    k, v = _kv()
    np.savez(tmp_path / "kv.npz", k=k, v=v)
    assert _run(tmp_path / "kv.npz", tmp_path / "pool.npz", "--from", "lf", "--to", "page_unified", "--page-size", P,
                "--head-groups", groups) == 0
    with np.load(tmp_path / "pool.npz") as z:
        assert z.files == ["kv"]
        np.testing.assert_array_equal(z["kv"], _pool_by_loop(k, v, P, groups))
    assert f"pool.npz[kv]: page_unified {(T // P, groups, L, 2, P, H // groups, D)}" in capsys.readouterr().out
    assert _run(tmp_path / "pool.npz", tmp_path / "ph.safetensors", "--from", "pu", "--to", "ph", "--page-size", P) == 0
    got = safetensors.numpy.load_file(tmp_path / "ph.safetensors")
    assert sorted(got) == ["k", "v"]
    np.testing.assert_array_equal(got["k"], kv.convert(k, "lf", "ph", P))
    np.testing.assert_array_equal(got["v"], kv.convert(v, "lf", "ph", P))


def test_safetensors_pair_and_mla_keep_metadata(tmp_path):
    k, v = (x.view(np.float16) for x in _kv(seed=2))  # bit patterns: conversion moves them unread
    c = np.arange(L * T * 6, dtype=np.float16).reshape(L, T, 6)  # an MLA tensor beside K and V
    pf = {"k": kv.convert(k, "lf", "pf"), "v": kv.convert(v, "lf", "pf"), "c": kv.convert(c, "lf", "pf")}
    safetensors.numpy.save_file(pf, str(tmp_path / "in.safetensors"), metadata={"model": "tiny"})
    shapes = kv.convert(tmp_path / "in.safetensors", "pf", "pu", P, out=tmp_path / "pool.safetensors",
                        head_groups=2)
    assert shapes == {"kv": (T // P, 2, L, 2, P, H // 2, D), "c": (T // P, L, P, 6)}
    got = safetensors.numpy.load_file(tmp_path / "pool.safetensors")
    np.testing.assert_array_equal(got["kv"], _pool_by_loop(k, v, P, 2))
    np.testing.assert_array_equal(got["c"], kv.convert(c, "lf", "pfd", P))  # an MLA pool: pfd's bytes
    with safetensors.safe_open(tmp_path / "pool.safetensors", "np") as f:
        assert f.metadata() == {"model": "tiny"}
    kv.convert(tmp_path / "pool.safetensors", "pu", "lf", P, out=tmp_path / "back.safetensors")
    back = safetensors.numpy.load_file(tmp_path / "back.safetensors")
    np.testing.assert_array_equal(back["k"], k)
    np.testing.assert_array_equal(back["v"], v)
    np.testing.assert_array_equal(back["c"], c)


def test_a_npy_pool_in_and_out(tmp_path):
    """A .npy file holds one array: a pool written from a pair, or read whatever the file's name."""
    k, v = _kv(seed=4)
    np.savez(tmp_path / "kv.npz", k=k, v=v)
    assert kv.convert(tmp_path / "kv.npz", "lf", "pu", P, out=tmp_path / "pool.npy") == {"": (T // P, 1, L, 2, P, H, D)}
    np.testing.assert_array_equal(np.load(tmp_path / "pool.npy"), _pool_by_loop(k, v, P, 1))
    assert _run(tmp_path / "pool.npy", tmp_path / "pfd.npz", "--from", "pu", "--to", "pfd", "--page-size", P) == 0
    with np.load(tmp_path / "pfd.npz") as z:
        np.testing.assert_array_equal(z["k"], kv.convert(k, "lf", "pfd", P))
        np.testing.assert_array_equal(z["v"], kv.convert(v, "lf", "pfd", P))


def test_mla_file_each_way(tmp_path):
    c = np.random.default_rng(1).integers(0, 2**16, (L, T, 1, 8)).astype(np.uint16)
    np.save(tmp_path / "c.npy", c)
    assert _run(tmp_path / "c.npy", tmp_path / "pool.npy", "--from", "lf", "--to", "pu", "--page-size", P) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "pool.npy"), kv.convert(c, "lf", "pfd", P).reshape(T // P, L, P, 8))
    assert _run(tmp_path / "pool.npy", tmp_path / "back.npy", "--from", "pu", "--to", "lf", "--page-size", P) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), c.reshape(L, T, 8))


@pytest.mark.parametrize("to_pool", [True, False])
def test_tiny_chunks(tmp_path, to_pool):
    """Chunks of a few bytes: pages, then layers, split; the bytes are the arrays' conversion's."""
    k, v = _kv(seed=6)
    pool = kv.convert((k, v), "lf", "pu", P, head_groups=2)
    if to_pool:
        np.savez(tmp_path / "in.npz", k=k, v=v)
        args = ["--from", "lf", "--to", "pu", "--head-groups", "2"]
    else:
        np.savez(tmp_path / "in.npz", kv=pool)
        args = ["--from", "pu", "--to", "lf"]
    assert _run(tmp_path / "in.npz", tmp_path / "out.npz", *args, "--page-size", P, "--chunk-bytes", 24) == 0
    with np.load(tmp_path / "out.npz") as z:
        if to_pool:
            np.testing.assert_array_equal(z["kv"], pool)
        else:
            np.testing.assert_array_equal(z["k"], k)
            np.testing.assert_array_equal(z["v"], v)


# --- errors: one line, nothing written ---------------------------------------------------------------------

def _arrays(which):
    k, v = _kv()
    return {"pair": {"k": k, "v": v}, "k_only": {"k": k}, "uneven": {"k": k, "v": v[:, :4]},
            "named_pool": {"pool": _pool_by_loop(k, v, P, 1)}, "pool": {"kv": _pool_by_loop(k, v, P, 1)},
            "clash": {"k": k, "v": v, "kv": k[:, :, 0]}}[which]


@pytest.mark.parametrize("arrays,out,args,match", [
    ("pair", "o.npz", ["--to", "pu", "--head-groups", "3"],
     r"in\.npz\[k, v\]: head_groups=3 does not divide the H=4 heads"),
    ("k_only", "o.npz", ["--to", "pu"], r"in\.npz\[k\]: one tensor makes an MLA pool, of items \(D,\) or \(1, D\)"),
    ("uneven", "o.npz", ["--to", "pu"], r"K and V must have one shape, got \(2, 8, 4, 4\) and \(2, 4, 4, 4\)"),
    ("named_pool", "o.npz", ["--from", "pu", "--to", "lf"], r"in\.npz\[pool\]: .* named 'k' and 'v': store it as 'kv'"),
    ("pool", "o.npy", ["--from", "pu", "--to", "lf"], r"is a \.npy file, which holds one array, but .*in\.npz converts into 2 \(k, v\)"),
    ("clash", "o.npz", ["--to", "pu"], r"would write 'kv' twice"),
])
def test_refused_files_write_nothing(tmp_path, capsys, arrays, out, args, match):
    np.savez(tmp_path / "in.npz", **_arrays(arrays))
    options = args if "--from" in args else ["--from", "lf", *args]
    assert _run(tmp_path / "in.npz", tmp_path / out, *options, "--page-size", P) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("kvnumba convert: error: ")
    assert re.search(match, line), line
    assert _files(tmp_path) == ["in.npz"]


@pytest.mark.parametrize("args,match", [
    (["--to", "pf", "--head-groups", "2"], r"--head-groups applies to --to page_unified"),
    (["--to", "pu", "--page-size", "4", "--dtype", "fp8_e4m3"], r"--dtype does not combine with page_unified"),
    (["--to", "pu", "--page-size", "4", "--head-groups", "0"], r"argument --head-groups: expected a positive integer"),
])
def test_usage_errors(tmp_path, capsys, args, match):
    np.savez(tmp_path / "in.npz", **_arrays("pair"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", str(tmp_path / "in.npz"), str(tmp_path / "o.npz"), "--from", "lf", *args])
    assert exited.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert _files(tmp_path) == ["in.npz"]


def test_a_failure_while_writing_removes_the_partial_output(tmp_path, capsys, monkeypatch):
    np.savez(tmp_path / "in.npz", **_arrays("pair"))
    (tmp_path / "o.npz").write_bytes(b"old")
    calls = []

    def failing(block, destination):
        calls.append(block.nbytes)
        if len(calls) == 3:  # after some chunks were written
            raise OSError(28, "No space left on device")
        destination[...] = np.reshape(block, destination.shape)

    monkeypatch.setattr(unified, "put", failing)
    assert _run(tmp_path / "in.npz", tmp_path / "o.npz", "--from", "lf", "--to", "pu", "--page-size", P, "--force",
                "--chunk-bytes", 64) == 1
    assert "not enough disk space to write" in capsys.readouterr().err
    assert len(calls) == 3 and _files(tmp_path) == ["in.npz", "o.npz"]
    assert (tmp_path / "o.npz").read_bytes() == b"old"  # the existing output kept


def test_head_groups_through_the_path_api_is_checked(tmp_path):
    np.savez(tmp_path / "in.npz", **_arrays("pair"))
    with pytest.raises(ValueError, match=r"^head_groups applies to dst='page_unified'"):
        kv.convert(tmp_path / "in.npz", "lf", "pf", out=tmp_path / "o.npz", head_groups=2)
    with pytest.raises(ValueError, match=r"does not combine with page_unified"):
        kv.convert(tmp_path / "in.npz", "lf", "pu", 4, out=tmp_path / "o.safetensors", dtype="fp8_e4m3")
    assert _files(tmp_path) == ["in.npz"]
