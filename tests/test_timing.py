"""kvnumba.tools.timing: the one GPU timer of the benchmark, the demo and the GPU tests. CUDA events on a GPU;
on the simulator the wall clock, and it says so."""
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba.tools import timing
from kvnumba.driver.streams import stream_handle
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import ON_GPU, device

pytestmark = pytest.mark.needs_target  # events and synchronisation need a GPU, or the simulator's stand-ins


class Calls:
    """A callable that counts its calls and sleeps ``seconds`` in each."""

    def __init__(self, seconds=0.0):
        self.seconds, self.count = seconds, 0

    def __call__(self):
        self.count += 1
        if self.seconds:
            time.sleep(self.seconds)


def test_clock_says_which_clock():
    if SIMULATOR:
        assert timing.CLOCK.startswith("wall clock") and "simulator" in timing.CLOCK
        assert timing.GpuTimer.clock == timing.CLOCK
    else:
        assert timing.CLOCK == "CUDA events"


@pytest.mark.skipif(not SIMULATOR, reason="the wall clock is the simulator's fallback")
def test_timer_on_the_simulator_is_the_wall_clock():
    with timing.GpuTimer() as timer:
        time.sleep(0.02)
    assert timer.seconds == timer.host_seconds
    assert 0.02 <= timer.seconds < 1.0


def test_gpu_time_calls_warmup_then_groups_and_divides_by_repeats():
    fn = Calls(0.002 if SIMULATOR else 0.0)
    seconds = timing.gpu_time(fn, repeats=3, groups=4, warmup=2)
    assert fn.count == 2 + 3 * 4
    if SIMULATOR:
        assert 0.002 <= seconds < 0.5  # per call, not per group


def test_host_time_counts_calls_and_can_include_the_wait():
    fn = Calls(0.003)
    seconds = timing.host_time(fn, calls=2, groups=3, warmup=1)
    assert fn.count == 1 + 2 * 3
    assert 0.003 <= seconds < 0.5
    assert timing.host_time(Calls(0.003), 1, groups=2, include_sync=True) >= 0.003


@pytest.mark.skipif(not SIMULATOR, reason="sleeping is host time: CUDA events see none of it")
def test_gpu_time_takes_the_median_of_the_groups():
    pauses = iter([0.05, 0.001, 0.001])  # one slow group of three: the median is a fast one

    def fn():
        time.sleep(next(pauses))

    assert 0.001 <= timing.gpu_time(fn, repeats=1, groups=3, warmup=0) < 0.04


def test_streams_are_what_the_entry_points_take():
    with pytest.raises(TypeError, match="stream must be a CUDA stream or a raw stream handle"):
        timing.GpuTimer(stream="side")
    assert timing.GpuTimer(stream=7).stream == 7


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA events need a GPU")
@pytest.mark.parametrize("stream_kind", ["default", "numba", "handle"])
def test_events_time_a_transfer_on_its_stream(stream_kind):
    from numba import cuda

    item, pool, layers = 2048, 8192, 4
    src = device(np.random.default_rng(0).integers(0, 255, (pool, layers, item), dtype=np.uint8))
    dst = [device(np.zeros((pool, item), np.uint8)) for _ in range(2)]
    idx = device(np.arange(pool, dtype=np.int64))
    side = cuda.stream()
    stream = {"default": None, "numba": side, "handle": stream_handle(side)}[stream_kind]

    def load():
        kv.transfer_kv_per_layer_pf_lf(src, dst[0], src, dst[1], idx, idx, 1, item, layers * item, stream=stream)

    load()
    cuda.synchronize()
    start = time.perf_counter()
    with timing.GpuTimer(stream) as timer:
        load()
    wall = time.perf_counter() - start  # includes the wait for the end event
    assert 0 < timer.seconds <= wall + 1e-4
    assert timer.host_seconds <= wall
    per_call = timing.gpu_time(load, repeats=4, stream=stream, groups=3)
    assert 0 < per_call < 1.0
    assert (dst[1].copy_to_host() == src.copy_to_host()[:, 1]).all()
