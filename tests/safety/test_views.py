"""Cache views never let ``kv.copy`` write where it must not.

One table per way a view could go wrong. Every buffer is one allocation with guard bytes on
both sides (``guarded.Guarded``); destinations start poisoned. Each case asserts the error and its
message, or the exact result against ``kvnumba.reference``, and that no byte outside the bytes the
copy moves changed: guards, untouched destination bytes, and memory freed or replaced meanwhile.

- Per-layer lists must agree across every layer, K and V (dtype, item bytes, shape).
- A view owns the per-layer list it was given: replacing an element of the caller's list later
   changes nothing the view writes.
- A buffer a view holds that is given new memory in place (torch ``resize_``, ``set_``, ``.data =``,
   its storage resized) is refused at the next ``kv.copy`` that would use it; NumPy arrays cannot be
   resized while a view holds them.
- A user layout's address arithmetic is checked where the kernel reaches: whole items from each
   token's start, K and V each against its own bytes, every layer and token (not only the ends).

The same file runs on the simulator (NumPy arrays and CPU torch tensors) and on a GPU;
``tests/safety/test_gpu_views.py`` adds what only a GPU shows (caching allocators reusing freed
blocks, pinned memory).
"""
import gc
import re

import numpy as np
import pytest

import kvnumba as kv
from tests.helpers.guarded import POISON, Guarded, all_intact, guarded_view
from kvnumba import reference
from kvnumba.driver.target import SIMULATOR
from tests.helpers.view_cases import HeadMajorPages

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 3, 16, 4, 2, 8  # int16: items of 32 bytes, heads of 16
IDX_SRC = np.array([1, 7, 12, 15], np.int64)
IDX_DST = np.array([0, 8, 9, 15], np.int64)
LIST_LAYOUTS = ["LayerFirstList", "VllmFlashAttn", "FlashInferNHD", "FlashInferHND"]


def _copy(src, dst, layers=None, src_indices=IDX_SRC, dst_indices=IDX_DST):
    """``kv.copy`` at one warp: a few dozen simulated threads."""
    kv.copy(src, dst, src_indices, dst_indices, layers, block_quota=1, num_warps_per_block=1)


def _copy_and_compare(src, src_np, dst, dst_np, guards, layers=None):
    """``kv.copy`` and the reference on the twins: every destination byte as the reference's, guards kept."""
    _copy(src, dst, layers)
    reference.copy(src_np, dst_np, IDX_SRC, IDX_DST, layers)
    assert all_intact(guards)


def _twin_bytes(view_np):
    """A NumPy twin's buffers as bytes, in the order ``guarded_view`` made their Guarded."""
    if view_np.v is view_np.k:  # vLLM/FlashInfer: K and V share each layer's array
        return [np.asarray(c).view(np.uint8).reshape(-1) for c in view_np.k]
    out = []
    for which in ("k", "v"):
        side = getattr(view_np, which)
        for b in side if isinstance(side, tuple) else [side]:
            out.append(np.asarray(b).view(np.uint8).reshape(-1))
    return out


def _dst_bytes_equal(dst_guards, dst_np, skip=None):
    """The destination's bytes, buffer by buffer, equal the reference twin's (but ``skip``'s)."""
    for g, twin in zip(dst_guards, _twin_bytes(dst_np)):
        if g.array is not skip:
            np.testing.assert_array_equal(g.middle(), twin)
            assert g.intact()


# --- per-layer lists agree across every layer, K and V ---------------------------------------------

def _mismatched(kind, shape):
    """A layer that differs from the others in one way, filled with POISON."""
    if kind == "dtype":  # same shape and bytes, another dtype
        return np.full(shape, POISON * 257, np.uint16)
    if kind == "itemsize":  # same shape, half the bytes: the kernel would write past its end
        return np.full(shape, POISON, np.uint8)
    return np.full((shape[0] - 1, *shape[1:]), POISON * 257, np.uint16).view(np.int16)  # one block (token) fewer


CLASS1 = [  # (layout, list argument, which layer differs, how, error, message)
    (name, arg, where, kind, TypeError if kind != "shape" else ValueError,
     rf"{arg}\[{where}\] (is (uint16|uint8)|has the shape)")
    for name, args in (("LayerFirstList", ("k", "v")), ("VllmFlashAttn", ("caches",)),
                       ("FlashInferNHD", ("caches",)), ("FlashInferHND", ("caches",)))
    for arg in args for where in (1, L - 1) for kind in ("dtype", "itemsize", "shape")
]


@pytest.mark.parametrize("name,arg,where,kind,error,match", CLASS1)
def test_class1_per_layer_lists_must_agree_on_every_layer(name, arg, where, kind, error, match):
    src, _, src_guards = guarded_view("PageFirst", L, T, P, H, D, poison=False)
    good, _, guards = guarded_view(name, L, T, P, H, D)
    lists = {"caches": list(good.k)} if arg == "caches" else {"k": list(good.k), "v": list(good.v)}
    bad = _mismatched(kind, lists[arg][0].shape)
    lists[arg][where] = bad
    make = type(good)
    with pytest.raises(error, match=match):
        view = make(lists["caches"], **good._options()) if arg == "caches" else make(lists["k"], lists["v"])
        _copy(src, view)
    assert (bad.view(np.uint8) == POISON).all()
    assert all(g.untouched() for g in guards) and all_intact(guards + src_guards)


def test_class1_k_and_v_lists_must_agree():
    k = [np.zeros((T, H, D), np.int16) for _ in range(L)]
    v = [np.zeros((T, H, D), np.uint16) for _ in range(L)]
    with pytest.raises(TypeError, match=r"LayerFirst: v is uint16 but k is int16"):
        kv.LayerFirst(k, v)
    with pytest.raises(TypeError, match=r"k and v must both be lists of per-layer arrays, or both arrays"):
        kv.LayerFirst(k, np.zeros((L, T, H, D), np.int16))


# --- a view owns the list it was given ---------------------------------------------------------

@pytest.mark.parametrize("side", ["src", "dst"])
@pytest.mark.parametrize("where", [0, L - 1])
@pytest.mark.parametrize("name", LIST_LAYOUTS)
def test_class3_replacing_an_element_of_the_callers_list_changes_nothing(name, where, side):
    src_name, dst_name = (name, "PageFirst") if side == "src" else ("PageFirst", name)
    src, src_np, src_guards = guarded_view(src_name, L, T, P, H, D, poison=False, seed=1)
    dst, dst_np, dst_guards = guarded_view(dst_name, L, T, P, H, D, seed=2)
    view, view_guards = (src, src_guards) if side == "src" else (dst, dst_guards)
    lists = [list(view.k)] if view.v is view.k else [list(view.k), list(view.v)]
    make = type(view)
    rebuilt = make(lists[0], **view._options()) if view.v is view.k else make(lists[0], lists[1])
    # The caller replaces an element of its lists and drops the old array; new arrays may take its memory.
    replacements = []
    for listed in lists:
        replacements.append(Guarded(listed[where].shape))
        listed[where] = replacements[-1].array
    del view
    gc.collect()
    reuse = [Guarded(replacements[0].shape) for _ in range(4)]
    if side == "src":
        _copy_and_compare(rebuilt, src_np, dst, dst_np, src_guards + dst_guards)
    else:
        _copy_and_compare(src, src_np, rebuilt, dst_np, src_guards + dst_guards)
    _dst_bytes_equal(dst_guards, dst_np)
    assert all(g.untouched() and g.intact() for g in replacements + reuse)


def test_class3_a_view_keeps_a_tuple():
    k = [np.zeros((T, H, D), np.int16) for _ in range(L)]
    view = kv.LayerFirst(k, [a.copy() for a in k])
    caches = [np.zeros((2, T // P, P, H, D), np.int16) for _ in range(L)]
    vllm = kv.VllmFlashAttn(caches)
    assert type(view.k) is tuple and type(view.v) is tuple and type(vllm.caches) is tuple
    k[0], caches[0] = None, None
    assert view.k[0] is not None and vllm.caches[0] is not None


# --- buffers given new memory in place --------------------------------------------------------

def _resize_grow(t):
    t.resize_(t.numel() * 4)


def _resize_shrink(t):
    t.resize_(t.numel() // 2)


def _set_smaller(t):
    import torch

    t.set_(torch.zeros(t.numel() // 2, dtype=t.dtype, device=t.device))


def _set_same_size(t):
    import torch

    t.set_(torch.zeros_like(t))


def _data_smaller(t):
    import torch

    t.data = torch.zeros(t.numel() // 2, dtype=t.dtype, device=t.device)


def _storage_freed(t):
    t.untyped_storage().resize_(0)


MUTATIONS = {"resize_grow": _resize_grow, "resize_shrink": _resize_shrink, "set_smaller": _set_smaller,
             "set_same_size": _set_same_size, "data_smaller": _data_smaller, "storage_freed": _storage_freed}

# (source layout, destination layout, which view changes, which of its buffers: label, (list index, layer))
CLASS4 = [
    ("PageFirst", "VllmFlashAttn", "dst", "caches[1]", 1),
    ("PageFirst", "FlashInferHND", "dst", "caches[2]", 2),
    ("VllmFlashAttn", "PageFirst", "src", "caches[0]", 0),
    ("PageFirst", "LayerFirstList", "dst", "v[1]", 1),
    ("LayerFirstList", "PageHead", "src", "k[2]", 2),
    ("PageFirst", "PageFirstDirect", "dst", "v", None),
    ("PageHead", "LayerFirst", "src", "k", None),
]


def _buffer(view, label):
    which = label[0] if not label.startswith("caches") else "caches"
    if "[" in label:
        index = int(label[label.index("[") + 1:-1])
        return (view.caches if which == "caches" else getattr(view, which))[index]
    return getattr(view, which)


@pytest.mark.parametrize("warm", [False, True], ids=["first_call", "cached_plan"])
@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("src_name,dst_name,side,label,layer", CLASS4)
def test_class4_a_torch_buffer_changed_in_place_is_refused(src_name, dst_name, side, label, layer, mutation, warm):
    pytest.importorskip("torch")
    src, src_np, src_guards = guarded_view(src_name, L, T, P, H, D, "torch", poison=False, seed=3)
    dst, dst_np, dst_guards = guarded_view(dst_name, L, T, P, H, D, "torch", seed=4)
    if warm:  # a cached plan holds the old addresses
        _copy(src, dst)
        reference.copy(src_np, dst_np, IDX_SRC, IDX_DST)
    before = [g.middle().copy() for g in src_guards + dst_guards]
    view = src if side == "src" else dst
    tensor = _buffer(view, label)
    old_bytes = tensor.nbytes
    MUTATIONS[mutation](tensor)
    reuse = [Guarded((old_bytes // 2,), "torch") for _ in range(4)]  # may take the freed memory
    name = f"{side}_view"
    for layers in (None, layer) if layer is not None else (None, 0):
        with pytest.raises(ValueError, match=rf"{name} \(.*\) changed in place since it was made .*{re.escape(label)}"
                                             r", a torch tensor, is now \d+ bytes"):
            _copy(src, dst, layers)
    assert all(g.untouched() and g.intact() for g in reuse)
    for g, was in zip(src_guards + dst_guards, before):  # nothing written, in any buffer
        if g.array is not tensor:
            np.testing.assert_array_equal(g.middle(), was)
            assert g.intact()
    # The view's other layers still copy, exactly, and the changed buffer is left alone.
    if layer is not None:
        other = (layer + 1) % L
        _copy(src, dst, other)
        reference.copy(src_np, dst_np, IDX_SRC, IDX_DST, other)
        _dst_bytes_equal(dst_guards, dst_np, skip=tensor)
    # A new view over the buffers as they are now (same shapes) copies again.
    if mutation == "set_same_size":
        fresh = view.like(*_buffers_of(view))
        _copy(*((fresh, dst) if side == "src" else (src, fresh)))


def _buffers_of(view):
    if view.v is view.k:
        return (list(view.k),)
    return (list(view.k) if isinstance(view.k, tuple) else view.k,
            list(view.v) if isinstance(view.v, tuple) else view.v)


def _owner(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays are device memory only on the simulator")
@pytest.mark.parametrize("factor", [4, 0.5], ids=["grow", "shrink"])
@pytest.mark.parametrize("side", ["src", "dst"])
@pytest.mark.parametrize("name", ["PageFirst", "LayerFirstList", "VllmFlashAttn", "FlashInferNHD", "PageHead"])
def test_class4_numpy_cannot_resize_what_a_view_holds(name, side, factor):
    """NumPy refuses to resize an array that has a weak reference, even with refcheck=False: a view keeps
    one to the array that owns each buffer's memory (here the guarded allocation each buffer is a view
    of). Resizing it would free the memory under the buffer."""
    src_name, dst_name = (name, "PageFirst") if side == "src" else ("PageFirst", name)
    src, src_np, src_guards = guarded_view(src_name, L, T, P, H, D, poison=False, seed=5)
    dst, dst_np, dst_guards = guarded_view(dst_name, L, T, P, H, D, seed=6)
    _copy(src, dst)
    reference.copy(src_np, dst_np, IDX_SRC, IDX_DST)
    view = src if side == "src" else dst
    buffer = view.k[-1] if isinstance(view.k, tuple) else view.v
    owner = _owner(buffer)
    assert owner is not buffer and owner.flags.owndata
    with pytest.raises(ValueError, match=r"cannot resize an array that references or is referenced"):
        owner.resize(int(owner.size * factor), refcheck=False)
    _copy_and_compare(src, src_np, dst, dst_np, src_guards + dst_guards)
    _dst_bytes_equal(dst_guards, dst_np)


@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays are device memory only on the simulator")
def test_class4_an_array_that_owns_its_memory_cannot_be_resized_either():
    k, v = np.zeros((T, L, H, D), np.int16), np.zeros((T, L, H, D), np.int16)
    view = kv.PageFirst(k, v)
    for array in (k, v):
        with pytest.raises(ValueError, match=r"cannot resize an array that references or is referenced"):
            array.resize(4 * array.size, refcheck=False)
    view.check_unchanged("src_view")


def test_class4_check_unchanged_is_one_call_the_prepared_path_can_use():
    torch = pytest.importorskip("torch")
    caches = [torch.zeros((2, T // P, P, H, D), dtype=torch.int16) for _ in range(L)]
    view = kv.VllmFlashAttn(caches)
    view.check_unchanged("dst_view")
    view.check_unchanged("dst_view", 1)
    caches[2].resize_(4)
    view.check_unchanged("dst_view", 1)  # layer 1 is as it was
    view.check_unchanged("dst_view", range(0, 2))
    for layers in (None, 2, range(1, 3), "junk"):
        with pytest.raises(ValueError, match=r"dst_view \(VllmFlashAttn\(L=3.*caches\[2\], a torch tensor, is now 8 "
                                             r"bytes at 0x[0-9a-f]+ \(1024 bytes at"):
            view.check_unchanged("dst_view", layers)


# --- a user layout's arithmetic, checked where the kernel reaches ---------------------------------

class TokensInRows(kv.CacheView):
    """A user layout whose layers hold tokens back to back, ``item`` bytes each, heads ``item / heads`` bytes
    apart; the layouts below break one part of it on purpose."""

    @staticmethod
    def layer_base(base, layer, layout_dim, item_size, heads, page_size):
        return base + layer * layout_dim

    @staticmethod
    def token_offset(token, layout_dim, item_size, heads, page_size):
        return token * item_size

    @staticmethod
    def head_stride(layout_dim, item_size, heads, page_size):
        return item_size // heads


class HeadsAdjacent(TokensInRows):
    """``[L, bytes]``: tokens of ``item`` bytes back to back, heads adjacent (head_split False), with a
    short last token: room for one head of it only. Its head_stride is 0 (a bug the old check, which
    looked at ``item / heads`` bytes from each head's start, let through)."""

    @staticmethod
    def head_stride(layout_dim, item_size, heads, page_size):
        return 0

    def shape(self, buffer):
        (layers, elements), itemsize, dtype = self.array(buffer)
        return kv.Geometry(layers, T, 1, H, H * D * itemsize, elements * itemsize, dtype)

    def logical(self, buffer):
        raise TypeError("not needed")


class GivenTokens(HeadMajorPages):
    """``HeadMajorPages`` whose token count is given, as a raw layout's is: a V with fewer pages than K
    has the same geometry (the old check tested K's bytes only)."""

    def shape(self, buffer):
        g = super().shape(buffer)
        return kv.Geometry(g.layers, T, g.page_size, g.heads, g.item_bytes, T * g.item_bytes, g.dtype)


def _arith(token_offset, base=HeadMajorPages):
    return type("Custom", (base,), {"token_offset": staticmethod(token_offset)})


def _non_affine(token, layout_dim, item_size, heads, page_size):
    # In bounds at tokens 0, P - 1, P and T - 1 (all the old check looked at); 16 tokens too far at token 2.
    return (token // page_size * page_size * item_size + token % page_size * (item_size // heads)
            + (token % 5 == 2) * T * item_size)


def _branchy(token, layout_dim, item_size, heads, page_size):
    if token == 6:  # NumPy cannot take this branch over an array: checked token by token
        return 1 << 20
    return token // page_size * page_size * item_size + token % page_size * (item_size // heads)


def _misaligned(token, layout_dim, item_size, heads, page_size):  # inside the buffer, 4 bytes off for token > 0
    return token // page_size * page_size * item_size + token % page_size * (item_size // heads) - 4 * (token > 0)


def _float(token, layout_dim, item_size, heads, page_size):
    return token // page_size * page_size * item_size + token % page_size * (item_size / heads)


def _raises(token, layout_dim, item_size, heads, page_size):
    raise ZeroDivisionError("a bug")


def _negative(token, layout_dim, item_size, heads, page_size):
    return token // page_size * page_size * item_size + token % page_size * (item_size // heads) - item_size


HMP = (L, T // P, H, P, D)  # HeadMajorPages' buffer shape
CLASS6 = [  # (id, view class, K shape, V shape, error, message)
    ("whole_items_from_each_token", HeadsAdjacent, (L, (T - 1) * H * D + D), (L, (T - 1) * H * D + D), ValueError,
     r"HeadsAdjacent: its address arithmetic puts token 15, layer 2, head 0 at bytes \[\d+, \d+\) outside k "
     r"\(\d+ bytes\), copying whole items of 32 bytes"),
    ("v_smaller_than_k", GivenTokens, HMP, (L, T // P - 1, H, P, D), ValueError,
     r"GivenTokens: its address arithmetic puts token 15, layer 2, head 1 .* outside v \(\d+ bytes\)"),
    ("k_smaller_than_v", GivenTokens, (L, T // P - 1, H, P, D), HMP, ValueError,
     r"GivenTokens: .* outside k \(\d+ bytes\)"),
    ("non_affine", _arith(_non_affine), HMP, HMP, ValueError,
     r"Custom: its address arithmetic puts token \d+, layer 2, head 1 .* outside k"),
    ("non_affine_branch", _arith(_branchy), HMP, HMP, ValueError,
     r"Custom: its address arithmetic puts token 6, layer 2, head 1 .* outside k"),
    ("negative", _arith(_negative), HMP, HMP, ValueError,
     r"Custom: its address arithmetic puts token 0, layer 0, head 0 at bytes \[-32, -16\) outside k"),
    ("misaligned", _arith(_misaligned), HMP, HMP, ValueError,
     r"Custom: its address arithmetic puts items of k off 8-byte boundaries"),
    ("not_integers", _arith(_float), HMP, HMP, TypeError, r"Custom: its token_offset gave .*must give integers"),
    ("raises", _arith(_raises), HMP, HMP, TypeError, r"Custom: its token_offset raised ZeroDivisionError \(a bug\)"),
]


@pytest.mark.parametrize("case", CLASS6, ids=[c[0] for c in CLASS6])
def test_class6_user_layouts_are_checked_where_the_kernel_reaches(case):
    _, layout, k_shape, v_shape, error, match = case
    src, _, src_guards = guarded_view("PageFirst", L, T, P, H, D, poison=False)
    k, v = Guarded(k_shape), Guarded(v_shape)
    with pytest.raises(error, match=match):
        dst = layout(k.array, v.array)
        _copy(src, dst)
    assert k.untouched() and v.untouched() and all_intact([k, v] + src_guards)


class OneHeadPages(TokensInRows):
    """``[L, T, 2 * D]`` items of two heads kept together (not split): paired with a view that splits its
    2 heads, a copy goes head by head and this layout's head_stride is used, with heads=2. Its
    head_stride is wrong (a whole item), which only that copy reaches: checked when the copy is planned."""

    @staticmethod
    def head_stride(layout_dim, item_size, heads, page_size):
        return item_size

    def shape(self, buffer):
        (layers, tokens, dim), itemsize, dtype = self.array(buffer)
        return kv.Geometry(layers, tokens, 1, 2, dim * itemsize, tokens * dim * itemsize, dtype)

    def logical(self, buffer):
        return buffer.reshape(*buffer.shape[:2], 2, -1)


def test_class6_a_user_layout_is_checked_for_the_heads_of_each_copy():
    """A copy goes by the views' heads (kv.copy refuses views whose heads differ): a layout is checked
    for its own heads when it is made, so its wrong head_stride is refused before any copy reaches it."""
    src, src_np, src_guards = guarded_view("PageHead", L, T, P, H, D, poison=False)  # splits 2 heads
    k, v = Guarded((L, T, H * D)), Guarded((L, T, H * D))
    with pytest.raises(ValueError, match=r"OneHeadPages: its address arithmetic puts token 15, layer 2, head 1 at "
                                         r"bytes \[\d+, \d+\) outside k \(\d+ bytes\), copying 2 heads of 16 bytes"):
        dst = OneHeadPages(k.array, v.array)
        _copy(src, dst)
    assert k.untouched() and v.untouched() and all_intact([k, v] + src_guards)


@pytest.mark.parametrize("side", ["src", "dst"])
def test_class6_a_valid_user_layout_copies_exactly_inside_its_guards(side):
    pair = ("HeadMajorPages", "VllmFlashAttn") if side == "src" else ("VllmFlashAttn", "HeadMajorPages")
    src, src_np, src_guards = guarded_view(pair[0], L, T, P, H, D, poison=False, seed=7)
    dst, dst_np, dst_guards = guarded_view(pair[1], L, T, P, H, D, seed=8)
    _copy_and_compare(src, src_np, dst, dst_np, src_guards + dst_guards)
    _dst_bytes_equal(dst_guards, dst_np)


def test_class6_a_per_layer_user_layout_must_use_tables():
    class PerLayer(HeadMajorPages):
        per_layer = True

    with pytest.raises(TypeError, match=r"PerLayer: a layout with its own address arithmetic takes one buffer"):
        PerLayer(np.zeros(HMP, np.int16), np.zeros(HMP, np.int16))


# --- geometries and layouts that cannot be used: clear errors, not ZeroDivisionError/NotImplementedError

class Flat(TokensInRows):
    """``[L, T, D]`` items; ``shape`` reports the geometry given to the class (to break one field)."""

    fields: dict = {}

    def shape(self, buffer):
        (layers, tokens, dim), itemsize, dtype = self.array(buffer)
        given = dict(layers=layers, tokens=tokens, page_size=1, heads=1, item_bytes=dim * itemsize,
                     layout_dim=tokens * dim * itemsize, dtype=dtype)
        return kv.Geometry(**{**given, **self.fields})

    def logical(self, buffer):
        return buffer[:, :, None]


GEOMETRIES = [
    (dict(heads=0), ValueError, r"Geometry: heads must be >= 1, got 0"),
    (dict(page_size=0), ValueError, r"Geometry: page_size must be >= 1, got 0"),
    (dict(tokens=-1), ValueError, r"Geometry: tokens must be >= 0, got -1"),
    (dict(layout_dim=-8), ValueError, r"Geometry: layout_dim must be >= 0, got -8"),
    (dict(heads=3), ValueError, r"Geometry: item_bytes=\d+ is not a whole number of bytes per head for heads=3"),
    (dict(heads=2.0), TypeError, r"Geometry: heads must be an integer, got float"),
    (dict(layers=True), TypeError, r"Geometry: layers must be an integer, got bool"),
]


@pytest.mark.parametrize("fields,error,match", GEOMETRIES)
def test_a_geometry_that_cannot_be_copied_is_a_clear_error(fields, error, match):
    layout = type("Broken", (Flat,), {"fields": fields})
    k = Guarded((L, T, 2 * D))
    with pytest.raises(error, match=match):
        layout(k.array)
    with pytest.raises(error, match=match):
        kv.convert(np.zeros((L, T, 2 * D), np.int16), layout, "layer_first")
    assert k.untouched() and k.intact()


def test_converting_to_a_layout_without_buffer_shape_is_a_type_error():
    with pytest.raises(TypeError, match=r"Flat defines no buffer_shape: it cannot be kv.convert's destination"):
        kv.convert(np.zeros((L, T, 2, D), np.int16), "layer_first", Flat)


def test_a_view_class_without_shape_or_logical_is_a_type_error():
    class Bare(kv.CacheView):
        layer_base, token_offset, head_stride = Flat.layer_base, Flat.token_offset, Flat.head_stride

    with pytest.raises(TypeError, match=r"Bare defines no shape\(buffer\)"):
        Bare(np.zeros((L, T, D), np.int16))
    with pytest.raises(TypeError, match=r"Flat defines no logical|Bare defines no logical"):
        kv.CacheView.logical(Bare.__new__(Bare), None)
