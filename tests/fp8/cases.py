"""FP8 views for the tests: every built-in layout's codes and scales, placed for kvnumba (device or pinned
host memory) with the same buffers in NumPy for ``kvnumba.quant_reference.copy``."""
import numpy as np

import kvnumba as kv
from kvnumba.arrays import array_info
from tests.helpers.placement import PLACE
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, UNIFIED, make_view, unified_mla, view_bytes  # noqa: F401 - the tests' names

FP8_POISON = 0xAB
FP8_LAYOUTS = [name for name in LAYOUTS if name != "HeadMajorPages"]  # an FP8 view is of a built-in layout


def _buffers(name, shape, dtype, mla, place, fill):
    """``(numpy view, placed view)`` of layout ``name`` over buffers shaped ``shape`` (K and V unless MLA)."""
    _, make, per_layer, _ = LAYOUTS[name]
    if name in UNIFIED and mla:
        shape = unified_mla(shape)  # one array: K alone
    count = 1 if (mla or name in KV_ONLY or name in UNIFIED) else 2
    arrays = [fill(shape, dtype) for _ in range(count)]

    def build(arrays, put):
        arrays = [[put(layer) for layer in a] if (per_layer or name in KV_ONLY) else put(a) for a in arrays]
        if name in KV_ONLY:
            return make(arrays[0])
        return make(*arrays) if count == 2 else make(arrays[0])

    return build(arrays, lambda a: a), build(arrays, PLACE[place] if place else (lambda a: a))


def make_fp8(name, L, T, P, H, D, *, mla=False, place="device", fmt="e4m3", dtype="bfloat16", rng=None,
             special_codes=True):
    """``(numpy Fp8View, placed Fp8View)`` of layout ``name``: every byte ``FP8_POISON``, or with ``rng`` random
    codes (every byte value, NaN codes too; ``special_codes=False``: no NaN codes and no e5m2 infinities) and
    random scales (some zero)."""
    shape_of = LAYOUTS[name][0]
    heads = 1 if mla else H

    def codes_fill(shape, dtype):
        if rng is None:
            return np.full(shape, FP8_POISON, np.uint8)
        codes = rng.integers(0, 256, shape, dtype=np.uint8)
        if not special_codes:  # magnitudes 0x7C-0x7F (the NaNs of e4m3, e5m2's infinities and NaNs) -> 0x74-0x77
            codes[(codes & 0x7F) >= 0x7C] ^= 0x08
        return codes

    def scales_fill(shape, dtype):
        if rng is None:
            return np.full(shape[:-1] + (4,), FP8_POISON, np.uint8).view(np.float32)
        scales = (np.exp(rng.normal(0, 3, shape)) / 448).astype(np.float32)
        scales[rng.random(shape) < 0.1] = 0
        return scales

    codes_np, codes = _buffers(name, shape_of(L, T, P, heads, D), np.uint8, mla, place, codes_fill)
    scales_np, scales = _buffers(name, shape_of(L, T, P, heads, 1), np.float32, mla, place, scales_fill)
    return kv.Fp8View(codes_np, scales_np, fmt, dtype=dtype), kv.Fp8View(codes, scales, fmt, dtype=dtype)


def fp8_bytes(view):
    """Every buffer of a (placed) Fp8View, codes then scales, as NumPy bytes."""
    return view_bytes(view.codes) + view_bytes(view.scales)


def put_values(placed, values):
    """NumPy ``values`` into a placed buffer: a GPU array's bytes are not NumPy's (``np.asarray`` of it is a copy)."""
    if hasattr(placed, "copy_to_device"):
        placed.copy_to_device(np.ascontiguousarray(values))
    else:
        np.asarray(placed)[...] = values


def eight_past_sixteen(values):
    """A copy of ``values`` in GPU memory (NumPy on the simulator) that starts 8 bytes past a 16-byte boundary."""
    values = np.ascontiguousarray(values)
    spare = 16 // values.itemsize
    whole = PLACE["device"](np.zeros(values.size + spare, values.dtype))
    skip = ((8 - array_info(whole, "whole").ptr) % 16) // values.itemsize
    padded = np.zeros(values.size + spare, values.dtype)
    padded[skip:skip + values.size] = values.reshape(-1)
    put_values(whole, padded)
    placed = whole[skip:skip + values.size].reshape(values.shape)
    assert array_info(placed, "placed").ptr % 16 == 8
    return placed


def copy_plan(src, dst, layers=None):
    """The plan ``kv.copy(src, dst, ..., layers)`` runs: the one kv.copy's plan cache holds, or built and kept
    there, as a first call would (``kvnumba.plan.build.find``)."""
    from kvnumba.api.transfer import plain
    from kvnumba.plan import build

    transfer = plain("copy")
    return build.find(transfer.spec, transfer._cache, (src, dst, layers), False)
