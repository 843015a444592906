"""kv.copy with ``kv.Nvfp4View``: bfloat16/float16 views of several layouts quantised into vLLM's NVFP4 pages (NHD
and HND), pages dequantised into them, and pages copied across orders and block sizes, against
``kvnumba.quant_reference.copy`` byte for byte with destinations poisoned (untouched bytes stay); one token, the
last page, float16, index errors before anything is written, and bad views named. Small launches: the
simulator runs a Python thread per CUDA thread."""
import ml_dtypes
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba import quant_reference as qr
from kvnumba.api.transfer import plain as plain_transfer
from kvnumba.plan.nvfp4_plan import Nvfp4Plan
from kvnumba.quant import nvfp4 as q
from tests.helpers.placement import PLACE, to_numpy
from tests.helpers.view_cases import make_view, view_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 64  # 8 tokens in pages of 4; 2 heads of 64 elements
POISON = 0xAB


def make_nvfp4(L=L, T=T, P=P, H=H, D=D, layout="NHD", rng=None, scales=(0.5, 2.0), dtype="bfloat16", **options):
    """``(numpy Nvfp4View, placed Nvfp4View)`` over the same bytes: poisoned, or random with ``rng`` (every code;
    scale bytes below 0x7F, NaN's code, but a few)."""
    physical = (T // P, 2, P, H, q.full_dim(D)) if layout == "NHD" else (T // P, 2, H, P, q.full_dim(D))
    arrays = []
    for _ in range(L):
        if rng is None:
            a = np.full(physical, POISON, np.uint8)
        else:
            a = rng.integers(0, 256, physical, dtype=np.uint8)
            for region in q.regions(a if layout == "NHD" else np.swapaxes(a, 2, 3), H, P, D, layout)[1:]:
                region[...] = rng.integers(0, 0x7F, region.shape) | (rng.random(region.shape) < 0.02) * 0x7F
        arrays.append(a)

    def view(arrays):
        caches = [a if layout == "NHD" else np.swapaxes(a, 2, 3) for a in arrays]
        return kv.Nvfp4View(caches, *scales, layout=layout, dtype=dtype, **options)

    return view(arrays), view([PLACE["host"](a) for a in arrays])


def nvfp4_bytes(view):
    return [to_numpy(a).reshape(-1) for a in view.raw]


def finite(values):
    """Random normal bfloat16 bits: no NaN or infinity (random bits make most 16-element blocks NaN's)."""
    values[...] = (values.astype(np.float64) / 2**15 - 1).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def fill(placed, values):
    """Write ``values`` into a placed buffer: a GPU array by a copy to the device (``np.asarray`` of one is a host
    copy, which a write would leave behind), a NumPy one (the simulator's) in place."""
    if hasattr(placed, "copy_to_device"):
        placed.copy_to_device(values)
    elif type(placed).__module__.startswith("torch"):
        import torch

        placed.copy_(torch.from_numpy(values))
    else:
        np.asarray(placed)[...] = values


def finite_view(plain_name, rng, layers=L):
    """``(numpy view, placed view)`` of ``plain_name`` over the same random finite bfloat16 values."""
    view_np, view = make_view(plain_name, layers, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    for which in ("k", "v"):
        for values, placed in zip(view_np.buffers(which), view.buffers(which)):
            finite(values)
            fill(placed, values)
    return view_np, view


def quantise_case(plain_name, layout, *, count=3, seed=0, dtype="bfloat16", specials=False, tokens=None):
    rng = np.random.default_rng(seed)
    if specials:
        src_np, src = make_view(plain_name, L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    else:
        src_np, src = finite_view(plain_name, rng)
    dst_np, dst = make_nvfp4(layout=layout, dtype=dtype)
    si, di = tokens or (rng.choice(T, count, replace=False).astype(np.int64),
                        rng.choice(T, count, replace=False).astype(np.int64))
    kv.copy(src, dst, PLACE["device"](si), PLACE["device"](di), block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di)
    moved = 0
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"{plain_name} -> NVFP4 {layout}")
        moved += int((want != POISON).sum())
    assert moved > 0


@pytest.mark.parametrize("plain_name, layout", [("LayerFirstList", "NHD"), ("PageFirst", "HND"), ("FlashInferHND", "NHD"),
                                                ("PageHead", "HND")])
def test_quantising_matches_the_reference(plain_name, layout):
    quantise_case(plain_name, layout)


def test_quantising_bit_patterns_nans_and_infinities_included():
    quantise_case("LayerFirst", "NHD", specials=True, seed=1)


@pytest.mark.parametrize("specials", [False, True])
def test_quantising_float16(specials):
    """float16 elements (subnormals among them) widen by their own rule, in the packed path and the exact one."""
    quantise_case("PageFirst", "HND", dtype="float16", specials=specials, seed=10)


def test_one_token_into_the_last_slot_of_the_last_page():
    quantise_case("PageFirst", "HND", tokens=(np.array([2], np.int64), np.array([T - 1], np.int64)))


@pytest.mark.parametrize("plain_name, layout, dtype", [("LayerFirstList", "HND", "bfloat16"), ("PageFirst", "NHD", "float16"),
                                                       ("FlashInferNHD", "HND", "bfloat16")])
def test_dequantising_matches_the_reference(plain_name, layout, dtype):
    rng = np.random.default_rng(2)
    src_np, src = make_nvfp4(layout=layout, rng=rng, dtype=dtype)
    dst_np, dst = make_view(plain_name, L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = rng.choice(T, 3, replace=False).astype(np.int64), rng.choice(T, 3, replace=False).astype(np.int64)
    kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"NVFP4 {layout} -> {plain_name}")


@pytest.mark.parametrize("src_layout, dst_layout, dst_page", [("NHD", "HND", 4), ("HND", "NHD", 8), ("HND", "HND", 4)])
def test_pages_to_pages_across_orders_and_block_sizes(src_layout, dst_layout, dst_page):
    rng = np.random.default_rng(3)
    src_np, src = make_nvfp4(layout=src_layout, rng=rng)
    dst_np, dst = make_nvfp4(P=dst_page, layout=dst_layout)
    si, di = rng.choice(T, 4, replace=False).astype(np.int64), rng.choice(T, 4, replace=False).astype(np.int64)
    kv.copy(src, dst, si, di, layers=range(1, 2), block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di, range(1, 2))
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
    assert (nvfp4_bytes(dst)[0] == POISON).all()  # layer 0 untouched


def test_a_round_trip_through_nvfp4_pages_is_the_references():
    rng = np.random.default_rng(4)
    src_np, src = finite_view("LayerFirst", rng)
    _, pages = make_nvfp4()
    back_np, back = make_view("PageFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    idx = np.arange(T, dtype=np.int64)
    kv.copy(src, pages, idx, idx)
    kv.copy(pages, back, idx, idx)
    for which in ("k", "v"):
        want = q.dequantise(*q.quantise(src_np.buffers(which)[0].reshape(L, T, H, D).view(np.uint16), 0.5 if which == "k" else 2.0,
                                        "bfloat16"), 0.5 if which == "k" else 2.0)
        got = to_numpy(back.buffers(which)[0]).reshape(T, L, H, D).transpose(1, 0, 2, 3)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_out_of_range_host_indices_are_refused_before_anything_is_written():
    rng = np.random.default_rng(5)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_nvfp4()
    with pytest.raises(kv.IndexOutOfRangeError, match="dst_indices"):
        kv.copy(src, dst, np.array([0, 1], np.int64), np.array([0, T], np.int64))
    assert all((b == POISON).all() for b in nvfp4_bytes(dst))


def test_its_plan_is_cached_with_every_copy_and_cleared_with_them():
    rng = np.random.default_rng(6)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, dst = make_nvfp4()
    idx = np.arange(2, dtype=np.int64)
    kv.copy(src, dst, idx, idx)
    cached = plain_transfer("copy")._cache.entries
    assert any(isinstance(entry.plan, Nvfp4Plan) for entry in cached.values())
    kv.clear_plan_caches()
    assert not cached


def test_bad_views_and_copies_are_named():
    rng = np.random.default_rng(7)
    cache = np.zeros((2, 2, P, H, q.full_dim(D)), np.uint8)
    with pytest.raises(ValueError, match="v_scales_swizzled"):
        kv.Nvfp4View([cache], v_scales_swizzled=True)
    with pytest.raises(TypeError, match="caches\\[0\\] must be uint8"):
        kv.Nvfp4View([cache.view(np.int8)])
    with pytest.raises(ValueError, match="D a multiple of 64"):
        kv.Nvfp4View([np.zeros((2, 2, P, H, q.full_dim(32)), np.uint8)])
    with pytest.raises(ValueError, match="caches\\[1\\] has the shape"):
        kv.Nvfp4View([cache, cache[:1]])
    with pytest.raises(ValueError, match="neither NHD's"):
        kv.Nvfp4View([np.zeros((2, 2, H, P, q.full_dim(D)), np.uint8).transpose(0, 2, 1, 3, 4)])
    with pytest.raises(ValueError, match="layout='HND' but the strides"):
        kv.Nvfp4View([cache], layout="HND")
    with pytest.raises(ValueError, match="k_scale must be a finite"):
        kv.Nvfp4View([cache], 0.0)
    with pytest.raises(TypeError, match="v_scale must be a float or a one-element array"):
        kv.Nvfp4View([cache], 1.0, np.ones(2, np.float32))
    _, plain = make_view("LayerFirst", 1, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    _, one_head = make_view("LayerFirst", 1, T, P, 1, 2 * D, rng, poison=False, mla=False, place=("device", "numba"))
    _, pages = make_nvfp4(L=1, dtype="bfloat16")
    _, other = make_nvfp4(L=1, scales=(1.0, 1.0))
    idx = np.arange(2, dtype=np.int64)
    with pytest.raises(ValueError, match="dst_view has items of 1 heads"):
        kv.copy(pages, one_head, idx, idx)
    with pytest.raises(ValueError, match="global scales differ"):
        kv.copy(pages, other, idx, idx)
    with pytest.raises(ValueError, match="route='copy_engine' cannot quantise"):
        kv.copy(plain, pages, idx, idx, route="copy_engine")
    assert all((b == POISON).all() for b in nvfp4_bytes(pages) + nvfp4_bytes(other))


def test_ties_signed_zeros_nans_and_infinities_through_the_kernel():
    """Values on e2m1's grid and at its ties, -0, and groups holding NaN, ±inf, all zeros or all NaN: the kernel's
    codes and scales are the reference's."""
    rng = np.random.default_rng(8)
    pattern = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.0, -0.25, -2.5, -5, 0.5, 1, 3, 4], np.float32)
    values = np.resize(pattern, (L, T, H, D)) * np.float32(2.0) ** rng.integers(-3, 4, (L, T, H, D // 16, 1)).repeat(
        16, -1).reshape(L, T, H, D)
    values[0, 0, 0, :16] = np.nan
    values[0, 1, 0, 3] = np.nan
    values[0, 2, 1, 5], values[0, 2, 1, 20] = np.inf, -np.inf
    values[1, 3, 0, 16:32] = 0
    bits = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    src_np = kv.LayerFirst(bits, bits.copy())
    src = kv.LayerFirst(PLACE["device"](bits), PLACE["device"](bits.copy()))
    dst_np, dst = make_nvfp4()
    idx = np.arange(4, dtype=np.int64)
    kv.copy(src, dst, idx, idx[::-1].copy(), block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, idx, idx[::-1].copy())
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_a_prepared_copy_writes_what_kv_copy_writes():
    rng = np.random.default_rng(9)
    src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_nvfp4()
    call = kv.prepare("copy", src_view=src, dst_view=dst)
    idx = np.array([1, 6], np.int64)
    call(src_indices=idx, dst_indices=idx[::-1].copy())
    qr.copy(src_np, dst_np, idx, idx[::-1].copy())
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fp8_kernel", [None, "general"])
def test_a_load_walks_items_layers_and_rounds(fp8_kernel):
    """Heads of 512 (two rounds of 64 groups a token's layer), one warp taking every item: the pipelined load's walk
    (``fp8_kernel=None``) and the register kernel's (``"general"``) over items, layers and rounds are the
    reference's."""
    rng = np.random.default_rng(11)
    heads, head_dim = 4, 512
    src_np, src = make_nvfp4(H=heads, D=head_dim, layout="HND", rng=rng)
    dst_np, dst = make_view("LayerFirst", L, T, P, heads, head_dim, rng, poison=True, mla=False,
                            place=("device", "numba"))
    si, di = rng.choice(T, 5, replace=False).astype(np.int64), rng.choice(T, 5, replace=False).astype(np.int64)
    with config.override(fp8_kernel=fp8_kernel):
        kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=1)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype, fp8_kernel", [("bfloat16", None), ("float16", "general")])
def test_dequantising_with_a_global_scale_of_one(dtype, fp8_kernel):
    """K's global scale 1 (the packed products' path), V's 2 (the float32 one), in one copy; both load kernels."""
    rng = np.random.default_rng(12)
    src_np, src = make_nvfp4(layout="NHD", rng=rng, scales=(1.0, 2.0), dtype=dtype)
    dst_np, dst = make_view("PageFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = rng.choice(T, 4, replace=False).astype(np.int64), rng.choice(T, 4, replace=False).astype(np.int64)
    with config.override(fp8_kernel=fp8_kernel):
        kv.copy(src, dst, si, di, block_quota=1, num_warps_per_block=2)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
