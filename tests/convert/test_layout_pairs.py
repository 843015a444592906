"""Whole-cache conversion: every layout pair on NumPy against per-token loops, the kernel engine against
the NumPy engine (simulator or GPU), and the error messages."""
import itertools

import numpy as np
import pytest

import kvnumba
from kvnumba.layouts import NAMES
from kvnumba.convert import converted_shape
from tests.helpers.placement import device, to_numpy

pytestmark = pytest.mark.smoke  # in the one-minute subset

LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
PAIRS = list(itertools.product(LAYOUTS, LAYOUTS))


def _cache(layers, tokens, item, dtype, seed=0):
    """A layer_first cache ``(L, T, *item)`` with distinct values (bf16 stand-in: uint16 bit patterns)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2**16, (layers, tokens, *item), dtype=np.uint32)
    return raw.astype(dtype) if np.dtype(dtype).kind != "f" else (raw / 7).astype(dtype)


def _expected(lf, lay, page_size):
    """``lf`` in layout ``lay``, by an explicit loop over layers and tokens (the definition of each layout)."""
    layers, tokens, *item = lf.shape
    P = page_size
    if lay == "layer_first":
        return lf.copy()
    if lay == "page_first":
        out = np.empty((tokens, layers, *item), lf.dtype)
        for l, t in itertools.product(range(layers), range(tokens)):
            out[t, l] = lf[l, t]
        return out
    if lay == "page_first_direct":
        out = np.empty((tokens // P, layers, P, *item), lf.dtype)
        for l, t in itertools.product(range(layers), range(tokens)):
            out[t // P, l, t % P] = lf[l, t]
        return out
    heads, head_dim = item
    out = np.empty((tokens // P, heads, P, layers, head_dim), lf.dtype)
    for l, t, h in itertools.product(range(layers), range(tokens), range(heads)):
        out[t // P, h, t % P, l] = lf[l, t, h]
    return out


MHA = (2, 8)  # (H, D)
MLA_2D = (1, 12)
MLA_1D = (12,)


@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.int8, np.float64])
@pytest.mark.parametrize("item", [MHA, MLA_2D], ids=["mha", "mla"])
@pytest.mark.parametrize("src,dst", PAIRS)
def test_numpy_every_pair(src, dst, item, dtype):
    lf = _cache(3, 12, item, dtype)
    P = 4
    given = _expected(lf, src, P)
    got = kvnumba.convert(given, src, dst, page_size=P, engine="numpy")
    want = _expected(lf, dst, P)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kvnumba.convert(got, dst, src, P, engine="numpy"), given)  # and back


@pytest.mark.parametrize("src,dst", [p for p in PAIRS if "page_head" not in p])
def test_numpy_mla_one_dimensional_items(src, dst):
    lf = _cache(2, 8, MLA_1D, np.uint16)
    got = kvnumba.convert(_expected(lf, src, 2), src, dst, 2)
    np.testing.assert_array_equal(got, _expected(lf, dst, 2))


def test_unpaged_pairs_need_no_page_size():
    lf = _cache(2, 5, MHA, np.uint16)
    pf = kvnumba.convert(lf, "layer_first", "page_first")
    np.testing.assert_array_equal(pf, lf.swapaxes(0, 1))
    np.testing.assert_array_equal(kvnumba.convert(pf, "pf", "lf"), lf)


def test_short_names_and_view_classes():
    lf = _cache(2, 4, MHA, np.uint16)
    a = kvnumba.convert(lf, "lf", "pfd", 2)
    b = kvnumba.convert(lf, kvnumba.LayerFirst, "Page-First-Direct", 2)
    np.testing.assert_array_equal(a, b)


# --- one vocabulary: the views and their string names ------------------------------------------------

VIEWS = {"layer_first": kvnumba.LayerFirst, "page_first": kvnumba.PageFirst,
         "page_first_direct": kvnumba.PageFirstDirect, "page_head": kvnumba.PageHead}
SHORT = {"lf": "layer_first", "pf": "page_first", "pfd": "page_first_direct", "ph": "page_head"}


@pytest.mark.parametrize("name", list(VIEWS) + list(SHORT))
def test_every_view_name_is_its_class(name):
    """Each string kv.convert takes names one view class, and converts exactly as the class does."""
    cls = VIEWS[SHORT.get(name, name)]
    assert NAMES[name] is cls and cls.name == SHORT.get(name, name)
    lf = _cache(2, 8, MHA, np.uint16, seed=4)
    by_class = kvnumba.convert(lf, kvnumba.LayerFirst, cls, 4)
    by_name = kvnumba.convert(lf, "layer_first", name, 4)
    np.testing.assert_array_equal(by_name, by_class)
    np.testing.assert_array_equal(by_class, _expected(lf, cls.name, 4))
    np.testing.assert_array_equal(kvnumba.convert(by_class, name, cls, 4), by_class)


def test_the_old_layout_vocabularies_are_gone():
    import kvnumba.convert as convert_module

    for gone in ("CacheLayout", "Layout"):
        assert not hasattr(kvnumba, gone) and gone not in kvnumba.__all__
    assert not hasattr(convert_module, "CacheLayout")


@pytest.mark.parametrize("name,cls", [("vllm_flash_attn", "VllmFlashAttn"), ("vllm_flash_infer", "VllmFlashInfer"),
                                      ("layer_table", "LayerTable")])
def test_per_layer_views_are_named_and_refused_by_convert(name, cls):
    assert NAMES[name] is getattr(kvnumba, cls)
    for layout in (name, getattr(kvnumba, cls)):
        with pytest.raises(ValueError, match=rf"^dst: {name} keeps a cache in per-layer arrays"):
            kvnumba.convert(np.zeros((2, 4, 8), np.uint8), "lf", layout)


def test_converted_shape():
    assert converted_shape((100, 32, 8, 128), "page_first", "layer_first") == (32, 100, 8, 128)
    assert converted_shape((32, 128, 8, 128), "lf", "ph", 64) == (2, 8, 64, 32, 128)
    assert converted_shape((2, 8, 64, 32, 128), "ph", "pfd", 64) == (2, 32, 64, 8, 128)


@pytest.mark.parametrize("args,match", [
    (((100, 32, 8, 128), "page_frist", "layer_first", None),
     r"^src: unknown layout 'page_frist': expected one of layer_first \(lf\), page_first \(pf\), page_first_direct "
     r"\(pfd\), page_head \(ph\), page_unified \(pu\), or module:Class$"),
    (((100, 32, 8, 128), "page_first", "lf2", None), r"dst: unknown layout 'lf2'"),
    (((100, 32, 8, 128), "page_first", "page_first_direct", 64),
     r"page_first_direct needs T divisible by page_size=64: got T=100 \(shape \(100, 32, 8, 128\) in page_first\)"),
    (((32, 100, 8, 128), "layer_first", "page_head", 64),
     r"page_head needs T divisible by page_size=64: got T=100 \(shape \(32, 100, 8, 128\) in layer_first\)"),
    (((100, 32, 8, 128), "page_first", "page_head", None), r"page_head needs page_size"),
    (((2, 32, 64, 8, 128), "page_first_direct", "layer_first", None), r"page_first_direct needs page_size"),
    (((2, 32, 32, 8, 128), "page_first_direct", "layer_first", 64),
     r"page_first_direct: its page size is 32 \(shape \(2, 32, 32, 8, 128\)\), page_size=64 was given"),
    (((2, 8, 64, 32), "page_head", "layer_first", 64), r"PageHead: a buffer is \[T/P, H, P, L, D\], got \(2, 8, 64, 32\)"),
    (((32, 128), "layer_first", "page_first", None), r"LayerFirst: a buffer is \[L, T, \*item\], got \(32, 128\)"),
    (((32, 128, 2, 3, 4), "layer_first", "page_first", None), r"LayerFirst: an item is \(H, D\) or \(D,\), got \(2, 3, 4\)"),
    (((32, 128, 576), "layer_first", "page_head", 64),
     r"page_head needs a per-token item of shape \(H, D\) to find H: got item shape \(576,\) "
     r"\(shape \(32, 128, 576\) in layer_first\)"),
    (((32, 128, 8, 128), "layer_first", "page_head", 0), r"page_size must be >= 1, got 0"),
])
def test_shape_errors(args, match):
    shape, src, dst, page_size = args
    with pytest.raises(ValueError, match=match):
        kvnumba.convert(np.zeros(shape, np.uint8), src, dst, page_size)


def test_engine_name_is_checked():
    with pytest.raises(ValueError, match=r"engine must be one of 'auto', 'numpy', 'kernels', got 'gpu'"):
        kvnumba.convert(np.zeros((2, 4, 8), np.uint8), "lf", "pf", engine="gpu")


def test_not_an_array():
    with pytest.raises(TypeError, match=r"array must be an array"):
        kvnumba.convert([[1, 2]], "lf", "pf")


# --- The kernel engine: the same conversions through kvnumba's kernels ---------------------------------

@pytest.mark.needs_target
@pytest.mark.parametrize("item,dtype", [(MHA, np.uint16), ((1, 4), np.float32), ((4, 2), np.int32)],
                         ids=["mha-bf16", "mla-fp32", "mha-4heads"])
@pytest.mark.parametrize("src,dst", PAIRS)
def test_kernels_match_numpy(src, dst, item, dtype):
    lf = _cache(2, 8, item, dtype, seed=1)
    P = 4
    given = _expected(lf, src, P)
    got = kvnumba.convert(device(given), src, dst, page_size=P, engine="kernels", block_quota=2,
                          num_warps_per_block=1)
    np.testing.assert_array_equal(to_numpy(got), kvnumba.convert(given, src, dst, P, engine="numpy"))


@pytest.mark.needs_target
@pytest.mark.parametrize("src,dst", [p for p in PAIRS if "page_head" not in p])
def test_kernels_mla_one_dimensional_items(src, dst):
    lf = _cache(2, 4, (8,), np.uint16, seed=2)
    got = kvnumba.convert(device(_expected(lf, src, 2)), src, dst, 2, engine="kernels")
    np.testing.assert_array_equal(to_numpy(got), _expected(lf, dst, 2))


@pytest.mark.needs_target
def test_kernels_need_8_byte_items():
    with pytest.raises(ValueError, match=r"one token's item is 6 bytes .* not a multiple of 8; use engine='numpy'"):
        kvnumba.convert(device(np.zeros((2, 4, 1, 3), np.uint16)), "lf", "pf", engine="kernels")
    with pytest.raises(ValueError, match=r"item_size / H = 16 / 4 bytes is not a multiple of 8"):
        kvnumba.convert(device(np.zeros((2, 4, 4, 2), np.uint16)), "lf", "ph", 2, engine="kernels")


@pytest.mark.needs_target
def test_kernels_empty_cache():
    got = kvnumba.convert(device(np.zeros((2, 0, 8), np.uint8)), "lf", "pf", engine="kernels")
    assert to_numpy(got).shape == (0, 2, 8)


@pytest.mark.parametrize("order", ["fortran", "strided"])
@pytest.mark.parametrize("src,dst", [("lf", "pf"), ("lf", "ph"), ("pf", "pfd")])
def test_numpy_engine_takes_any_memory_order(src, dst, order):
    lf = _cache(2, 8, MHA, np.uint16)
    given = _expected(lf, NAMES[src].name, 4)
    if order == "fortran":
        odd = np.asfortranarray(given)
    else:  # every other element of a twice-as-long last axis
        odd = np.repeat(given, 2, axis=-1)[..., ::2]
    before = odd.copy()
    for engine in ("numpy", "auto"):
        got = kvnumba.convert(odd, src, dst, 4, engine=engine)
        np.testing.assert_array_equal(got, kvnumba.convert(given, src, dst, 4, engine="numpy"))
    np.testing.assert_array_equal(odd, before)  # the caller's array is only read


# --- a user-defined layout: kv.convert and kvnumba convert take it like a built-in one -------------

@pytest.mark.parametrize("engine", ["numpy", "kernels"])
@pytest.mark.parametrize("other", ["layer_first", "page_first", "page_head"])
def test_user_layout_converts_both_ways(other, engine):
    from tests.helpers.view_cases import HeadMajorPages

    lf = _cache(2, 8, MHA, np.uint16, seed=3)
    place = device if engine == "kernels" else (lambda a: a)  # the kernel engine converts GPU memory
    start = place(kvnumba.convert(lf, "layer_first", other, page_size=4))
    theirs = to_numpy(kvnumba.convert(start, other, HeadMajorPages, page_size=4, engine=engine))
    assert theirs.shape == (2, 2, MHA[0], 4, MHA[1])
    np.testing.assert_array_equal(np.swapaxes(theirs, 2, 3).reshape(lf.shape), lf)
    back = to_numpy(kvnumba.convert(place(theirs), HeadMajorPages, other, page_size=4, engine=engine))
    np.testing.assert_array_equal(kvnumba.convert(back, other, "layer_first", page_size=4), lf)


def test_user_layout_by_module_path():
    from kvnumba.convert.shapes import layout

    assert layout("tests.helpers.view_cases:HeadMajorPages").__name__ == "HeadMajorPages"
    with pytest.raises(ValueError, match=r"cannot import layout 'tests.helpers.view_cases:Nope'"):
        layout("tests.helpers.view_cases:Nope", "dst")
    with pytest.raises(ValueError, match=r"'numpy:ndarray' is not a kvnumba.CacheView subclass"):
        layout("numpy:ndarray", "dst")


def test_page_head_from_a_view_class_without_heads_names_it():
    # A view class as the source of a page_head conversion whose items have no head axis: the error names
    # the class (it used to fail building the message, with AttributeError: no attribute 'value').
    with pytest.raises(ValueError, match=r"item shape \(16,\) \(shape \(8, 2, 16\) in page_first\)"):
        converted_shape((8, 2, 16), kvnumba.PageFirst, "page_head", page_size=4)


# --- the layering: kv.convert never imports the command line --------------------------------------------

def test_convert_imports_no_tools():
    """``kvnumba.convert`` (arrays and files) stands below ``kvnumba.tools``: importing it, and converting a file
    with it, loads nothing of tools; the file converter does not import kv.convert either (no loop)."""
    import subprocess
    import sys

    code = """
import sys, tempfile, os
import numpy as np
import kvnumba.convert
loaded = [m for m in sys.modules if m.startswith("kvnumba.tools")]
assert not loaded, loaded
import kvnumba.convert.files, kvnumba.convert.shapes
with tempfile.TemporaryDirectory() as d:
    np.save(os.path.join(d, "k.npy"), np.zeros((2, 4, 8), np.uint8))
    kvnumba.convert(os.path.join(d, "k.npy"), "lf", "pf", out=os.path.join(d, "o.npy"))
loaded = [m for m in sys.modules if m.startswith("kvnumba.tools")]
assert not loaded, loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    import ast
    import pathlib

    root = pathlib.Path(kvnumba.__file__).parent
    # (level, first name) of each ``from ... import``: kv.convert is ``.api`` within the wing
    forbidden = {"convert": {(1, "api"), (2, "tools")}, ".": {(1, "convert"), (1, "tools")}}
    wing = ("files.py", "inputs.py", "outputs.py", "shapes.py", "safetensors.py", "unified.py",
            "pool_files.py")
    for folder, module in [("convert", m) for m in wing] + [(".", "units.py")]:
        tree = ast.parse((root / folder / module).read_text())
        imported = {(node.level, (node.module or "").split(".")[0]) for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)}
        assert not imported & forbidden[folder], (module, imported)
