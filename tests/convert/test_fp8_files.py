"""Quantised cache files (``kvnumba.convert.quantised``): ``kvnumba convert --dtype fp8_e4m3|fp8_e5m2`` and
``kv.convert(path, ..., dtype=)`` write FP8 codes ``X`` and float32 ``X_scales`` into a .safetensors file,
bit for bit ``kvnumba.quant_reference``'s; ``--dtype bfloat16|float16`` reads them back; without ``--dtype`` a
quantised file changes layout and stays quantised. Files are read back by hand (the format as documented).
Pure NumPy: no CUDA needed."""
import importlib

import ml_dtypes
import numpy as np
import pytest

import kvnumba
from kvnumba import quant_reference as qr
from kvnumba.convert import quantised
from tests.convert.test_safetensors import _convert, _file_bytes, _files, _read

L, T, H, D, P = 2, 8, 2, 8, 4
PLAIN = {"bfloat16": ("BF16", ml_dtypes.bfloat16), "float16": ("F16", np.float16)}
CODES = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}


def _values(dtype, shape=(L, T, H, D), seed=0):
    """Values of ``dtype`` with NaN, ±inf, zero heads and a wide range among them."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * np.exp(rng.normal(0, 3, shape[:-1] + (1,)))).astype(np.float32)
    x = np.clip(x, -6e4, 6e4)  # finite in float16 too
    flat = x.reshape(-1, shape[-1])
    flat[::5] = 0
    flat[1, :3] = [np.nan, np.inf, -np.inf]
    return x.astype(PLAIN[dtype][1])


def _plain_file(path, dtype="bfloat16", tensors=None, metadata=None):
    tensors = tensors or {"k": _values(dtype, seed=1), "v": _values(dtype, seed=2)}
    code = PLAIN[dtype][0]
    path.write_bytes(_file_bytes({name: (code, a.view(np.uint16)) for name, a in tensors.items()}, metadata))
    return tensors


def _relaid(array, dst):
    return kvnumba.convert(np.ascontiguousarray(array), "layer_first", dst, page_size=P if dst in ("ph", "pfd") else None)


def _tensor(found, name, holder):
    code, shape, raw = found[name]
    return code, np.frombuffer(raw, holder).reshape(shape)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dst", ["lf", "pf", "ph", "pfd"])
def test_quantise_is_quant_reference_bit_for_bit(tmp_path, fmt, dtype, dst):
    tensors = _plain_file(tmp_path / "in.safetensors", dtype, metadata={"model": "m"})
    shapes = kvnumba.convert(tmp_path / "in.safetensors", "lf", dst, page_size=P if dst in ("ph", "pfd") else None,
                             out=tmp_path / "q.safetensors", dtype=f"fp8_{fmt}")
    found, metadata = _read(tmp_path / "q.safetensors")
    assert set(found) == set(shapes) == {"k", "k_scales", "v", "v_scales"}
    assert metadata == {"model": "m", "kvnumba.fp8": fmt, "kvnumba.fp8_dtype": dtype}
    for name, x in tensors.items():
        codes, scales = qr.quantise(x, fmt)
        code, got = _tensor(found, name, np.uint8)
        assert code == CODES[fmt]
        np.testing.assert_array_equal(got, _relaid(codes, dst))
        code, got = _tensor(found, name + "_scales", "<f4")
        assert code == "F32"
        np.testing.assert_array_equal(got.view(np.uint32), _relaid(scales, dst).view(np.uint32))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dequantise_round_trip(tmp_path, fmt, dtype):
    tensors = _plain_file(tmp_path / "in.safetensors", dtype)
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "ph", P, out=tmp_path / "q.safetensors", dtype=f"fp8_{fmt}")
    shapes = kvnumba.convert(tmp_path / "q.safetensors", "ph", "pf", P, out=tmp_path / "back.safetensors", dtype=dtype)
    found, metadata = _read(tmp_path / "back.safetensors")
    assert set(found) == set(shapes) == {"k", "v"} and metadata is None
    for name, x in tensors.items():
        want = qr.dequantise(*qr.quantise(x, fmt), dtype=dtype, fmt=fmt)
        code, got = _tensor(found, name, "<u2")
        assert code == PLAIN[dtype][0]
        np.testing.assert_array_equal(got, _relaid(want.view(np.uint16), "pf"))


def test_a_quantised_file_changes_layout_and_stays_quantised(tmp_path):
    _plain_file(tmp_path / "in.safetensors", metadata={"model": "m"})
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "lf", out=tmp_path / "q.safetensors", dtype="fp8_e4m3")
    for dtype in (None, "fp8_e4m3"):  # the same format again: only re-laid out
        out = tmp_path / f"ph_{dtype}.safetensors"
        kvnumba.convert(tmp_path / "q.safetensors", "lf", "ph", P, out=out, dtype=dtype)
        before, meta_before = _read(tmp_path / "q.safetensors")
        after, meta_after = _read(out)
        assert meta_after == meta_before
        for name in ("k", "k_scales", "v", "v_scales"):
            holder = np.uint8 if name in ("k", "v") else "<u4"
            code, array = _tensor(before, name, holder)
            assert after[name][0] == code
            np.testing.assert_array_equal(_tensor(after, name, holder)[1], _relaid(array, "ph"))


def test_mla_tensor(tmp_path):
    x = _values("bfloat16", shape=(L, T, 64), seed=3)
    _plain_file(tmp_path / "in.safetensors", tensors={"kv": x})
    kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "q.safetensors", dtype="fp8_e5m2")
    found, _ = _read(tmp_path / "q.safetensors")
    codes, scales = qr.quantise(x, "e5m2")
    assert found["kv_scales"][1] == (T, L, 1)
    np.testing.assert_array_equal(_tensor(found, "kv", np.uint8)[1], _relaid(codes, "pf"))
    np.testing.assert_array_equal(_tensor(found, "kv_scales", "<f4")[1], _relaid(scales, "pf"))


def test_the_command_line(tmp_path, capsys):
    _plain_file(tmp_path / "in.safetensors", "float16")
    code, out, err = _convert([tmp_path / "in.safetensors", tmp_path / "q.safetensors", "--from", "lf", "--to", "ph",
                               "--page-size", P, "--dtype", "fp8_e4m3", "-q"], capsys)
    assert code == 0 and err == []
    assert f"q.safetensors[k_scales]: page_head {(T // P, H, P, L, 1)}" in out
    code, out, err = _convert([tmp_path / "q.safetensors", tmp_path / "back.safetensors", "--from", "ph", "--to",
                               "lf", "--page-size", P, "--dtype", "float16", "-q"], capsys)
    assert code == 0 and "back.safetensors[v]: layer_first" in out
    assert set(_read(tmp_path / "back.safetensors")[0]) == {"k", "v"}


def test_a_bad_dtype_is_named(tmp_path, capsys):
    _plain_file(tmp_path / "in.safetensors")
    code, out, err = _convert([tmp_path / "in.safetensors", tmp_path / "q.safetensors", "--from", "lf", "--to", "pf",
                               "--dtype", "fp8"], capsys)
    assert code == 2 and "argument --dtype: must be one of bfloat16, float16, fp8_e4m3, fp8_e5m2, nvfp4, got 'fp8'" in err[0]
    with pytest.raises(ValueError, match="dtype must be one of .* got 'int8'"):
        kvnumba.convert(tmp_path / "in.safetensors", "lf", "pf", out=tmp_path / "q.safetensors", dtype="int8")
    assert _files(tmp_path) == ["in.safetensors"]


def _refused(tmp_path, capsys, args, message, name="in.safetensors"):
    code, out, err = _convert([tmp_path / name, tmp_path / "out.safetensors", "--from", "lf", "--to", "pf",
                               *args], capsys)
    assert code == 1 and len(err) == 1 and message in err[0], err
    assert "out.safetensors" not in _files(tmp_path)


def test_what_cannot_be_quantised_or_dequantised(tmp_path, capsys):
    path = tmp_path / "in.safetensors"
    path.write_bytes(_file_bytes({"k": ("F32", np.zeros((L, T, H, D), np.float32))}))
    _refused(tmp_path, capsys, ["--dtype", "fp8_e4m3"], "[k]: fp8_e4m3 quantises bfloat16 or float16 tensors, this "
                                                        "one is float32")
    _refused(tmp_path, capsys, ["--dtype", "bfloat16"], "[k]: --dtype bfloat16 dequantises a quantised file")
    _plain_file(path, tensors={"k": _values("bfloat16"), "k_scales": _values("bfloat16")})
    _refused(tmp_path, capsys, ["--dtype", "fp8_e4m3"], "two tensors named 'k_scales'")
    _plain_file(path)
    kvnumba.convert(path, "lf", "lf", out=tmp_path / "q.safetensors", dtype="fp8_e4m3")
    _refused(tmp_path, capsys, ["--dtype", "fp8_e5m2"], "is quantised as fp8_e4m3, not fp8_e5m2", "q.safetensors")
    code, out, err = _convert([tmp_path / "in.safetensors", tmp_path / "out.npz", "--from", "lf", "--to", "pf",
                               "--dtype", "fp8_e4m3"], capsys)
    assert code == 1 and "name the output .safetensors" in err[0]
    np.savez(tmp_path / "plain.npz", k=np.zeros((L, T, H, D), np.float16))
    kvnumba.convert(tmp_path / "plain.npz", "lf", "pf", out=tmp_path / "from_npz.safetensors", dtype="fp8_e4m3")
    assert set(_read(tmp_path / "from_npz.safetensors")[0]) == {"k", "k_scales"}


def test_dtype_is_for_files():
    with pytest.raises(TypeError, match="dtype= is for an input given as a file path.*kv.fp8_like"):
        kvnumba.convert(np.zeros((L, T, H, D), np.float16), "lf", "pf", dtype="fp8_e4m3")


def test_the_format_is_in_the_module_docstring():
    doc = importlib.import_module("kvnumba.convert.quantised").__doc__
    for words in ("F8_E4M3", "F8_E5M2", "X_scales", "F32", '"kvnumba.fp8"', "kvnumba.quant.fp8"):
        assert words in doc
    assert quantised.SCALES_SUFFIX == "_scales" and quantised.FORMAT_KEY == "kvnumba.fp8"
