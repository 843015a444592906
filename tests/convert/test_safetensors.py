"""``kvnumba convert`` and ``kv.convert`` on .safetensors files: every tensor converted, the metadata kept,
bf16 and fp8 tensors byte for byte under their own dtype, the same all-or-nothing write and one-line errors
as for .npy/.npz. Pure NumPy: no CUDA needed."""
import json
import os
import re
import struct
import sys

import numpy as np
import pytest
import safetensors  # the test extra installs it (the `safetensors` extra): its absence here is a failure
import safetensors.numpy

import kvnumba
from kvnumba.convert import safetensors as safetensors_format
from kvnumba.tools import cli

META = {"format": "kv-cache", "model": "test-8b", "layers": "3"}


def _cache(layers=3, tokens=16, heads=2, head_dim=8, dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(dtype).max, (layers, tokens, heads, head_dim), endpoint=True).astype(dtype)


def _file_bytes(tensors, metadata=None):
    """A .safetensors file built by hand from the format's description (not with the code under test):
    ``tensors`` is ``{name: (dtype code, array)}``; bf16 and fp8 arrays hold their raw bits."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (code, array) in tensors.items():
        payload = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _read(path):
    """``({name: (dtype code, shape, raw bytes)}, metadata)``, read by hand."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", None)
    return {name: (e["dtype"], tuple(e["shape"]), raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for name, e in header.items()}, metadata


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def _mixed_cache():
    """A cache as a model server might dump it: bf16 K and V, an fp8 copy, an fp32 MLA-like tensor."""
    return {"k": ("BF16", _cache(seed=1)), "v": ("BF16", _cache(seed=2)),
            "k_fp8": ("F8_E4M3", _cache(dtype=np.uint8, seed=3)),
            "mla": ("F32", _cache(heads=1, head_dim=12, seed=4).astype(np.float32) / 7)}


def _convert(args, capsys):
    try:
        code = cli.main(["convert", *map(str, args)])
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


@pytest.mark.parametrize("dst", ["page_first", "page_first_direct", "page_head",
                                 "tests.helpers.view_cases:HeadMajorPages"])
def test_round_trip_every_tensor_dtype_and_metadata(tmp_path, capsys, dst):
    tensors = _mixed_cache()
    if ":" in dst:  # a user layout of one head does not convert back to (L, T, 1, D) (kv.convert's item shape (D,))
        del tensors["mla"]
    (tmp_path / "kv.safetensors").write_bytes(_file_bytes(tensors, META))
    pages = ["--page-size", "4"] if dst != "page_first" else []  # --page-size only where there are pages
    code, out, err = _convert([tmp_path / "kv.safetensors", tmp_path / "out.safetensors", "--from", "layer_first",
                               "--to", dst, *pages, "--chunk-bytes", "256"], capsys)
    assert code == 0, err
    got, metadata = _read(tmp_path / "out.safetensors")
    assert metadata == META
    assert sorted(got) == sorted(tensors)
    for name, (dtype, array) in tensors.items():
        want = kvnumba.convert(array, "layer_first", dst, 4)  # bf16/fp8: the same bits, as integers
        assert got[name][:2] == (dtype, want.shape)  # the dtype string survives: BF16 stays BF16
        assert got[name][2] == want.tobytes()
        assert f"out.safetensors[{name}]: {dst} {want.shape}" in out
    # not a terminal: one summary line per tensor
    assert sorted(line.split(":")[0] for line in err) == sorted(f"kv.safetensors[{n}]" for n in tensors)

    code, _, err = _convert([tmp_path / "out.safetensors", tmp_path / "back.safetensors", "--from", dst, "--to", "lf",
                             *pages, "-q"], capsys)
    assert code == 0 and err == []
    back, metadata = _read(tmp_path / "back.safetensors")
    assert metadata == META
    assert back == {name: (dtype, array.shape, array.tobytes()) for name, (dtype, array) in tensors.items()}
    assert _files(tmp_path) == ["back.safetensors", "kv.safetensors", "out.safetensors"]


def test_output_reads_back_with_the_library(tmp_path):
    tensors = {"k": ("F16", _cache(seed=5).astype(np.float16)), "v": ("F32", _cache(seed=6).astype(np.float32)),
               "b": ("BF16", _cache(seed=7))}
    (tmp_path / "in.safetensors").write_bytes(_file_bytes(tensors, META))
    shapes = kvnumba.convert(tmp_path / "in.safetensors", "lf", "pfd", 4, out=tmp_path / "out.safetensors")
    assert shapes == {name: (4, 3, 4, 2, 8) for name in tensors}
    with safetensors.safe_open(str(tmp_path / "out.safetensors"), framework="np") as f:
        assert f.metadata() == META
        assert sorted(f.keys()) == ["b", "k", "v"]
        for name in ("k", "v"):
            np.testing.assert_array_equal(f.get_tensor(name), kvnumba.convert(tensors[name][1], "lf", "pfd", 4))
        assert f.get_slice("b").get_dtype() == "BF16"


def test_torch_sees_the_same_bf16_cache(tmp_path):
    """What torch (safetensors.torch) reads from the output is the bf16 cache, converted by torch's own indexing."""
    torch = pytest.importorskip("torch")
    import safetensors.torch

    k = torch.randn(3, 16, 2, 8).to(torch.bfloat16)
    safetensors.torch.save_file({"k": k}, str(tmp_path / "in.safetensors"), metadata=META)
    kvnumba.convert(str(tmp_path / "in.safetensors"), "lf", "ph", 4, out=str(tmp_path / "out.safetensors"))
    got = safetensors.torch.load_file(str(tmp_path / "out.safetensors"))["k"]
    assert got.dtype == torch.bfloat16
    want = k.reshape(3, 4, 4, 2, 8).permute(1, 3, 2, 0, 4)  # (L, T/P, P, H, D) -> page_head (T/P, H, P, L, D)
    assert torch.equal(got, want)


def test_no_metadata_stays_none(tmp_path):
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": ("U16", _cache())}))
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "out.safetensors")
    got, metadata = _read(tmp_path / "out.safetensors")
    assert metadata is None
    assert got["k"][2] == _cache().swapaxes(0, 1).tobytes()


@pytest.mark.parametrize("shape,dst", [((0, 8, 2, 8), "pf"), ((3, 0, 2, 8), "pfd"), ((0, 0, 2, 8), "ph")])
@pytest.mark.parametrize("dtype", ["BF16", "U16"])
def test_empty_tensors(tmp_path, shape, dst, dtype):
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": (dtype, np.zeros(shape, np.uint16))}, META))
    kvnumba.convert(tmp_path / "in.safetensors", "lf", dst, 4, out=tmp_path / "out.safetensors")
    got, metadata = _read(tmp_path / "out.safetensors")
    assert got["k"] == (dtype, kvnumba.convert(np.zeros(shape, np.uint16), "lf", dst, 4).shape, b"")
    assert metadata == META


def test_every_fp8_kind_and_bool_round_trip(tmp_path):
    tensors = {code: (code, _cache(dtype=np.uint8, seed=i)) for i, code in enumerate(
        ("F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8"))}
    tensors["mask"] = ("BOOL", _cache(seed=9) % 2 == 1)
    (tmp_path / "in.safetensors").write_bytes(_file_bytes(tensors))
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "ph", 4, out=tmp_path / "ph.safetensors")
    kvnumba.convert(tmp_path / "ph.safetensors", "ph", "lf", 4, out=tmp_path / "back.safetensors")
    assert _read(tmp_path / "back.safetensors")[0] == {n: (c, a.shape, a.tobytes()) for n, (c, a) in tensors.items()}


# --- kv.convert with paths --------------------------------------------------------------------------------

def test_kv_convert_takes_every_file_kind(tmp_path):
    lf = _cache()
    np.save(tmp_path / "k.npy", lf)
    np.savez(tmp_path / "kv.npz", k=lf, v=lf + 1)
    assert kvnumba.convert(str(tmp_path / "k.npy"), "lf", "pf", out=tmp_path / "k_pf.npy") == {"": (16, 3, 2, 8)}
    np.testing.assert_array_equal(np.load(tmp_path / "k_pf.npy"), lf.swapaxes(0, 1))
    assert kvnumba.convert(tmp_path / "kv.npz", "lf", "pf", out=tmp_path / "kv_pf.npz") == {"k": (16, 3, 2, 8),
                                                                                           "v": (16, 3, 2, 8)}
    with np.load(tmp_path / "kv_pf.npz") as got:
        np.testing.assert_array_equal(got["v"], (lf + 1).swapaxes(0, 1))


def test_kv_convert_path_arguments(tmp_path):
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": ("BF16", _cache())}))
    with pytest.raises(TypeError, match=r"converting the file '.*in\.safetensors' needs out=, the output file's path"):
        kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf")
    with pytest.raises(TypeError, match=r"out= is for an input given as a file path; got an array \(ndarray\): use "
                                        r"the returned array"):
        kvnumba.convert(_cache(), "lf", "pf", out=tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="files are converted with NumPy"):
        kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "o.safetensors", engine="kernels")
    with pytest.raises(ValueError, match="files are converted with NumPy"):
        kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "o.safetensors", block_quota=4)
    assert _files(tmp_path) == ["in.safetensors"]


# --- Errors: one line, a non-zero exit, nothing written ---------------------------------------------------

def _header_bytes(header, data=b""):
    text = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(text)) + text + data


GOOD = _file_bytes({"k": ("BF16", _cache())}, META)
ENTRY = {"dtype": "BF16", "shape": [3, 16, 2, 8], "data_offsets": [0, 1536]}

# id, input name, input bytes, message (regex; <IN> is the input's path)
BAD_FILES = [
    ("empty", "in.safetensors", b"", r"<IN>: the file is empty \(0 bytes\), not a \.safetensors file"),
    ("not-safetensors", "in.safetensors", b"hello, world, hello",
     r"<IN>: not a \.safetensors file: it starts with b'hello, world, he', expected an 8-byte header size and then '\{'"),
    ("npy-named-safetensors", "in.safetensors", b"\x93NUMPY\x01\x00" + bytes(100),
     r"<IN>: named \.safetensors but its content is a \.npy file; rename it to \.npy"),
    ("safetensors-named-npy", "in.npy", GOOD,
     r"<IN>: named \.npy but its content is a \.safetensors file; rename it to \.safetensors"),
    ("safetensors-named-npz", "in.npz", GOOD,
     r"<IN>: named \.npz but its content is a \.safetensors file; rename it to \.safetensors"),
    ("header-past-the-end", "in.safetensors", struct.pack("<Q", 5000) + b'{"k": {}}',
     r"<IN>: truncated or corrupt: its header size says 5,000 B, but the file holds 9 B after the header size"),
    ("header-too-large", "in.safetensors", struct.pack("<Q", 1 << 40) + b"{}",
     r"<IN>: not a readable \.safetensors file: its header size says 1,099,511,627,776 B, more than the "
     r"100,000,000 B safetensors allows"),
    ("header-not-json", "in.safetensors", _header_bytes(b"{not json}"),
     r"<IN>: not a readable \.safetensors file: its header is not JSON \(.*\)"),
    ("metadata-not-strings", "in.safetensors", _header_bytes({"__metadata__": {"layers": 3}}),
     r"<IN>: not a readable \.safetensors file: its __metadata__ is not a map of strings"),
    ("entry-without-offsets", "in.safetensors", _header_bytes({"k": {"dtype": "BF16", "shape": [2]}}),
     r"<IN>\[k\]: not a readable \.safetensors entry: \{\"dtype\": \"BF16\", \"shape\": \[2\]\}"),
    ("negative-shape", "in.safetensors", _header_bytes({"k": {**ENTRY, "shape": [-1, 16, 2, 8]}}),
     r"<IN>\[k\]: not a readable \.safetensors entry: .*"),
    ("unknown-dtype", "in.safetensors", _header_bytes({"k": {**ENTRY, "dtype": "F4"}}),
     r"<IN>\[k\]: dtype F4 cannot be converted: kvnumba converts F64, F32, .*BF16, F8_E4M3, .* \(whole bytes per element\)"),
    ("offsets-do-not-fit-shape", "in.safetensors", _header_bytes({"k": {**ENTRY, "data_offsets": [0, 1000]}}),
     r"<IN>\[k\]: corrupt: shape \[3, 16, 2, 8\] of BF16 is 1,536 B, but its data_offsets \[0, 1000\] span 1,000 B"),
    ("truncated-data", "in.safetensors", GOOD[:-10],
     r"<IN>\[k\]: truncated or corrupt: its data ends at byte 1,536 of the data, but the file holds 1,526 B of "
     r"data after the header"),
    ("overlapping-tensors", "in.safetensors", _header_bytes({"k": ENTRY, "v": ENTRY}, bytes(1536)),
     r"<IN>: not a readable \.safetensors file: .*invalid offset for tensor `[kv]`"),
    ("hole-in-the-data", "in.safetensors", _header_bytes({"k": ENTRY}, bytes(2000)),
     r"<IN>: not a readable \.safetensors file: .*not fully covered"),
    # Nested past what a header needs (3 levels) and past Python's recursion limit: one line, no RecursionError.
    ("nested-deep-metadata", "in.safetensors", _header_bytes(b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
     r"<IN>: not a readable \.safetensors file: its header nests arrays and objects 100,001 levels deep \(a header "
     r"needs 3; kvnumba reads at most 64\)"),
    ("nested-deep-entry", "in.safetensors", _header_bytes(b'{"k": {"dtype": "BF16", "x": ' + b"{\"a\": " * 2000
                                                          + b"1" + b"}" * 2000 + b"}}"),
     r"<IN>: not a readable \.safetensors file: its header nests arrays and objects 2,002 levels deep .*"),
    ("nested-65", "in.safetensors", _header_bytes(b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}"),
     r"<IN>: not a readable \.safetensors file: its header nests arrays and objects 65 levels deep .*"),
    ("shape-does-not-fit", "in.safetensors", _file_bytes({"k": ("BF16", _cache()), "v": ("BF16", _cache(tokens=10))}),
     r"<IN>\[v\]: page_first_direct needs T divisible by page_size=4: got T=10 \(shape \(3, 10, 2, 8\) in layer_first\)"),
    ("offsets-past-the-end", "in.safetensors", _header_bytes({"k": {**ENTRY, "data_offsets": [1536, 3072]}}, bytes(1536)),
     r"<IN>\[k\]: truncated or corrupt: its data ends at byte 3,072 of the data, but the file holds 1,536 B of "
     r"data after the header"),
    ("offsets-overlapping-in-part", "in.safetensors",
     _header_bytes({"k": ENTRY, "v": {**ENTRY, "data_offsets": [768, 2304]}}, bytes(2304)),
     r"<IN>: not a readable \.safetensors file: .*invalid offset for tensor `v`"),
    ("offsets-reversed", "in.safetensors", _header_bytes({"k": {**ENTRY, "data_offsets": [1536, 0]}}, bytes(1536)),
     r"<IN>\[k\]: corrupt: shape \[3, 16, 2, 8\] of BF16 is 1,536 B, but its data_offsets \[1536, 0\] span -1,536 B"),
    ("shape-larger-than-its-bytes", "in.safetensors",
     _header_bytes({"k": {**ENTRY, "shape": [3, 16, 2, 16]}}, bytes(1536)),
     r"<IN>\[k\]: corrupt: shape \[3, 16, 2, 16\] of BF16 is 3,072 B, but its data_offsets \[0, 1536\] span 1,536 B"),
]


@pytest.mark.parametrize("old", [True, False], ids=["an old output", "no output yet"])
@pytest.mark.parametrize("name,data,message", [row[1:] for row in BAD_FILES], ids=[row[0] for row in BAD_FILES])
def test_bad_file_is_one_line_and_writes_nothing(tmp_path, capsys, name, data, message, old):
    out_name = f"out{os.path.splitext(name)[1]}"
    (tmp_path / name).write_bytes(data)
    if old:
        (tmp_path / out_name).write_bytes(b"old")
    code, _, err = _convert([tmp_path / name, tmp_path / out_name, "--from", "lf", "--to", "pfd", "--page-size",
                             "4", "--force"], capsys)
    assert code == 1 and len(err) == 1, err
    message = message.replace("<IN>", re.escape(str(tmp_path / name)))
    assert re.fullmatch(f"kvnumba convert: error: {message}", err[0]), err[0]
    assert (tmp_path / name).read_bytes() == data
    if old:
        assert (tmp_path / out_name).read_bytes() == b"old"
    assert _files(tmp_path) == sorted([name] + [out_name] * old)  # no output file, partial or whole


@pytest.mark.parametrize("depth", [64, 1_000, 100_000])
def test_kv_convert_names_the_file_of_a_deeply_nested_header(tmp_path, depth):
    path = tmp_path / "in.safetensors"
    path.write_bytes(_header_bytes(b'{"__metadata__": {"a": ' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"))
    match = "its __metadata__ is not a map of strings" if depth <= 64 else f"nests arrays and objects {depth:,} levels"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a readable \.safetensors file: .*{match}"):
        kvnumba.convert(path, "lf", "pf", out=tmp_path / "out.safetensors")
    assert _files(tmp_path) == ["in.safetensors"]


def test_brackets_inside_strings_are_not_nesting(tmp_path):
    note = "[{" * 5_000  # metadata is free-form text
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": ("BF16", _cache())}, {"note": note}))
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "out.safetensors")
    assert _read(tmp_path / "out.safetensors")[1] == {"note": note}


def test_missing_file(tmp_path, capsys):
    code, _, err = _convert([tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--from", "lf", "--to", "pf"],
                            capsys)
    assert code == 1 and len(err) == 1 and re.fullmatch(
        r"kvnumba convert: error: .*in\.safetensors: No such file or directory", err[0]), err
    assert _files(tmp_path) == []


def test_safetensors_not_installed(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` now fails
    (tmp_path / "in.safetensors").write_bytes(GOOD)
    code, _, err = _convert([tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--from", "lf", "--to", "pf"],
                            capsys)
    assert code == 1
    assert err == ["kvnumba convert: error: .safetensors files need the safetensors package: "
                   "pip install -e \".[safetensors]\" (from kvnumba's checkout)"]
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[safetensors\]"'):
        kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "out.safetensors")
    assert _files(tmp_path) == ["in.safetensors"]
    # .npy and .npz files do not need it
    np.save(tmp_path / "k.npy", _cache())
    assert kvnumba.convert(tmp_path / "k.npy", "lf", "pf", out=tmp_path / "o.npy") == {"": (16, 3, 2, 8)}


def _refusing_writer(message):
    def serialize_file(*args, **kwargs):
        raise safetensors.SafetensorError(message)
    return serialize_file


def test_disk_full_is_one_line_and_keeps_the_old_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(safetensors, "serialize_file", _refusing_writer(
        "Error while serializing: I/O error: No space left on device (os error 28)"))
    (tmp_path / "in.safetensors").write_bytes(GOOD)
    (tmp_path / "out.safetensors").write_bytes(b"old")
    code, _, err = _convert([tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--from", "lf", "--to", "pf",
                             "--force"], capsys)
    assert code == 1
    assert re.fullmatch(r"kvnumba convert: error: not enough disk space to write .*out\.safetensors \(in .*\)",
                        err[-1]), err
    assert (tmp_path / "out.safetensors").read_bytes() == b"old"
    assert _files(tmp_path) == ["in.safetensors", "out.safetensors"]


def test_a_dtype_the_installed_library_cannot_write(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(safetensors, "serialize_file", _refusing_writer("dtype float8_e8m0fnu is not covered"))
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": ("F8_E8M0", _cache(dtype=np.uint8))}))
    code, _, err = _convert([tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--from", "lf", "--to", "pf",
                             "-q"], capsys)
    assert code == 1 and len(err) == 1
    assert re.fullmatch(rf"kvnumba convert: error: safetensors cannot write {re.escape(str(tmp_path))}/out\.safetensors: "
                        r"dtype float8_e8m0fnu is not covered", err[0]), err  # the output, not its temporary file
    assert _files(tmp_path) == ["in.safetensors"]


def test_the_reader_is_the_library(tmp_path, monkeypatch):
    """Tensors NumPy has a dtype for come from safe_open(framework="np"); bf16 is memory-mapped as ml_dtypes'
    bfloat16 (the library's NumPy reader refuses it)."""
    asked = []
    real = safetensors.safe_open

    class Recording:
        def __init__(self, path, framework):
            asked.append(framework)
            self._file = real(path, framework=framework)

        def __enter__(self):
            self._file.__enter__()
            return self

        def __exit__(self, *exc):
            return self._file.__exit__(*exc)

        def get_tensor(self, name):
            asked.append(name)
            return self._file.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    (tmp_path / "in.safetensors").write_bytes(_file_bytes({"k": ("BF16", _cache()), "v": ("U16", _cache())}))
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "out.safetensors")
    assert asked == ["np", "v"]
    import ml_dtypes

    assert safetensors_format.numpy_dtype("BF16") == np.dtype(ml_dtypes.bfloat16)
    assert safetensors_format.code_for(ml_dtypes.float8_e4m3fn) == "F8_E4M3"
    assert safetensors_format.code_for(np.dtype(">u2")) == "U16" and safetensors_format.code_for(np.dtype("M8")) is None
