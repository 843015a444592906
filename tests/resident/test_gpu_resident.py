"""kv.load_resident on a GPU: another stream waits for each layer with cuStreamWaitValue32 and then reads it (it
must see the landed bytes, and, without the wait, must not); the host goes on while the load's
stream and the waiting stream are busy (the load's stream held shut by a gate that the host opens only once
everything is enqueued: no test here leans on the host being quick); CUDA graph capture of the loader, and of the loader with the waits (the
wait kernel), replayed with new indices; host indices. Both builds: 64 items take the register build, 512 the
staged one (on sm_90 and newer, ``KVNUMBA_LOAD_PATH`` unset)."""
import contextlib
import gc
import time

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.plan.staged_plan import AUTO_MIN_ITEMS
from kvnumba.plan.tensor_maps import compute_capability
from tests.helpers.view_cases import POISON

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

L, T, P, H, ITEM = 4, 1024, 16, 4, 512  # items of 4 heads of 128 bytes
COUNTS = [64, AUTO_MIN_ITEMS]  # the register build, the staged one


def _setup(seed=0, count=64):
    """A page-first pool in pinned memory and per-layer GPU caches (torch, bytes), their NumPy twins, indices."""
    rng = np.random.default_rng(seed)
    k, v = (rng.integers(0, 256, (T, L, H, ITEM // H), dtype=np.uint8) for _ in range(2))  # [T, L, H, bytes]
    src_np, src = kv.PageFirst(k, v), kv.PageFirst(*(torch.from_numpy(a).pin_memory() for a in (k, v)))
    dk, dv = ([_poisoned() for _ in range(L)] for _ in range(2))
    dst = kv.LayerFirst([torch.from_numpy(a).cuda() for a in dk], [torch.from_numpy(a).cuda() for a in dv])
    si = _pages(rng, count)  # whole pages, as HiCache loads them: runs for the staged build's bulk pieces
    di = rng.choice(T, count, replace=False).astype(np.int64)
    return src_np, src, kv.LayerFirst(dk, dv), dst, si, di


def _poisoned():
    return np.full((T, H, ITEM // H), POISON, np.uint8)


def _pages(rng, count):
    return (rng.choice(T // P, count // P, replace=False)[:, None] * P + np.arange(P)).reshape(-1).astype(np.int64)


def _want(src_np, dst_np, si, di):
    reference.copy(src_np, dst_np, si, di, None)
    return list(dst_np.k)  # K of each layer, [T, H, bytes]


def _bytes(tensor):
    return tensor.cpu().numpy()


def _staged_expected(count):
    return count >= AUTO_MIN_ITEMS and compute_capability(0) >= (9, 0)


class Gate:
    """A stream held until the host opens the gate: the wait kernel (``kvnumba.kernels.layer_wait``) runs on it
    and polls a word of mapped pinned host memory that ``open`` sets to 1 from the host. A kernel, not a stream
    memory operation: CUDA's scheduler sees the hold, and opening needs no GPU work (a ``cuStreamWaitValue32``
    gate opened by a write on another stream can be queued behind its own wait in a shared hardware queue, and
    never open)."""

    def __init__(self, stream):
        from numba import cuda

        from kvnumba.driver.launch import BoundKernel, launchable
        from kvnumba.kernels.layer_wait import WAIT_SIGNATURE, get_wait_kernel

        self.word = cuda.mapped_array(1, np.uint32)
        self.word[0] = 0
        self._waiter = BoundKernel(launchable(get_wait_kernel(), WAIT_SIGNATURE), 0,
                                   (self.word.device_ctypes_pointer.value, 1))
        self._waiter.launch(1, 32, stream.cuda_stream, self._waiter.blocks.address)

    def open(self):
        self.word[0] = 1


def _finished_while_shut(event, seconds=20.0):
    """Whether ``event`` completes while a gate is shut, asked without GPU work (``query``)."""
    deadline = time.monotonic() + seconds
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _gated_reads(load, dst, loads, model):
    """Hold ``loads`` shut; on ``model``, read the last K layer without a wait; enqueue ``load()`` (on ``loads``)
    and, on ``model``, each layer's read after its wait; once the read without a wait has finished, open the
    gate. Returns ``(done, snapshots, held)``: the load, the reads after a wait, and whether ``model`` was still
    held when the host had enqueued them and the load had not run. Everything is enqueued in that order, and
    nothing waits on the GPU while the gate is shut, so no stream can queue behind the held one."""
    before = dst.k[-1].clone()  # what the read without a wait must find
    torch.cuda.synchronize()
    gate = Gate(loads)
    early = torch.empty_like(dst.k[-1])
    snapshots = [torch.empty_like(k) for k in dst.k]
    read_early = torch.cuda.Event()
    with torch.cuda.stream(model):
        early.copy_(dst.k[-1])  # no wait: before the load
        read_early.record(model)
    done = load()
    assert not loads.query(), "kv.load_resident returned only once its stream had finished"
    with torch.cuda.stream(model):
        for layer in range(L):
            done.wait(layer, model)
            snapshots[layer].copy_(dst.k[layer])
    held = not model.query()
    early_done = _finished_while_shut(read_early)
    gate.open()
    torch.cuda.synchronize()
    assert early_done, "the read without a wait did not run while the load was held"
    assert torch.equal(early.view(torch.uint8), before.view(torch.uint8)), \
        "the load ran before the read that did not wait: the gate failed"
    return done, snapshots, held


def _warm(src, dst, si, di, signal):
    """One load of the same plan before the test's own, then the destination poisoned again: the test's own load
    finds its plan built and its loader compiled."""
    kv.load_resident(src, dst, si, di, signal=signal).synchronize()
    for layer in dst.k + dst.v:
        layer.fill_(POISON)
    torch.cuda.synchronize()


@pytest.mark.parametrize("count", COUNTS)
def test_a_stream_that_waits_for_a_layer_sees_it(count):
    src_np, src, dst_np, dst, si, di = _setup(count=count)
    want = _want(src_np, dst_np, si, di)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    loads, model = torch.cuda.Stream(), torch.cuda.Stream()
    signal = kv.LayerSignal(L)
    _warm(src, dst, si_t, di_t, signal)
    done, snapshots, held = _gated_reads(lambda: kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=loads),
                                         dst, loads, model)
    assert held, "ResidentLoad.wait returned only once the layer had landed"
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(snapshots[layer]), want[layer], err_msg=f"layer {layer}")
    assert done.landed() == L
    assert done.staged == _staged_expected(count)
    done.synchronize()


@pytest.mark.parametrize("count", COUNTS)
def test_a_load_and_its_waits_return_while_the_streams_are_busy(count):
    """The host issues a load and every wait behind a gate it has not opened, and goes on: nothing in
    ``kv.load_resident`` or ``ResidentLoad.wait`` waits for the GPU (after the plan's first load)."""
    src_np, src, dst_np, dst, si, di = _setup(seed=3, count=count)
    want = _want(src_np, dst_np, si, di)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    loads, model = torch.cuda.Stream(), torch.cuda.Stream()
    signal = kv.LayerSignal(L)
    _warm(src, dst, si_t, di_t, signal)
    gate = Gate(loads)
    done = kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=loads)
    assert not loads.query(), "kv.load_resident returned only once its stream had finished"
    for layer in range(L):
        done.wait(layer, model)
    assert not model.query(), "ResidentLoad.wait returned only once the layer had landed"
    gate.open()
    torch.cuda.synchronize()
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer], err_msg=f"layer {layer}")
    done.synchronize()


@pytest.mark.parametrize("entry", ["load_resident", "copy"])
def test_each_call_runs_on_the_stream_it_is_given(entry):
    """Streams made one after another, each where the last was collected (torch 2.11 reuses the address and leaves
    the dead stream's weak references alive): each call runs on its own stream, held by that stream's gate, and
    not on an earlier stream at the same address (which ran the load at once, and let every wait pass)."""
    src_np, src, dst_np, dst, si, di = _setup(seed=6)
    want = _want(src_np, dst_np, si, di)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    signal = kv.LayerSignal(L)
    _warm(src, dst, si_t, di_t, signal)
    for _ in range(4):
        loads, other = torch.cuda.Stream(), torch.cuda.Stream()
        gate = Gate(loads)
        if entry == "copy":
            kv.copy(src, dst, si_t, di_t, stream=loads)
        else:
            done = kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=loads)
            assert done.stream == loads.cuda_stream
            for layer in range(L):
                done.wait(layer, other)
        time.sleep(0.05)  # a load on another (idle) stream would have landed by now
        with torch.cuda.stream(other):
            early = dst.k[-1].clone()  # after the waits, if any: read once the gate is open
        if entry == "copy":
            other.synchronize()
            assert (_bytes(early) == POISON).all(), "the copy ran while its stream was held"
        else:
            assert not other.query(), "the waits passed while the load's stream was held"
        gate.open()
        torch.cuda.synchronize()
        for layer in range(L):
            np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer], err_msg=f"layer {layer}")
            dst.k[layer].fill_(POISON)
            dst.v[layer].fill_(POISON)
        torch.cuda.synchronize()
        del loads, other, gate
        gc.collect()


def test_host_indices():
    src_np, src, dst_np, dst, si, di = _setup(seed=1)
    want = _want(src_np, dst_np, si, di)
    done = kv.load_resident(src, dst, si, di)
    done.synchronize()
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer])


@contextlib.contextmanager
def captured(graph):
    """Capture ``graph`` on torch's capture stream (``main``) with a side stream forked from it (``side``) and
    joined back at the end, even when the block raises: the capture then ends cleanly and the error is the
    block's."""
    side = torch.cuda.Stream()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        try:
            yield main, side
        finally:
            main.wait_stream(side)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("waits", [False, True], ids=["loader", "loader-and-waits"])
def test_graph_capture(waits, count):
    """The loader captured on a side stream (and, with ``waits``, the main stream's waits and reads of every
    layer), replayed twice with new indices written in place."""
    src_np, src, dst_np, dst, si, di = _setup(seed=2, count=count)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    signal = kv.LayerSignal(L)
    snapshots = [torch.empty_like(k) for k in dst.k]
    kv.load_resident(src, dst, si_t, di_t, signal=signal).synchronize()  # the plan is built before the capture
    graph = torch.cuda.CUDAGraph()
    with captured(graph) as (main, side):
        done = kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=side)
        if waits:
            for layer in range(L):
                done.wait(layer, main)
                snapshots[layer].copy_(dst.k[layer])
    rng = np.random.default_rng(5)
    for replay in range(2):
        si, di = _pages(rng, len(si)), rng.choice(T, len(di), replace=False)
        si_t.copy_(torch.from_numpy(si))
        di_t.copy_(torch.from_numpy(di))
        for layer in dst.k + dst.v:
            layer.fill_(POISON)
        fresh, fresh_v = [_poisoned() for _ in range(L)], [_poisoned() for _ in range(L)]
        want_np = kv.LayerFirst(fresh, fresh_v)
        reference.copy(src_np, want_np, si, di, None)
        graph.replay()
        torch.cuda.synchronize()
        assert signal.landed() == L
        for layer in range(L):
            np.testing.assert_array_equal(_bytes(dst.k[layer]), fresh[layer], err_msg=f"replay {replay}")
            np.testing.assert_array_equal(_bytes(dst.v[layer]), fresh_v[layer], err_msg=f"replay {replay}")
            if waits:
                np.testing.assert_array_equal(_bytes(snapshots[layer]), fresh[layer])
    kv.check_errors()


@pytest.mark.parametrize("count", COUNTS)
def test_a_load_writes_only_its_rows(count):
    """Every destination layer a slice of one poisoned buffer, with guard rows before and after it: the load lands
    its rows (as the reference) and leaves every other byte, the guards included, as it was. Both builds."""
    src_np, src, _, _, si, di = _setup(seed=4, count=count)
    guard_rows = 8
    backing = [torch.full((guard_rows + T + guard_rows, H, ITEM // H), POISON, dtype=torch.uint8, device="cuda")
               for _ in range(2 * L)]
    layers = [b[guard_rows:guard_rows + T] for b in backing]
    dst = kv.LayerFirst(layers[:L], layers[L:])
    want = kv.LayerFirst([_poisoned() for _ in range(L)], [_poisoned() for _ in range(L)])
    reference.copy(src_np, want, si, di, None)
    done = kv.load_resident(src, dst, torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda())
    done.synchronize()
    assert done.staged == _staged_expected(count)
    for layer, (rows, expected) in enumerate(zip(backing, want.k + want.v)):
        got = _bytes(rows)
        assert (got[:guard_rows] == POISON).all() and (got[guard_rows + T:] == POISON).all(), \
            f"layer buffer {layer}: written outside its rows"
        np.testing.assert_array_equal(got[guard_rows:guard_rows + T], expected, err_msg=f"layer buffer {layer}")


def test_a_signal_collected_during_a_capture_leaves_it_valid():
    """A ``LayerSignal`` that used its event and is garbage-collected while another stream is being captured
    (as the cycle collector may do at any allocation: a failed test's traceback holds its signal): the capture
    ends cleanly and its graph replays."""
    import gc

    src_np, src, dst_np, dst, si, di = _setup(seed=6)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    old = kv.LayerSignal(L)
    kv.load_resident(src, dst, si_t, di_t, signal=old).synchronize()  # its event recorded
    signal = kv.LayerSignal(L)
    kv.load_resident(src, dst, si_t, di_t, signal=signal).synchronize()
    for layer in dst.k + dst.v:
        layer.fill_(POISON)
    want = _want(src_np, dst_np, si, di)
    # Earlier tests' garbage first: a torch CUDAGraph of theirs, collected inside this capture, would end it
    # (torch resets a graph as it goes), which is torch's doing, not the signal's.
    gc.collect()
    graph = torch.cuda.CUDAGraph()
    with captured(graph) as (main, side):
        done = kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=side)
        del old
        gc.collect()
        done.wait(L - 1, main)
    graph.replay()
    torch.cuda.synchronize()
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer], err_msg=f"layer {layer}")


def _layer_first_setup(seed, item, count):
    """A layer-first pool in pinned memory (``[L, T, H, item / H]``), per-layer GPU caches, NumPy twins and whole
    pages of host indices: a page of a layer's K (or V) is one run of ``P * item`` bytes."""
    rng = np.random.default_rng(seed)
    k, v = (rng.integers(0, 256, (L, T, H, item // H), dtype=np.uint8) for _ in range(2))
    src_np, src = kv.LayerFirst(k, v), kv.LayerFirst(*(torch.from_numpy(a).pin_memory() for a in (k, v)))
    dk, dv = ([np.full((T, H, item // H), POISON, np.uint8) for _ in range(L)] for _ in range(2))
    dst = kv.LayerFirst([torch.from_numpy(a).cuda() for a in dk], [torch.from_numpy(a).cuda() for a in dv])
    return src_np, src, kv.LayerFirst(dk, dv), dst, _pages(rng, count), _pages(rng, count)


@pytest.mark.parametrize("route,item", [("copy_engine", ITEM), ("auto", 4096)])
def test_a_load_by_copy_engine_is_waited_for_layer_by_layer(route, item):
    """One batch per layer on the load's stream, each followed by its count: a stream that waits for a layer sees
    it, one that does not wait sees nothing, and neither call waits on the host. ``auto`` takes the copy engine
    for runs of 64 KiB (16 tokens of 4 KiB) with host indices."""
    src_np, src, dst_np, dst, si, di = _layer_first_setup(5, item, 256)
    want = _want(src_np, dst_np, si, di)
    loads, model = torch.cuda.Stream(), torch.cuda.Stream()
    signal = kv.LayerSignal(L)
    kv.load_resident(src, dst, si, di, signal=signal, route=route).synchronize()  # the plan built, then poisoned
    for layer in dst.k + dst.v:
        layer.fill_(POISON)
    torch.cuda.synchronize()
    done, snapshots, held = _gated_reads(
        lambda: kv.load_resident(src, dst, si, di, signal=signal, stream=loads, route=route), dst, loads, model)
    assert done.route == "copy_engine"
    assert held, "ResidentLoad.wait returned only once the layer had landed"
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(snapshots[layer]), want[layer], err_msg=f"layer {layer}")
    assert done.landed() == L
    done.synchronize()


def test_auto_takes_the_resident_loader_for_gpu_indices():
    src_np, src, dst_np, dst, si, di = _layer_first_setup(6, 4096, 256)
    want = _want(src_np, dst_np, si, di)
    done = kv.load_resident(src, dst, torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda(), route="auto",
                            stream=torch.cuda.Stream())
    done.synchronize()
    assert done.route == "kernel"
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer])


def _fp8_setup(rng):
    """An FP8 page-first pool in pinned memory (quantised once from random bfloat16 bits) and bfloat16 GPU caches
    of 1.5: ``(fp8, dst, caches_like)``; ``caches_like()`` makes another such view (for what kv.copy gives)."""
    bits = [rng.integers(-2**15, 2**15, (T, L, H, ITEM // (2 * H)), dtype=np.int16) for _ in range(2)]
    plain = kv.PageFirst(*(torch.from_numpy(b).view(torch.bfloat16).pin_memory() for b in bits))
    fp8 = kv.fp8_like(plain)
    idx = torch.arange(T, device="cuda")
    kv.copy(plain, fp8, idx, idx)

    def caches_like():
        return kv.LayerFirst(*([torch.full((T, H, ITEM // (2 * H)), 1.5, dtype=torch.bfloat16, device="cuda")
                                for _ in range(L)] for _ in range(2)))

    return fp8, caches_like(), caches_like


def test_an_fp8_load_is_waited_for_layer_by_layer():
    """An FP8 page-first pool in pinned memory, dequantised into bfloat16 GPU caches by kv.copy's FP8 kernel, one
    launch per layer behind a gate: a stream that waits for a layer sees what kv.copy makes of it."""
    rng = np.random.default_rng(7)
    fp8, dst, caches_like = _fp8_setup(rng)
    want = caches_like()
    si, di = (torch.from_numpy(_pages(rng, 64)).cuda() for _ in range(2))
    kv.copy(fp8, want, si, di)
    signal = kv.LayerSignal(L)
    kv.load_resident(fp8, dst, si, di, signal=signal).synchronize()  # plans built
    for layer in dst.k:
        layer.fill_(1.5)
    torch.cuda.synchronize()
    loads, model = torch.cuda.Stream(), torch.cuda.Stream()
    done, snapshots, held = _gated_reads(lambda: kv.load_resident(fp8, dst, si, di, signal=signal, stream=loads),
                                         dst, loads, model)
    assert held, "ResidentLoad.wait returned only once the layer had landed"
    for layer in range(L):
        assert torch.equal(snapshots[layer].view(torch.int16), want.k[layer].view(torch.int16)), f"layer {layer}"
    assert done.landed() == L
    done.synchronize()


def test_an_fp8_load_and_its_waits_are_captured():
    """The FP8 resident load (a launch and a count written on the stream per layer) and the main stream's waits
    and reads of every layer, captured in one graph and replayed twice with new indices written in place."""
    rng = np.random.default_rng(8)
    fp8, dst, caches_like = _fp8_setup(rng)
    si, di = (torch.from_numpy(_pages(rng, 64)).cuda() for _ in range(2))
    signal = kv.LayerSignal(L)
    kv.load_resident(fp8, dst, si, di, signal=signal).synchronize()  # plans built before the capture
    snapshots = [torch.empty_like(k) for k in dst.k]
    graph = torch.cuda.CUDAGraph()
    with captured(graph) as (main, side):
        done = kv.load_resident(fp8, dst, si, di, signal=signal, stream=side)
        for layer in range(L):
            done.wait(layer, main)
            snapshots[layer].copy_(dst.k[layer])
    for replay in range(2):
        si.copy_(torch.from_numpy(_pages(rng, 64)))
        di.copy_(torch.from_numpy(_pages(rng, 64)))
        want = caches_like()
        kv.copy(fp8, want, si, di)
        for layer in dst.k + dst.v:
            layer.fill_(1.5)
        graph.replay()
        torch.cuda.synchronize()
        assert signal.landed() == L
        for layer in range(L):
            assert torch.equal(dst.v[layer].view(torch.int16), want.v[layer].view(torch.int16)), f"replay {replay}"
            assert torch.equal(snapshots[layer].view(torch.int16), want.k[layer].view(torch.int16)), f"replay {replay}"
