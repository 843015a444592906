"""``kvnumba convert`` on real files: pure logic, no CUDA needed (``kvnumba info``: tests/cli/test_info.py)."""
import errno
import math
import os
import re
import sys

import numpy as np
import pytest

import kvnumba
from kvnumba import config
from kvnumba.convert import files, outputs
from kvnumba.convert.shapes import converted_shape
from kvnumba.tools import cli, progress


def _cache(layers=3, tokens=16, heads=2, head_dim=8, dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, (layers, tokens, heads, head_dim)).astype(dtype)


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def _on_each_chunk(monkeypatch, hook):
    """Call ``hook(nbytes)`` as each chunk is reported to the progress bar (there is one, silent, under
    ``--quiet`` too)."""
    real = progress.progress

    def reporter(*args, **kwargs):
        bar = real(*args, **kwargs)
        advance = bar.advance
        bar.advance = lambda n=1, note=None: (hook(n), advance(n, note))
        return bar

    monkeypatch.setattr(progress, "progress", reporter)


@pytest.mark.parametrize("dst", ["page_first", "page_first_direct", "page_head"])
def test_npy_round_trip(tmp_path, capsys, dst):
    lf = _cache()
    np.save(tmp_path / "k.npy", lf)
    pages = ["--page-size", "4"] if dst != "page_first" else []  # --page-size only where there are pages
    assert cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "out.npy"), "--from", "layer_first",
                     "--to", dst, *pages]) == 0
    got = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(got, kvnumba.convert(lf, "layer_first", dst, 4))
    assert cli.main(["convert", str(tmp_path / "out.npy"), str(tmp_path / "back.npy"), "--from", dst, "--to", "lf",
                     *pages, "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), lf)
    out, err = capsys.readouterr()
    assert f"out.npy: {dst} {got.shape}" in out
    # not a terminal: no bar, one summary line for the first run (the second was --quiet)
    assert re.fullmatch(r"k\.npy: 1\.5 KB in \d+\.\d s", err.strip()), err
    assert _files(tmp_path) == ["back.npy", "k.npy", "out.npy"]  # no temporary files left


def test_a_user_layout_on_the_command_line(tmp_path, capsys):
    """A layout of one's own (tests/helpers/view_cases.py's HeadMajorPages), named module:Class."""
    lf = _cache()
    np.save(tmp_path / "k.npy", lf)
    assert cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "hm.npy"), "--from", "lf", "--to",
                     "tests.helpers.view_cases:HeadMajorPages", "--page-size", "4", "--quiet",
                     "--chunk-bytes", "256"]) == 0
    got = np.load(tmp_path / "hm.npy")
    assert got.shape == (3, 4, 2, 4, 8)
    np.testing.assert_array_equal(np.swapaxes(got, 2, 3).reshape(lf.shape), lf)
    assert "hm.npy: tests.helpers.view_cases:HeadMajorPages (3, 4, 2, 4, 8)" in capsys.readouterr().out
    assert cli.main(["convert", str(tmp_path / "hm.npy"), str(tmp_path / "back.npy"), "--from",
                     "tests.helpers.view_cases:HeadMajorPages", "--to", "page_first", "--page-size", "4",
                     "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), np.swapaxes(lf, 0, 1))
    with pytest.raises(SystemExit) as exited:  # argparse: a usage error
        cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "x.npy"), "--from", "lf", "--to",
                  "tests.helpers.view_cases:Missing"])
    assert exited.value.code == 2
    assert "argument --to: cannot import layout 'tests.helpers.view_cases:Missing'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["layer_first", "page_first", "page_first_direct", "page_head",
                                  "lf", "pf", "pfd", "ph", "Page-First", "kvnumba.layouts:PageHead"])
def test_every_view_name_on_the_command_line(tmp_path, capsys, name):
    """--to takes each view's string name (and short name, and module:Class): the bytes are kv.convert's with the
    view class, and the summary line names the layout by the view's name."""
    from kvnumba.layouts import view_class

    cls = view_class(name)
    lf = _cache()
    np.save(tmp_path / "k.npy", lf)
    pages = ["--page-size", "4"] if cls.paged else []
    assert cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "out.npy"), "--from", "lf", "--to", name,
                     "--quiet", *pages]) == 0
    want = kvnumba.convert(lf, kvnumba.LayerFirst, cls, 4)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)
    assert f"out.npy: {cls.name} {want.shape}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["vllm_flash_attn", "vllm_flash_infer", "layer_table", "kvnumba:VllmFlashAttn"])
def test_per_layer_views_are_a_usage_error(tmp_path, capsys, name):
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", "a.npy", "b.npy", "--from", name, "--to", "pf"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --from: " in err and "keeps a cache in per-layer arrays" in err, err


@pytest.mark.parametrize("via", ["option", "env"])
def test_tiny_chunks(tmp_path, capsys, monkeypatch, via):
    lf = _cache(layers=4, tokens=32)
    np.save(tmp_path / "k.npy", lf)
    seen = []
    _on_each_chunk(monkeypatch, seen.append)
    args = ["convert", str(tmp_path / "k.npy"), str(tmp_path / "ph.npy"), "--from", "lf", "--to", "ph",
            "--page-size", "8"]
    if via == "option":
        args += ["--chunk-bytes", "300"]
    else:
        monkeypatch.setenv("KVNUMBA_CHUNK_BYTES", "300")
    assert cli.main(args) == 0
    # one page of one layer is 8 tokens x 2 heads x 8 x 2 B = 256 B: each chunk is one such block
    assert seen == [256] * (4 * 4)
    np.testing.assert_array_equal(np.load(tmp_path / "ph.npy"), kvnumba.convert(lf, "lf", "ph", 8))


@pytest.mark.parametrize("value,want", [(None, 64 << 20), ("", 64 << 20), ("4096", 4096), (" 1 ", 1)])
def test_chunk_bytes_from_the_environment(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("KVNUMBA_CHUNK_BYTES", raising=False)
    else:
        monkeypatch.setenv("KVNUMBA_CHUNK_BYTES", value)
    assert config.chunk_bytes() == want


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", "64M"])
def test_bad_chunk_bytes_in_the_environment_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("KVNUMBA_CHUNK_BYTES", value)
    with pytest.raises(ValueError, match=rf"^KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '{re.escape(value)}'$"):
        config.chunk_bytes()


def test_chunks_cover_pages_then_layers():
    # (L=2, pages=3, P=2, item=4 B): a column (one page, every layer) is 16 B
    got = list(files.chunks((2, 3, 2, 4), 1, 32))
    assert got == [(slice(0, 2), slice(0, 2)), (slice(0, 2), slice(2, 3))]
    got = list(files.chunks((2, 3, 2, 4), 1, 8))
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
    assert "page_first_direct needs T divisible by page_size=4: got T=10 (shape (3, 10, 2, 8) in layer_first)" in err
    assert _files(tmp_path) == ["c.npz", "k.npy"]


def _save(path, **arrays):
    """``arrays`` as the file ``path`` of its suffix's kind (.npy: the one array)."""
    if path.suffix == ".npy":
        [array] = arrays.values()
        np.save(path, array)
    elif path.suffix == ".npz":
        np.savez(path, **arrays)
    else:
        import safetensors.numpy

        safetensors.numpy.save_file(arrays, str(path), metadata={"kind": "test"})


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_failure_midway_leaves_no_output_and_keeps_an_old_one(tmp_path, monkeypatch, suffix):
    lf = _cache(layers=2, tokens=16)
    _save(tmp_path / f"in{suffix}", **({"k": lf} if suffix == ".npy" else {"k": lf, "v": lf}))
    (tmp_path / f"out{suffix}").write_bytes(b"old")
    calls = []

    def fail_on_second_chunk(n):
        calls.append(n)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")

    _on_each_chunk(monkeypatch, fail_on_second_chunk)
    assert cli.main(["convert", str(tmp_path / f"in{suffix}"), str(tmp_path / f"out{suffix}"), "--from", "lf",
                     "--to", "pf", "--chunk-bytes", "64", "--force"]) == 1
    assert len(calls) == 2
    assert (tmp_path / f"out{suffix}").read_bytes() == b"old"
    assert _files(tmp_path) == [f"in{suffix}", f"out{suffix}"]


def test_unknown_layout_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["convert", "a.npy", "b.npy", "--from", "layer_frist", "--to", "pf"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("kvnumba convert: error: argument --from: unknown layout 'layer_frist': expected one of "
                           "layer_first (lf), page_first (pf), ")
    assert len(line) < 250, line
    # It lists exactly the layouts convert takes: each one converts, and none it refuses is named.
    from kvnumba.layouts import BUILT_IN

    listed = set(re.findall(r"\b([a-z_]+) \(([a-z]+)\)", line))
    assert listed == {(c.name, c.short_name) for c in BUILT_IN if c.whole_tensor} | {("page_unified", "pu")}
    for name, short in listed - {("page_unified", "pu")}:
        assert converted_shape((2, 8, 4, 16), "lf", name, 4) and converted_shape((2, 8, 4, 16), "lf", short, 4)
    k = np.zeros((2, 8, 4, 16), np.uint8)  # the pool holds K and V: it converts from and to a pair
    assert kvnumba.convert((k, k), "lf", "pu", 4).shape == kvnumba.convert((k, k), "lf", "page_unified", 4).shape
    for refused in (c.name for c in BUILT_IN if not c.whole_tensor and c.name != "page_unified"):
        assert refused not in line
        with pytest.raises(ValueError, match=f"^dst: {refused} keeps a cache in per-layer arrays"):
            converted_shape((2, 8, 4, 16), "lf", refused, 4)


@pytest.mark.parametrize("shape", [(16, 8), (16,)], ids=["2-D", "1-D"])
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_a_shape_that_is_not_the_layouts_names_the_file(tmp_path, capsys, suffix, shape):
    path = tmp_path / f"flat{suffix}"
    _save(path, k=_cache()[0, 0, 0, :1].repeat(math.prod(shape)).reshape(shape))
    where = re.escape(str(path)) + ("" if suffix == ".npy" else r"\[k\]")
    message = f"^{where}: LayerFirst: a buffer is \\[L, T, \\*item\\], got {re.escape(str(shape))}"
    with pytest.raises(ValueError, match=message):
        files.convert_file(path, tmp_path / f"out{suffix}", "lf", "pf")
    assert cli.main(["convert", str(path), str(tmp_path / f"out{suffix}"), "--from", "lf", "--to", "pf", "-q"]) == 1
    assert f"{path}" in capsys.readouterr().err
    assert _files(tmp_path) == [f"flat{suffix}"]


def test_input_kind_is_checked(tmp_path, capsys):
    (tmp_path / "k.bin").write_bytes(b"")
    assert cli.main(["convert", str(tmp_path / "k.bin"), str(tmp_path / "o.bin"), "--from", "lf", "--to", "pf"]) == 1
    assert "input must be a .npy file, a .npz archive or a .safetensors file" in capsys.readouterr().err


def test_fortran_ordered_input(tmp_path):
    lf = np.asfortranarray(_cache())
    np.save(tmp_path / "k.npy", lf)
    files.convert_file(tmp_path / "k.npy", tmp_path / "o.npy", "lf", "ph", 4, progress=None)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), kvnumba.convert(np.ascontiguousarray(lf), "lf", "ph", 4))


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


# --- Bad inputs: one line on stderr, a non-zero exit, nothing written -----------------------------------

def _npz_bytes(**arrays):
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _npy_bytes(array):
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _header_only(shape, dtype="<u2", data=b"\0" * 64):
    """A .npy whose header claims ``shape`` but holds only ``data``."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def _npz_with_text_member():
    import io
    import zipfile

    buffer = io.BytesIO(_npz_bytes(k=_cache()))
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr("notes.txt", "not an array")
    return buffer.getvalue()


def _npz_with_member(name, data):
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


TERABYTES = (1 << 20, 1 << 20, 8, 128)

# id, input name, input bytes, extra args, environment, message (regex on the last line of stderr; <IN> is the
# input's path), exit code
BAD_INPUTS = [
    ("empty", "in.npy", b"", [], {}, r"<IN>: the file is empty \(0 bytes\), not a \.npy file", 1),
    ("npz-named-npy", "in.npy", _npz_bytes(k=_cache()), [], {},
     r"<IN>: named \.npy but its content is a \.npz \(zip\) archive; rename it to \.npz", 1),
    ("npy-named-npz", "in.npz", _npy_bytes(_cache()), [], {},
     r"<IN>: named \.npz but its content is a \.npy file; rename it to \.npy", 1),
    ("not-npy", "in.npy", b"hello, world", [], {},
     r"<IN>: not a \.npy file: it starts with b'hello,', expected b'\\x93NUMPY'", 1),
    ("damaged-zip", "in.npz", b"PK\x03\x04 and then nothing", [], {},
     r"<IN>: not a readable \.npz \(zip\) archive", 1),
    ("npz-text-member", "in.npz", _npz_with_text_member(), [], {},
     r"<IN>: member 'notes\.txt' is not a \.npy array; a \.npz archive to convert must hold arrays only", 1),
    ("npz-member-not-npy", "in.npz", _npz_with_member("k.npy", b"just text"), [], {},
     r"<IN>\[k\]: not a readable \.npy array: .*magic", 1),
    ("header-claims-terabytes", "in.npy", _header_only(TERABYTES), [], {},
     r"<IN>: truncated or corrupt: its header claims shape \(1048576, 1048576, 8, 128\) of uint16 "
     r"\(2,251,799,813,685,248 B = 2251\.8 TB\), but the file holds 64 B after the header", 1),
    ("npz-member-claims-terabytes", "in.npz", _npz_with_member("k.npy", _header_only(TERABYTES)), [], {},
     r"<IN>\[k\]: truncated or corrupt: its header claims shape \(1048576, 1048576, 8, 128\)", 1),
    ("truncated", "in.npy", _npy_bytes(_cache())[:-10], [], {},
     r"<IN>: truncated or corrupt: its header claims shape \(3, 16, 2, 8\) of uint16 \(1,536 B = 1\.5 KB\), "
     r"but the file holds 1,526 B = 1\.5 KB after the header", 1),
    ("object-array", "in.npy", _npy_bytes(np.empty((2, 4, 1), object)), [], {},
     r"<IN>: object arrays cannot be converted \(dtype object\)", 1),
    # a setting kvnumba cannot use: refused before anything is read (exit 2, like a bad option)
    ("chunk-env-text", "in.npy", _npy_bytes(_cache()), [], {"KVNUMBA_CHUNK_BYTES": "abc"},
     r"KVNUMBA_CHUNK_BYTES must be an integer >= 1, got 'abc': fix or unset it", 2),
    ("chunk-env-zero", "in.npy", _npy_bytes(_cache()), [], {"KVNUMBA_CHUNK_BYTES": "0"},
     r"KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '0': fix or unset it", 2),
    ("chunk-env-negative", "in.npy", _npy_bytes(_cache()), [], {"KVNUMBA_CHUNK_BYTES": "-5"},
     r"KVNUMBA_CHUNK_BYTES must be an integer >= 1, got '-5': fix or unset it", 2),
    ("chunk-option-zero", "in.npy", _npy_bytes(_cache()), ["--chunk-bytes", "0"], {},
     r"argument --chunk-bytes: expected a positive integer, got 0", 2),
    ("page-size-zero", "in.npy", _npy_bytes(_cache()), ["--page-size", "0"], {},
     r"argument --page-size: expected a positive integer, got 0", 2),
    ("page-size-text", "in.npy", _npy_bytes(_cache()), ["--page-size", "four"], {},
     r"argument --page-size: expected a positive integer, got 'four'", 2),
]


def _run(argv, capsys):
    """``kvnumba`` in this process: exit code and the stderr lines (argparse exits, the rest returns)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("name,data,extra,env,message,code", [row[1:] for row in BAD_INPUTS],
                         ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, name, data, extra, env, message,
                                                 code):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out_name = f"out{os.path.splitext(name)[1]}"
    (tmp_path / name).write_bytes(data)
    (tmp_path / out_name).write_bytes(b"old")
    got, err = _run(["convert", str(tmp_path / name), str(tmp_path / out_name), "--from", "lf", "--to", "pf",
                     "--quiet", "--force", *extra], capsys)
    assert got == code
    assert len(err) == 1, err  # every failure is one line, argparse's included
    message = message.replace("<IN>", re.escape(str(tmp_path / name)))
    assert re.fullmatch(f"kvnumba convert: error: {message}.*", err[-1]), err[-1]
    assert (tmp_path / name).read_bytes() == data
    assert (tmp_path / out_name).read_bytes() == b"old"
    assert _files(tmp_path) == sorted([name, out_name])


@pytest.mark.parametrize("problem,message", [
    ("missing input", r"kvnumba convert: error: .*in\.npy: No such file or directory"),
    ("missing folder", r"kvnumba convert: error: output '.*out\.npy': folder '.*nowhere' does not exist"),
    ("output is a folder", r"kvnumba convert: error: output '.*out\.npy' is a folder, expected a file name"),
])
def test_bad_paths_are_one_line(tmp_path, capsys, problem, message):
    out = tmp_path / ("nowhere/out.npy" if problem == "missing folder" else "out.npy")
    if problem != "missing input":
        np.save(tmp_path / "in.npy", _cache())
    if problem == "output is a folder":
        out.mkdir()
    before = _files(tmp_path)
    code, err = _run(["convert", str(tmp_path / "in.npy"), str(out), "--from", "lf", "--to", "pf", "-q"], capsys)
    assert code == 1 and len(err) == 1 and re.fullmatch(message, err[0]), err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("shape,dst", [((0, 8, 2, 8), "pf"), ((0, 8, 2, 8), "ph"), ((3, 0, 2, 8), "pfd"),
                                       ((0, 0, 2, 8), "ph")], ids=["no-layers-pf", "no-layers-ph", "no-tokens",
                                                                   "nothing"])
@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_empty_caches_convert_like_kv_convert(tmp_path, capsys, shape, dst, suffix):
    lf = np.zeros(shape, np.uint16)
    if suffix == ".npy":
        np.save(tmp_path / "in.npy", lf)
    else:
        np.savez(tmp_path / "in.npz", k=lf)
    pages = ["--page-size", "4"] if dst != "pf" else []
    code, err = _run(["convert", str(tmp_path / f"in{suffix}"), str(tmp_path / f"out{suffix}"), "--from", "lf",
                      "--to", dst, *pages, "--chunk-bytes", "64"], capsys)
    assert code == 0, err
    got = np.load(tmp_path / "out.npy") if suffix == ".npy" else np.load(tmp_path / "out.npz")["k"]
    want = kvnumba.convert(lf, "lf", dst, 4)
    assert got.shape == want.shape and got.dtype == want.dtype


# --- A full disk: an OSError before any write into the memory map, never a SIGBUS -----------------------

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_disk_full_is_one_line_and_keeps_the_old_output(tmp_path, capsys, monkeypatch, suffix):
    if suffix == ".npy":
        np.save(tmp_path / "in.npy", _cache())
        monkeypatch.setattr(os, "posix_fallocate", _enospc, raising=False)
    else:
        np.savez(tmp_path / "in.npz", k=_cache())
        monkeypatch.setattr(np.lib.format, "write_array", _enospc)
    (tmp_path / f"out{suffix}").write_bytes(b"old")
    code, err = _run(["convert", str(tmp_path / f"in{suffix}"), str(tmp_path / f"out{suffix}"), "--from", "lf",
                      "--to", "pf", "-q", "--force"], capsys)
    assert code == 1 and len(err) == 1, err
    needs = r": it needs 1\.5 KB" if suffix == ".npy" else ""
    assert re.fullmatch(rf"kvnumba convert: error: not enough disk space to write .*out\{suffix}{needs} "
                        rf"\(in .*\)", err[0]), err[0]
    assert (tmp_path / f"out{suffix}").read_bytes() == b"old"
    assert _files(tmp_path) == [f"in{suffix}", f"out{suffix}"]


def test_unwritable_output_names_the_output(tmp_path, capsys, monkeypatch):
    """A folder kvnumba may not write (simulated: the tests may run as root): the error names the output and
    the folder, never the temporary file."""
    np.save(tmp_path / "in.npy", _cache())

    def refused(path, *args):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(outputs, "_create_npy", refused)
    code, err = _run(["convert", str(tmp_path / "in.npy"), str(tmp_path / "out.npy"), "--from", "lf", "--to", "pf",
                      "-q"], capsys)
    assert code == 1 and len(err) == 1, err
    assert re.fullmatch(rf"kvnumba convert: error: cannot write .*out\.npy: no permission to create a file in "
                        rf"{re.escape(str(tmp_path))}", err[0]), err[0]
    assert ".tmp" not in err[0]


@pytest.mark.parametrize("problem,message", [
    (errno.EROFS, r"cannot write .*out\.npz: .* is on a read-only file system"),
    (errno.EIO, r"cannot write .*out\.npz: Input/output error"),
])
def test_a_failing_clean_up_keeps_the_first_error(tmp_path, capsys, monkeypatch, problem, message):
    """Writing fails, and so does removing the temporary file: the error reported is the first one, about
    the output."""
    np.savez(tmp_path / "in.npz", k=_cache())

    def fail(path, *args, **kwargs):
        raise OSError(problem, os.strerror(problem), os.fspath(path))

    real_zipfile = outputs.zipfile.ZipFile
    monkeypatch.setattr(outputs.zipfile, "ZipFile", lambda path, *a, **k: fail(path) if str(path).endswith(
        ".tmp") else real_zipfile(path, *a, **k))
    monkeypatch.setattr(os, "remove", lambda path: fail(path))
    code, err = _run(["convert", str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), "--from", "lf", "--to", "pf",
                      "-q"], capsys)
    assert code == 1 and len(err) == 1, err
    assert re.fullmatch(f"kvnumba convert: error: {message}", err[0]), err[0]


@pytest.mark.parametrize("fallocate", ["works", "unsupported", "missing"])
def test_output_space_is_reserved_before_it_is_mapped_for_writing(tmp_path, monkeypatch, fallocate):
    """The map is opened for writing only once every block of the file is allocated (by posix_fallocate, or
    by writing zeros where the file system or platform has none)."""
    if fallocate == "works" and not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this platform")
    if fallocate == "unsupported":
        monkeypatch.setattr(os, "posix_fallocate",
                            lambda *a: (_ for _ in ()).throw(OSError(errno.EOPNOTSUPP, "not supported")), raising=False)
    if fallocate == "missing":
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
    lf = _cache(layers=4, tokens=256)
    np.save(tmp_path / "in.npy", lf)
    allocated = []
    real_open = np.lib.format.open_memmap

    def open_memmap(path, mode="r+", *args, **kwargs):
        if mode == "r+":
            allocated.append((os.stat(path).st_blocks * 512, os.path.getsize(path)))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "open_memmap", open_memmap)
    files.convert_file(tmp_path / "in.npy", tmp_path / "out.npy", "lf", "pf", progress=None, chunk_bytes=4096)
    [(blocks, size)] = allocated
    assert blocks >= size - 4096  # all but the header's block (allocated as it was written)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), lf.swapaxes(0, 1))


# --- Signals: the temporary output is removed, the old output kept, the handlers restored --------------

# Runs kvnumba convert with a progress hook that says "mid-write" after the first chunk and then waits
# (a long sleep, which a signal cuts short): the parent signals it at a known point of the conversion.
# A .safetensors file is written in one call, at the end: the hook waits once it is written, before it
# takes the output's name.
_CHILD = """
import signal, sys, time
from kvnumba.tools import cli, progress
# The dispositions of a shell, whatever the test runner's: under nohup (or trap '' HUP) SIGHUP is ignored, and
# an ignored signal is inherited; kvnumba leaves an ignored signal alone, so the child would sleep through it.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

class AdvanceThenWait(progress.Silent):
    def advance(self, n=1, note=None):
        print("mid-write", flush=True)
        time.sleep(60)

def write_then_wait(path, *args, **kwargs):  # .safetensors: the library writes the whole file at the end
    real_write(path, *args, **kwargs)
    print("mid-write", flush=True)
    time.sleep(60)

if sys.argv[2].endswith(".safetensors"):
    from kvnumba.convert import safetensors as safetensors_format
    real_write, safetensors_format.write = safetensors_format.write, write_then_wait
else:
    progress.progress = lambda *args, **kwargs: AdvanceThenWait()
sys.exit(cli.main(sys.argv[1:]))
"""


def _reap(child):
    """The child ended and waited for, its pipes closed, whatever happened: a child left running (or never
    waited for) warns when it is collected, failing whichever later test is running then."""
    if child.poll() is None:
        child.kill()
    child.communicate(timeout=60)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("old", [True, False], ids=["an old output", "no output yet"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_signal_mid_conversion_removes_the_temporary_file(tmp_path, signame, suffix, old):
    import signal
    import subprocess

    lf = _cache(layers=4, tokens=64)
    _save(tmp_path / f"in{suffix}", k=lf)
    if old:
        (tmp_path / f"out{suffix}").write_bytes(b"old")
    env = dict(os.environ, KVNUMBA_CHUNK_BYTES="256")  # (the simulator or not: files convert with NumPy)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(kvnumba.__file__)), env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, "-c", _CHILD, "convert", str(tmp_path / f"in{suffix}"),
                              str(tmp_path / f"out{suffix}"), "--from", "lf", "--to", "pf", "-q", "--force"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "mid-write\n"
        assert len(_files(tmp_path)) == 2 + old  # the temporary file is there, mid-write
        child.send_signal(getattr(signal, signame))
        _, err = child.communicate(timeout=60)
    finally:
        _reap(child)
    signum = getattr(signal, signame)
    assert child.returncode == 128 + signum, err
    assert err.splitlines() == [f"kvnumba convert: error: interrupted by {signame}; the partial output was removed"]
    if old:
        assert (tmp_path / f"out{suffix}").read_bytes() == b"old"
    assert _files(tmp_path) == [f"in{suffix}"] + [f"out{suffix}"] * old  # no partial file at the destination


def test_interrupt_on_signals_raises_and_restores():
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(files.Interrupted, match="interrupted by SIGINT") as stop:
            with files.interrupt_on_signals():
                assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
                signal.raise_signal(signal.SIGINT)
        assert stop.value.signum == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_interrupt_on_signals_leaves_ignored_and_custom_handlers_alone():
    import signal

    def custom(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, custom)
    try:
        with files.interrupt_on_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is custom
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is custom
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_interrupt_on_signals_off_the_main_thread_changes_nothing():
    import signal
    import threading

    seen = []

    def convert_in_a_thread():
        with files.interrupt_on_signals():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=convert_in_a_thread)
    thread.start()
    thread.join()
    assert seen == [before]
