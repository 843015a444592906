"""The layouts wing's registry: every layout of kvnumba declares what the package reads of it, and a layout
declared elsewhere (here, in this test module) is found by its name by ``view_class``, ``kv.convert`` and
``kv.copy``: a layout is one module plus its tests."""
import typing

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import layouts, reference
from kvnumba.convert import LayoutName, UnifiedArg
from kvnumba.kernels import layouts as kernel_layouts
from kvnumba.kernels.layouts import LayoutParts
from kvnumba.layouts.base import CacheView
from kvnumba.remote.sides import find_parts
from kvnumba.testing import device_array, to_numpy
from tests.helpers.view_cases import LAYOUTS, make_view


@pytest.mark.parametrize("cls", layouts.BUILT_IN, ids=lambda c: c.__name__)
def test_every_layout_declares_everything(cls):
    assert cls.built_in and cls.__module__.startswith("kvnumba.layouts.") and cls.__doc__
    assert getattr(kv, cls.__name__) is cls  # a public name, kv.<Class>
    names = [n for n in (cls.name, cls.short_name) if n]
    for name in names:  # found by name and short name, in any case; given back by its name
        assert layouts.NAMES[name] is cls and layouts.view_class(name.upper().replace("_", "-")) is cls
    assert layouts.view_name(cls) == cls.name
    assert cls.shape is not CacheView.shape  # its geometry from a buffer's shape
    assert cls.logical is not CacheView.logical or cls.layer_items is not CacheView.layer_items  # its NumPy picture
    assert isinstance(cls.parts, LayoutParts)  # its address parts, compiled by the kernels
    assert cls.parts_named(cls.parts.name) is cls.parts and find_parts(cls.parts.name) is cls.parts  # an export's
    assert cls.stages() is not cls.raw_tables  # the staged remote route: all but raw address tables
    if cls.whole_tensor or cls.kv_pool:  # kv.convert's: a shape per geometry, and that shape read back
        shape = cls.buffer_shape(3, 8, 4, (2, 16))
        view = layouts.picture(cls, np.zeros(shape, np.uint16))
        g = view.geometry
        assert (g.layers, g.tokens, g.heads, g.item_bytes) == (3, 8, 2, 64)
        items = view.layer_items("k", 2)  # [T/P, P, *item] (a pool: item (G, H/G, D))
        assert items.shape[:2] == (8 // g.page_size, g.page_size) and items[0, 0].size == 2 * 16


def test_the_registry_is_in_declaration_order_and_the_names_unique():
    assert list(layouts.registered()) == list(layouts.BUILT_IN)
    assert len(layouts.NAMES) == sum(1 + bool(c.short_name) for c in layouts.BUILT_IN)
    with pytest.raises(TypeError, match="^Other: the layout name 'page_first' is PageFirst's$"):
        type("Other", (CacheView,), {"name": "page_first"})
    assert layouts.NAMES["page_first"] is kv.PageFirst


def test_the_tests_cover_every_layout():
    """Every layout but raw tables is in the tests' table of views (tests/helpers/view_cases.py), and so in
    every pair kv.copy, the copy engine and kvnumba.remote are tested with."""
    rng = np.random.default_rng(0)
    covered = {type(make_view(name, 2, 8, 4, 2, 4, rng, False, False)[1]) for name in LAYOUTS}
    assert {c for c in layouts.BUILT_IN if not c.raw_tables} <= covered


def test_convert_s_type_names_are_registered_names():
    """A type checker cannot read the registry: ``LayoutName``'s names are kept to it here."""
    for name in typing.get_args(LayoutName):
        assert layouts.view_class(name).whole_tensor
    unified = [a for a in typing.get_args(UnifiedArg) if typing.get_origin(a) is typing.Literal]
    for name in [n for a in unified for n in typing.get_args(a)]:
        assert layouts.view_class(name).kv_pool


# --- a layout declared in a test module --------------------------------------------------------------

@pytest.fixture
def slot_major():
    """``[L, P, T/P, *item]``: in each layer, slot-major (every page's slot 0, then slot 1, ...), declared
    as a kvnumba layout is: a name, three address functions, its shapes and picture. Forgotten after."""

    class SlotMajor(CacheView):
        name, short_name = "slot_major", "sm"
        paged = True

        layer_base = staticmethod(kernel_layouts.layer_first_layer_base)  # layout_dim: the bytes of one layer
        head_stride = staticmethod(kernel_layouts.item_head_stride)  # a token's heads side by side

        @staticmethod
        def token_offset(token, layout_dim, item_size, heads, page_size):
            return token % page_size * (layout_dim // page_size) + token // page_size * item_size

        def shape(self, buffer):
            shape, itemsize, dtype = self.array(buffer)
            if len(shape) != 5:
                raise ValueError(f"SlotMajor: a buffer is [L, P, T/P, H, D], got {shape}")
            layers, page, pages, heads, dim = shape
            item = heads * dim * itemsize
            return kv.Geometry(layers, pages * page, page, heads, item, pages * page * item, dtype)

        @classmethod
        def buffer_shape(cls, layers, tokens, page_size, item):
            return (layers, page_size, tokens // page_size, *item)

        def logical(self, buffer):
            return np.swapaxes(buffer, 1, 2)  # [L, T/P, P, H, D]

    yield SlotMajor
    for name in ("slot_major", "sm"):
        del layouts.NAMES[name]


def test_a_layout_declared_elsewhere_is_found_by_its_name(slot_major):
    assert layouts.view_class("slot_major") is layouts.view_class("SM") is slot_major
    assert layouts.view_name(slot_major) == "slot_major" and slot_major in layouts.registered()
    assert slot_major.user_layout and not slot_major.built_in  # not kvnumba's: its arithmetic is checked
    assert slot_major.stages()  # kvnumba.remote stages it by its buffer_shape
    with pytest.raises(ValueError, match=r"expected one of .*page_unified \(pu\), slot_major \(sm\), or module:Class"):
        kv.convert(np.zeros((2, 8, 2, 4)), "lf", "slot_mayor", 4)


def test_a_layout_declared_elsewhere_converts_and_copies(slot_major):
    rng = np.random.default_rng(1)
    L, T, P, H, D = 2, 8, 4, 2, 8
    k_lf = rng.integers(0, 2**16, (L, T, H, D), dtype=np.uint16)
    k_sm = kv.convert(k_lf, "lf", "slot_major", P)
    assert np.array_equal(k_sm, np.swapaxes(k_lf.reshape(L, T // P, P, H, D), 1, 2))
    assert np.array_equal(kv.convert(k_sm, "sm", "layer_first", P), k_lf)
    v_lf = rng.integers(0, 2**16, (L, T, H, D), dtype=np.uint16)
    src, dst = rng.permutation(T)[:5].astype(np.int64), rng.permutation(T)[:5].astype(np.int64)
    got = slot_major(device_array(np.zeros_like(k_sm)), device_array(np.zeros_like(k_sm)))  # GPU memory on a GPU
    kv.copy(kv.LayerFirst(device_array(k_lf), device_array(v_lf)), got, src, dst, block_quota=1, num_warps_per_block=1)
    want = slot_major(np.zeros_like(k_sm), np.zeros_like(k_sm))
    reference.copy(kv.LayerFirst(k_lf, v_lf), want, src, dst)
    got_k, got_v = to_numpy(got.k), to_numpy(got.v)
    assert np.array_equal(got_k, want.k) and np.array_equal(got_v, want.v) and got_k.any()


def test_a_layout_declared_elsewhere_is_forgotten_after_its_tests():
    with pytest.raises(ValueError, match="unknown layout 'slot_major'"):
        layouts.view_class("slot_major")
