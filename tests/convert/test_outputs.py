"""Where ``kvnumba convert`` (and ``kv.convert(path, out=)``) writes: the format its output's name says, never
over the input, never over an existing file unless asked, with the usual file mode. Pure logic: files convert
with NumPy, no CUDA needed."""
import os
import re
import stat

import numpy as np
import pytest

import kvnumba as kv
from tests.helpers.cli_run import run_cli

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors extra is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="the safetensors extra is not installed")

LF = np.arange(3 * 16 * 2 * 8, dtype=np.uint16).reshape(3, 16, 2, 8)  # (L, T, H, D)




def _read(path):
    """``{name: array}`` of any of the three kinds (a .npy file's one array under "")."""
    path = str(path)
    if path.endswith(".npy"):
        return {"": np.load(path)}
    if path.endswith(".npz"):
        with np.load(path) as archive:
            return {name: archive[name] for name in archive.files}
    return safetensors_numpy.load_file(path)


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("out_suffix", [".npy", ".npz", ".safetensors"])
@pytest.mark.parametrize("in_suffix", [".npy", ".npz", ".safetensors"])
def test_the_output_is_written_in_the_format_its_name_says(tmp_path, capsys, in_suffix, out_suffix):
    src = tmp_path / f"k_cache{in_suffix}"
    if in_suffix == ".npy":
        np.save(src, LF)
    elif in_suffix == ".npz":
        np.savez(src, k_cache=LF)
    else:
        safetensors_numpy.save_file({"k_cache": LF}, str(src))
    out = tmp_path / f"out{out_suffix}"
    code, printed, err = run_cli(["convert", str(src), str(out), "--from", "lf", "--to", "ph", "--page-size", "4", "-q"],
                              capsys)
    assert code == 0, err
    want = kv.convert(LF, "lf", "ph", page_size=4)
    got = _read(out)
    # a .npy output holds the one array; the others name it (a .npy input's array after its file: k_cache)
    assert list(got) == ([""] if out_suffix == ".npy" else ["k_cache"])
    np.testing.assert_array_equal(next(iter(got.values())), want)
    assert printed == (f"{out}: page_head {want.shape}\n" if out_suffix == ".npy"
                       else f"{out}[k_cache]: page_head {want.shape}\n")
    head = out.read_bytes()[:8]  # the content is what the name says
    assert {".npy": head.startswith(b"\x93NUMPY"), ".npz": head.startswith(b"PK"),
            ".safetensors": head[:8] != b"\x93NUMPY" and not head.startswith(b"PK")}[out_suffix]


def test_kv_convert_writes_the_format_its_out_name_says(tmp_path):
    np.save(tmp_path / "k.npy", LF)
    shapes = kv.convert(tmp_path / "k.npy", "lf", "pf", out=tmp_path / "k_pf.safetensors")
    assert shapes == {"k": (16, 3, 2, 8)}
    np.testing.assert_array_equal(_read(tmp_path / "k_pf.safetensors")["k"], LF.swapaxes(0, 1))


@pytest.mark.parametrize("name", ["out.bin", "out", "out.npy.gz", "out.NPZ.bak"])
def test_any_other_output_suffix_is_one_line(tmp_path, capsys, name):
    np.save(tmp_path / "k.npy", LF)
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), str(tmp_path / name), "--from", "lf", "--to", "pf"],
                        capsys)
    assert code == 1 and len(err) == 1, err
    assert re.fullmatch(r"kvnumba convert: error: output must be named \.npy, \.npz or \.safetensors \(the format it "
                        rf"is written in\), got '.*{re.escape(name)}'", err[0]), err[0]
    assert _files(tmp_path) == ["k.npy"]


def test_an_existing_output_needs_force(tmp_path, capsys):
    np.save(tmp_path / "k.npy", LF)
    out = tmp_path / "out.npy"
    out.write_bytes(b"old")
    out.chmod(0o444)  # read-only: refused all the same
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), str(out), "--from", "lf", "--to", "pf"], capsys)
    assert code == 1 and err == [f"kvnumba convert: error: output '{out}' exists: pass --force to replace it"]
    assert out.read_bytes() == b"old"
    with pytest.raises(FileExistsError, match=r"exists: pass overwrite=True to replace it"):
        kv.convert(tmp_path / "k.npy", "lf", "pf", out=out)
    assert out.read_bytes() == b"old"
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), str(out), "--from", "lf", "--to", "pf", "--force", "-q"],
                        capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(out), LF.swapaxes(0, 1))
    assert kv.convert(tmp_path / "k.npy", "lf", "ph", 4, out=out, overwrite=True) == {"": (4, 2, 4, 3, 8)}
    with pytest.raises(TypeError, match=r"overwrite= is for an input given as a file path"):
        kv.convert(LF, "lf", "pf", overwrite=True)


@pytest.mark.parametrize("how", ["same path", "another spelling", "symbolic link", "hard link"])
def test_the_input_is_never_the_output(tmp_path, capsys, monkeypatch, how):
    np.save(tmp_path / "k.npy", LF)
    before = (tmp_path / "k.npy").read_bytes()
    monkeypatch.chdir(tmp_path)
    out = {"same path": str(tmp_path / "k.npy"), "another spelling": "./sub/../k.npy", "symbolic link": "link.npy",
           "hard link": "hard.npy"}[how]
    (tmp_path / "sub").mkdir()
    if how == "symbolic link":
        os.symlink(tmp_path / "k.npy", tmp_path / "link.npy")
    if how == "hard link":
        os.link(tmp_path / "k.npy", tmp_path / "hard.npy")
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), out, "--from", "lf", "--to", "pf", "--force"], capsys)
    link = " (through a link)" if how in ("symbolic link", "hard link") else ""
    assert code == 1 and err == [f"kvnumba convert: error: output {out!r} is the input file{link}: write the "
                                 "conversion to another file"], err
    with pytest.raises(ValueError, match="is the input file"):
        kv.convert(tmp_path / "k.npy", "lf", "pf", out=out, overwrite=True)
    assert (tmp_path / "k.npy").read_bytes() == before


def test_a_npy_output_holds_one_array(tmp_path, capsys):
    np.savez(tmp_path / "kv.npz", k=LF, v=LF)
    code, _, err = run_cli(["convert", str(tmp_path / "kv.npz"), str(tmp_path / "kv.npy"), "--from", "lf", "--to", "pf"],
                        capsys)
    assert code == 1 and err == [f"kvnumba convert: error: output '{tmp_path / 'kv.npy'}' is a .npy file, which holds "
                                 f"one array, but {tmp_path / 'kv.npz'} holds 2 (k, v): name the output .npz or "
                                 ".safetensors"], err
    assert _files(tmp_path) == ["kv.npz"]


@pytest.mark.parametrize("out_suffix", [".npy", ".npz"])
def test_bf16_goes_to_safetensors_only(tmp_path, capsys, out_suffix):
    bf16 = LF.view(ml_dtypes.bfloat16)
    from kvnumba.convert import safetensors as safetensors_format

    safetensors_format.write(str(tmp_path / "kv.safetensors"), {"k": bf16}, None)
    code, _, err = run_cli(["convert", str(tmp_path / "kv.safetensors"), str(tmp_path / f"out{out_suffix}"), "--from",
                         "lf", "--to", "pf"], capsys)
    assert code == 1 and len(err) == 1, err
    assert re.fullmatch(r"kvnumba convert: error: .*kv\.safetensors(\[k\])?: bfloat16 cannot be stored in a "
                        rf"\{out_suffix} file \(NumPy has no bfloat16 dtype; it would come back as raw bytes\): name "
                        r"the output \.safetensors", err[0]), err[0]
    assert kv.convert(tmp_path / "kv.safetensors", "lf", "pf", out=tmp_path / "pf.safetensors") == {"k": (16, 3, 2, 8)}
    got = safetensors_format.read_tensor(None, str(tmp_path / "pf.safetensors"),
                                         safetensors_format.read_header(str(tmp_path / "pf.safetensors")),
                                         safetensors_format.read_header(str(tmp_path / "pf.safetensors")).tensors[0])
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), LF.swapaxes(0, 1))


def test_every_output_gets_the_usual_file_mode(tmp_path):
    np.save(tmp_path / "k.npy", LF)
    umask = os.umask(0o022)
    try:
        for suffix in (".npy", ".npz", ".safetensors"):
            kv.convert(tmp_path / "k.npy", "lf", "pf", out=tmp_path / f"out{suffix}")
            assert stat.S_IMODE((tmp_path / f"out{suffix}").stat().st_mode) == 0o644, suffix
    finally:
        os.umask(umask)


@pytest.mark.parametrize("args,message", [
    (["--from", "lf", "--to", "pf", "--page-size", "4"],
     r"--page-size applies to paged layouts only \(page_first_direct, page_head, or a paged layout of your own\); "
     r"layer_first -> page_first has no pages: leave it out"),
    (["--from", "lf", "--to", "page_head"], r"--to page_head needs --page-size \(tokens per page\)"),
    (["--from", "pfd", "--to", "ph"], r"--from page_first_direct and --to page_head needs --page-size \(tokens per "
                                      r"page\)"),
])
def test_page_size_where_it_applies_only(tmp_path, capsys, args, message):
    np.save(tmp_path / "k.npy", LF)
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), str(tmp_path / "o.npy"), *args], capsys)
    assert code == 2 and len(err) == 1, err
    assert re.fullmatch(rf"kvnumba convert: error: {message} \(see: kvnumba convert --help\)", err[0]), err[0]
    assert _files(tmp_path) == ["k.npy"]


def test_python_errors_name_python_arguments():
    """kv.convert's messages name its own arguments, not the command line's options."""
    with pytest.raises(ValueError) as missing:
        kv.convert(LF, "lf", "ph")
    assert str(missing.value) == "page_head needs page_size (tokens per page): pass page_size="
    with pytest.raises(ValueError) as unknown:
        kv.convert(LF, "lf", "pagefirst")  # type: ignore[call-overload]
    assert str(unknown.value).startswith("dst: unknown layout 'pagefirst'")
    assert "--" not in str(missing.value) + str(unknown.value)
