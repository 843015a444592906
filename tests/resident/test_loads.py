"""kv.load_resident on the simulator and a GPU: every source layout (and MLA) byte for byte against
kvnumba.reference.copy, destinations poisoned; the layer count the load publishes; kv.copy's errors, with
nothing written; the kernel's guard; what a capture refuses. The GPU's own waits: test_gpu_resident.py; FP8
views: test_codec_loads.py; NVFP4 views: test_nvfp4_loads.py."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.driver import capture
from kvnumba.driver.target import SIMULATOR
from kvnumba.errors import CaptureError, IndexOutOfRangeError
from tests.helpers.placement import PLACE, synchronize
from tests.helpers.view_cases import POISON, assert_same_bytes, make_view, view_bytes

pytestmark = [pytest.mark.needs_target]

L, T, P, H, D = 3, 16, 4, 2, 8  # 3 layers, 16 tokens in pages of 4; items of 2 heads x 8 uint16 = 32 bytes
GEOMETRY = (L, T, P, H, D)


def _views(src_name, dst_name, mla=False, seed=0, places=("host", "device")):
    rng = np.random.default_rng(seed)
    src_np, src = make_view(src_name, *GEOMETRY, rng, poison=False, mla=mla, place=(places[0], "numba"))
    dst_np, dst = make_view(dst_name, *GEOMETRY, rng, poison=True, mla=mla, place=(places[1], "numba"))
    return rng, src_np, src, dst_np, dst


def _indices(rng, count):
    return (rng.choice(T, count, replace=False).astype(np.int64), rng.choice(T, count, replace=False).astype(np.int64))


def run_load(src_name, dst_name, *, mla=False, count=6, layers=None, block_quota=2, warps=2, signal=None):
    """A resident load on placed views and reference.copy on NumPy ones: every destination byte must agree, and the
    load must have published every layer."""
    rng, src_np, src, dst_np, dst = _views(src_name, dst_name, mla)
    si, di = _indices(rng, count)
    put = PLACE["device"]
    done = kv.load_resident(src, dst, put(si), put(di), layers, block_quota=block_quota, num_warps_per_block=warps,
                            signal=signal)
    for layer in done.layers:
        done.wait(layer)
    done.synchronize()
    reference.copy(src_np, dst_np, si, di, layers)
    moved = assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, f"{src_name} -> {dst_name}")
    assert count == 0 or moved > 0, "the reference moved nothing"
    assert done.landed() == len(done.layers)
    return done


SOURCES = ["PageFirst", "PageHead", "LayerFirst", "PageUnified", "PageFirstDirect"]


@pytest.mark.parametrize("src_name", SOURCES)
def test_every_source_layout_into_layer_buffers(src_name):
    done = run_load(src_name, "LayerFirstList")
    assert done.layers == range(L)


@pytest.mark.parametrize("src_name", ["PageFirst", "PageHead", "LayerFirst", "PageUnified"])
def test_mla(src_name):
    run_load(src_name, "LayerFirst", mla=True)


@pytest.mark.parametrize("block_quota,warps", [(1, 1), (1, 4), (2, 1), (3, 2)])
def test_launch_shapes(block_quota, warps):
    run_load("PageFirst", "VllmFlashAttn", block_quota=block_quota, warps=warps, count=7)


@pytest.mark.parametrize("layers", [1, range(1, 3)])
def test_some_layers(layers):
    done = run_load("PageHead", "LayerFirstList", layers=layers)
    assert done.layers == (range(layers, layers + 1) if isinstance(layers, int) else layers)
    with pytest.raises(ValueError, match="layer must be"):
        done.wait(done.layers.start - 1)
    with pytest.raises(ValueError, match="layer must be"):
        done.wait(done.layers.stop)


def test_a_wait_names_its_bad_arguments():
    done = run_load("PageFirst", "LayerFirst", count=2)
    with pytest.raises(TypeError, match="layer must be"):
        done.wait(1.0)
    with pytest.raises(TypeError, match="stream must be a CUDA stream"):
        done.wait(0, stream="model")


def test_an_empty_load_publishes_every_layer():
    done = run_load("PageFirst", "LayerFirstList", count=0)
    assert done.landed() == L


def test_every_block_arrives_at_every_layer():
    """The arrival words: block_quota blocks at each layer (the last of them published it)."""
    signal = kv.LayerSignal(4)
    run_load("PageFirst", "LayerFirst", block_quota=2, warps=1, count=8, signal=signal)
    if SIMULATOR:  # the words are host memory here
        assert signal._words.tolist() == [L, 2, 2, 2, 0]


def test_a_signal_serves_load_after_load():
    signal = kv.LayerSignal(L)
    first = run_load("PageFirst", "LayerFirst", signal=signal)
    second = run_load("PageHead", "LayerFirstList", layers=range(0, 2), signal=signal, count=3)
    assert first.signal is second.signal and second.landed() == 2


# --- errors: kv.copy's, and nothing written ---------------------------------------------------------------

def _poisoned_load(**kwargs):
    rng, _, src, _, dst = _views("PageFirst", "LayerFirstList")
    si, di = _indices(rng, 4)
    args = {"src_indices": PLACE["device"](si), "dst_indices": PLACE["device"](di)}
    args.update(kwargs)
    return src, dst, args


@pytest.mark.parametrize("change,error,message", [
    ({"block_quota": 0}, ValueError, "block_quota must be"),
    ({"num_warps_per_block": 33}, ValueError, "num_warps_per_block must be"),
    ({"src_indices": np.arange(3, dtype=np.int64)}, ValueError, "same length"),
    ({"dst_indices": np.array([0, 1, 2, 99], np.int64)}, IndexOutOfRangeError, r"dst_indices\[3\] = 99"),
    ({"src_indices": np.arange(4, dtype=np.int32)}, TypeError, "src_indices must hold int64"),
    ({"check": 1}, TypeError, "check must be True or False"),
    ({"signal": object()}, TypeError, "signal must be a kv.LayerSignal"),
    ({"signal": "small"}, ValueError, "signal holds loads of at most 2 layers"),
])
def test_bad_input_writes_nothing(change, error, message):
    src, dst, args = _poisoned_load()
    if change.get("signal") == "small":
        change = {"signal": kv.LayerSignal(2)}
    args.update(change)
    before = [b.copy() for b in view_bytes(dst)]
    with pytest.raises(error, match=message):
        kv.load_resident(src, dst, **args)
    synchronize()
    for got, want in zip(view_bytes(dst), before):
        np.testing.assert_array_equal(got, want)


def test_a_bad_layer_range_is_kv_copys_error():
    src, dst, args = _poisoned_load()
    with pytest.raises(ValueError, match="layers"):
        kv.load_resident(src, dst, layers=range(2, 5), **args)


def test_signal_sizes():
    with pytest.raises(ValueError, match="max_layers must be a positive int"):
        kv.LayerSignal(0)


def test_the_kernel_guard_skips_and_reports(device_path):
    """Indices the host does not check (GPU memory): the kernel skips the bad item, copies the others, still
    publishes every layer; synchronize() raises."""
    rng, src_np, src, dst_np, dst = _views("PageFirst", "LayerFirstList")
    si, di = _indices(rng, 5)
    bad = si.copy()
    bad[2] = T + 7
    done = kv.load_resident(src, dst, PLACE["device"](bad), PLACE["device"](di))
    with pytest.raises(IndexOutOfRangeError, match="skipped items"):
        done.synchronize()
    assert done.landed() == L
    keep = np.arange(5) != 2
    reference.copy(src_np, dst_np, si[keep], di[keep], None)
    assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, "the other items")


@pytest.mark.skipif(not SIMULATOR, reason="a simulated capture (a GPU captures a real graph: test_gpu_resident.py)")
def test_a_capture_needs_a_signal_made_before():
    src, dst, args = _poisoned_load()
    kv.load_resident(src, dst, **args)  # the plan is built before the capture
    signal = kv.LayerSignal(L)
    with capture.simulated_capture(0):
        with pytest.raises(CaptureError, match="without signal="):
            kv.load_resident(src, dst, **args)
        assert kv.load_resident(src, dst, signal=signal, **args).landed() == L


class _CountingWaiter:
    """The signal's wait kernel, its launches recorded (the count each waited for), then run."""

    def __init__(self, waiter):
        self.waiter, self.blocks, self.counts = waiter, waiter.blocks, []

    def launch(self, grid, threads, handle, address):
        self.counts.append(self.blocks.values[1])
        self.waiter.launch(grid, threads, handle, address)


@pytest.mark.skipif(not SIMULATOR, reason="a simulated capture (a GPU captures a real graph: test_gpu_resident.py)")
def test_a_captured_wait_is_the_wait_kernel():
    src, dst, args = _poisoned_load()
    signal = kv.LayerSignal(L)
    done = kv.load_resident(src, dst, signal=signal, **args)
    signal._waiter = spy = _CountingWaiter(signal._waiter)
    for layer in range(L):
        done.wait(layer, 0)
    assert spy.counts == [], "an uncaptured wait launched the wait kernel"
    with capture.simulated_capture(0):
        for layer in range(L):
            done.wait(layer, 0)
    assert spy.counts == list(range(1, L + 1))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's words are host memory, set here")
def test_the_wait_kernel_returns_once_the_count_is_reached():
    signal = kv.LayerSignal(2)
    signal._words[0] = 2
    with capture.simulated_capture(0):
        signal.wait(0, 2)  # returns: the kernel's poll sees 2
        signal._words[0] = 1
        with pytest.raises(RuntimeError, match="landed 1 layers, not 2"):
            signal.wait(0, 2)
