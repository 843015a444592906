"""What a CUDA graph capture cannot hold is refused with kv.CaptureError before anything is recorded or written:
indices the host must read, check=True, the copy-engine route, a copy-engine entry point, a first call with new
buffers. On the simulator a capture is simulated (kvnumba.driver.capture.simulated_capture); on a GPU the
refusals happen inside a real torch.cuda.graph capture, which stays valid and replays what it did record."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver import capture
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import PLACE, synchronize, to_numpy

pytestmark = pytest.mark.needs_target

POISON = 0xA5


def _views(where="device"):
    rng = np.random.default_rng(0)
    k, v = (rng.integers(0, 256, (2, 64, 32), dtype=np.uint8) for _ in range(2))
    src = kv.LayerFirst(PLACE["host"](k), PLACE["host"](v))
    dst = kv.LayerFirst(PLACE[where](np.full_like(k, POISON)), PLACE[where](np.full_like(v, POISON)))
    return src, dst, k


def _untouched(view):
    return all((to_numpy(b) == POISON).all() for which in ("k", "v") for b in view.buffers(which))


REFUSED = {
    "check=True": lambda src, dst, idx: kv.copy(src, dst, idx, idx, route="kernel", check=True),
    "route='copy_engine'": lambda src, dst, idx: kv.copy(src, dst, idx, idx, route="copy_engine"),
}


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's stand-in capture (a GPU captures for real below)")
@pytest.mark.parametrize("what", list(REFUSED))
def test_refused_in_a_simulated_capture(what):
    src, dst, _ = _views()
    idx = PLACE["device"](np.arange(8, dtype=np.int64))
    kv.copy(src, dst, idx, idx, route="kernel")  # the plan, built outside the capture
    synchronize()
    dst.k[...] = POISON  # (on the simulator, arrays are the buffers themselves)
    dst.v[...] = POISON
    with capture.simulated_capture(0):
        with pytest.raises(kv.CaptureError, match="cannot be captured in a CUDA graph"):
            REFUSED[what](src, dst, idx)
    assert _untouched(dst)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's stand-in capture")
def test_a_first_call_and_a_copy_engine_entry_point_are_refused_in_a_simulated_capture():
    src, dst, _ = _views()
    idx = np.arange(8, dtype=np.int64)
    kv.clear_plan_caches()
    kv.transfer_kv_direct([src.k[0]], [dst.v[0]], idx, idx, 1)  # its plan, outside the capture
    dst.v[...] = POISON
    with capture.simulated_capture(0):
        with pytest.raises(kv.CaptureError, match="building a plan"):
            kv.copy(src, dst, idx, idx)
        with pytest.raises(kv.CaptureError, match="transfer_kv_direct"):
            kv.transfer_kv_direct([src.k[0]], [dst.v[0]], idx, idx, 1)
    assert _untouched(dst)
    kv.copy(src, dst, idx, idx)  # outside the capture: fine
    assert not _untouched(dst)


def test_simulated_capture_is_the_simulators_only():
    if SIMULATOR:
        with capture.simulated_capture(5):
            assert capture.capturing(5) and not capture.capturing(0)
        assert not capture.capturing(5)
    else:
        with pytest.raises(RuntimeError, match="simulator's stand-in"):
            with capture.simulated_capture(5):
                pass


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["host indices", "check=True", "route='copy_engine'", "first call",
                                  "transfer_kv_direct"])
def test_refused_inside_a_real_capture_which_stays_valid(what):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    k = torch.from_numpy(rng.integers(0, 256, (64, 32), dtype=np.uint8)).pin_memory()
    dst = torch.full((64, 32), POISON, dtype=torch.uint8, device="cuda")
    other = torch.full((64, 32), POISON, dtype=torch.uint8, device="cuda")
    idx = torch.arange(8, device="cuda")
    host_idx = idx.cpu().pin_memory()
    kv.transfer_kv_per_layer_mla(k, dst, idx, idx, 32)  # planned outside the capture
    torch.cuda.synchronize()
    dst.fill_(POISON)
    src_view, dst_view = kv.LayerFirst(k[None]), kv.LayerFirst(dst[None])
    kv.copy(src_view, dst_view, idx, idx)
    torch.cuda.synchronize()
    dst.fill_(POISON)
    calls = {
        "host indices": lambda: kv.transfer_kv_per_layer_mla(k, dst, host_idx, host_idx, 32),
        "check=True": lambda: kv.transfer_kv_per_layer_mla(k, dst, idx, idx, 32, check=True),
        "route='copy_engine'": lambda: kv.copy(src_view, dst_view, idx, idx, route="copy_engine"),
        "first call": lambda: kv.transfer_kv_per_layer_mla(k, other, idx, idx, 32),
        "transfer_kv_direct": lambda: kv.transfer_kv_direct([k], [dst], host_idx, host_idx, 1),
    }
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(kv.CaptureError, match="cannot be captured in a CUDA graph"):
            calls[what]()
        kv.transfer_kv_per_layer_mla(k, dst, idx, idx, 32)  # the capture still records
    torch.cuda.synchronize()
    assert (dst == POISON).all() and (other == POISON).all()  # nothing ran during the capture
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst[:8].cpu(), k[:8]) and (dst[8:] == POISON).all() and (other == POISON).all()


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's stand-in capture")
def test_nested_simulated_captures_capture_until_the_outermost_ends():
    src, dst, _ = _views()
    idx = np.arange(8, dtype=np.int64)
    kv.copy(src, dst, idx, idx, route="kernel")  # the plan, outside
    dst.k[...] = POISON
    dst.v[...] = POISON
    with capture.simulated_capture(0):
        with capture.simulated_capture(0):
            assert capture.capturing(0)
        assert capture.capturing(0), "the inner block ended the outer capture"
        with pytest.raises(kv.CaptureError, match="cannot be captured"):
            kv.copy(src, dst, idx, idx, route="kernel", check=True)
    assert not capture.capturing(0)
    assert _untouched(dst)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's stand-in capture")
def test_a_first_fp8_copy_is_refused_in_a_simulated_capture():
    """An FP8 copy builds its plan like any copy, and not while the stream is being captured."""
    from tests.fp8.cases import FP8_POISON, fp8_bytes, make_fp8

    rng = np.random.default_rng(2)
    plain = kv.LayerFirst(*(PLACE["host"](rng.normal(size=(2, 16, 2, 16)).astype(np.float16)) for _ in range(2)))
    _, fp8 = make_fp8("LayerFirst", 2, 16, 4, 2, 16, place="device", dtype="float16")
    idx = np.arange(4, dtype=np.int64)
    kv.clear_plan_caches()
    with capture.simulated_capture(0):
        with pytest.raises(kv.CaptureError, match="building a plan"):
            kv.copy(plain, fp8, idx, idx)
    assert all((b == FP8_POISON).all() for b in fp8_bytes(fp8)), "a refused FP8 copy wrote bytes"
    kv.copy(plain, fp8, idx, idx)  # outside the capture: fine, and the plan is kept
    with capture.simulated_capture(0):
        with pytest.raises(kv.CaptureError, match="check=True"):
            kv.copy(plain, fp8, idx, idx, check=True)
