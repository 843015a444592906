"""Buffers on two GPUs, or a stream of another GPU than the buffers', are refused on every route with
``DeviceMismatchError`` naming them, before anything is written. The simulator has one device: here some
buffers are described as lying on cuda:1 (``kvnumba.arrays`` reads their device through ``_numpy_info``),
and host buffers as host memory, so the same table as tests/target/test_gpu_multi.py's runs without two
GPUs. (Index arrays on another card are checked on a GPU only: the simulator reads every index on the host.)"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import arrays, config
from kvnumba.arrays import HOST
from kvnumba.driver.target import SIMULATOR
from tests.helpers.mixed_devices import expected, first_on
from tests.helpers.placement import PLACE, to_numpy

# On GPUs the same table runs with real cards (tests/target/test_gpu_multi.py); this stand-in describes the
# simulator's arrays as lying on cuda:1, which a real device array's description never reads.
pytestmark = [pytest.mark.needs_target,
              pytest.mark.skipif(not SIMULATOR, reason="the simulator's stand-in for two GPUs: on GPUs, "
                                 "tests/target/test_gpu_multi.py")]

L, T, H, D, ITEM, P = 2, 8, 2, 4, 16, 4
POISON = 0xA5


@pytest.fixture
def cards(monkeypatch, fresh_plans):
    """``put(array, card)``: ``array`` placed as the simulator's device memory, described as lying on ``card``
    (0, 1, or ``"host"``: pinned host memory)."""
    where: dict[int, int] = {}
    describe = arrays._numpy_info

    def numpy_info(a, name):
        info = describe(a, name)
        card = where.get(id(a))
        return info if card is None else info._replace(device=card, on_device=card != HOST)

    monkeypatch.setattr(arrays, "_numpy_info", numpy_info)
    monkeypatch.setattr(arrays, "_describe_by_type", {})  # described again, through the stand-in
    kept = []

    def put(array, card):
        placed = PLACE["device"](array)
        kept.append(placed)  # alive while the test runs: ids stay theirs
        where[id(getattr(placed, "_ary", placed))] = HOST if card == "host" else card
        return placed

    return put


def _filled(put, shape, card, rng=None, dtype=np.uint8):
    """``shape`` of ``dtype`` on ``card``: random bytes with ``rng``, else every byte ``POISON``."""
    raw = shape[:-1] + (shape[-1] * np.dtype(dtype).itemsize,)
    a = rng.integers(0, 256, raw, dtype=np.uint8) if rng is not None else np.full(raw, POISON, np.uint8)
    return put(a.view(dtype), card)


def _call(put, route, case, rng):
    """``(call, destinations)`` for ``route`` with its buffers where ``case`` puts them (as in
    tests/target/test_gpu_multi.py)."""
    a, b = {"src0_dst1": (0, 1), "src1_dst0": (1, 0)}.get(case, (1, 1))
    idx = np.arange(P, dtype=np.int64)
    stream = kv.LaneStream(0, 8, "transfer", device=0) if case == "stream" else None
    if route == "kernel":
        src_k, src_v = (_filled(put, (T, ITEM), a, rng) for _ in range(2))
        dst_k, dst_v = _filled(put, (T, ITEM), b), _filled(put, (T, ITEM), 0 if case == "split" else b)
        return lambda: kv.transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, idx, idx, ITEM, stream=stream), \
            [dst_k, dst_v]
    if route == "staged":
        src_k, src_v = (_filled(put, (T, L, ITEM), "host", rng) for _ in range(2))
        dst_k, dst_v = _filled(put, (T, ITEM), b), _filled(put, (T, ITEM), 0 if case == "split" else b)

        def staged():
            with config.override(load_path="staged"):
                kv.transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, idx, idx, 1, ITEM, L * ITEM, stream=stream)
        return staged, [dst_k, dst_v]
    if route == "direct":
        src = [_filled(put, (T, ITEM), a, rng) for _ in range(L)]
        dst = [_filled(put, (T, ITEM), 0 if case == "split" and i == L - 1 else b) for i in range(L)]
        return lambda: kv.transfer_kv_direct(src, dst, idx, idx, P, stream=stream), dst
    if route == "direct_pf_lf":
        src = [_filled(put, (T // P, L, P, ITEM), "host", rng) for _ in range(2)]
        dst = [_filled(put, (T, ITEM), 0 if case == "split" and i == 0 else b) for i in range(2 * L)]
        return lambda: kv.transfer_kv_per_layer_direct_pf_lf(src, dst, idx, idx, 0, P, stream=stream), dst
    src = kv.PageFirst(*(_filled(put, (T, L, H, D), a, rng, np.uint16) for _ in range(2)))
    if route == "fp8":
        codes = [_filled(put, (L, T, H, D), b) for _ in range(2)]
        scales = [_filled(put, (L, T, H, 1), 0 if case == "split" else b, dtype=np.float32) for _ in range(2)]
        dst = kv.Fp8View(kv.LayerFirst(*codes), kv.LayerFirst(*scales), dtype="bfloat16")
        written = codes + scales
    else:
        k = _filled(put, (L, T, H, D), b, dtype=np.uint16)
        v = _filled(put, (L, T, H, D), 0 if case == "split" else b, dtype=np.uint16)
        dst, written = kv.LayerFirst(k, v), [k, v]
    if route == "copy_engine":
        return lambda: kv.copy(src, dst, idx, idx, route="copy_engine", stream=stream), written
    if route == "prepared":
        return lambda: kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=1)(idx, idx, stream=stream), written
    return lambda: kv.copy(src, dst, idx, idx, stream=stream), written  # "copy", "fp8"






FIRST_ON = {route: names for route, names in first_on(L).items() if route != "lanes"}  # lanes: a GPU's
CASES = [(route, case) for route in FIRST_ON for case in ("src0_dst1", "src1_dst0", "split", "stream")
         if not (FIRST_ON[route][0] is None and case in ("src0_dst1", "src1_dst0"))]


@pytest.mark.parametrize("route, case", CASES, ids=[f"{r}-{c}" for r, c in CASES])
def test_mixed_devices_are_refused_on_every_route_and_nothing_is_written(cards, route, case):
    call, written = _call(cards, route, case, np.random.default_rng(0))
    with pytest.raises(kv.DeviceMismatchError, match=_message(route, case)):
        call()
    for i, placed in enumerate(written):
        assert (to_numpy(placed).view(np.uint8) == POISON).all(), f"{route}, {case}: destination {i} was written"


def _message(route, case):
    return expected(route, case, L)
