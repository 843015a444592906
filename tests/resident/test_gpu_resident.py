"""kv.load_resident on a GPU: another stream waits for each layer with cuStreamWaitValue32 and then reads it (it
must see the landed bytes, and, without the wait, must not); CUDA graph capture of the loader, and of the loader
with the waits, replayed with new indices; host indices."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from tests.helpers.view_cases import POISON, make_view

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

L, T, P, H, D = 4, 256, 16, 4, 64  # items of 4 heads x 64 bf16 = 512 bytes
HOLD_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on the load's stream before the load starts


def _setup(seed=0, count=64):
    rng = np.random.default_rng(seed)
    src_np, src = make_view("PageFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("host", "torch"))
    dst_np, dst = make_view("LayerFirstList", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "torch"))
    si = rng.choice(T, count, replace=False).astype(np.int64)
    di = rng.choice(T, count, replace=False).astype(np.int64)
    return src_np, src, dst_np, dst, si, di


def _want(src_np, dst_np, si, di):
    reference.copy(src_np, dst_np, si, di, None)
    return [np.asarray(layer) for layer in dst_np.k]  # K of each layer, [T, H, D]


def _bytes(tensor):
    return tensor.cpu().numpy().view(np.uint8)


def test_a_stream_that_waits_for_a_layer_sees_it():
    src_np, src, dst_np, dst, si, di = _setup()
    want = _want(src_np, dst_np, si, di)
    loads, model = torch.cuda.Stream(), torch.cuda.Stream()
    snapshots = [torch.empty_like(k) for k in dst.k]
    early = torch.empty_like(dst.k[-1])
    signal = kv.LayerSignal(L)
    torch.cuda.synchronize()
    with torch.cuda.stream(loads):
        torch.cuda._sleep(HOLD_CYCLES)  # the load starts late: a read that does not wait sees poison
    done = kv.load_resident(src, dst, torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda(), signal=signal,
                            stream=loads)
    with torch.cuda.stream(model):
        early.copy_(dst.k[-1])  # no wait: before the load
        for layer in range(L):
            done.wait(layer, model)
            snapshots[layer].copy_(dst.k[layer])
    torch.cuda.synchronize()
    assert (_bytes(early) == POISON).all(), "the load ran before the read that did not wait: the test proves nothing"
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(snapshots[layer]), want[layer].view(np.uint8), err_msg=f"layer {layer}")
    assert done.landed() == L
    done.synchronize()


def test_host_indices():
    src_np, src, dst_np, dst, si, di = _setup(seed=1)
    want = _want(src_np, dst_np, si, di)
    done = kv.load_resident(src, dst, si, di)
    done.synchronize()
    for layer in range(L):
        np.testing.assert_array_equal(_bytes(dst.k[layer]), want[layer].view(np.uint8))


@pytest.mark.parametrize("waits", [False, True], ids=["loader", "loader-and-waits"])
def test_graph_capture(waits):
    """The loader captured on a side stream (and, with ``waits``, the main stream's waits and reads of every
    layer), replayed twice with new indices written in place."""
    src_np, src, dst_np, dst, si, di = _setup(seed=2)
    si_t, di_t = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    signal = kv.LayerSignal(L)
    snapshots = [torch.empty_like(k) for k in dst.k]
    kv.load_resident(src, dst, si_t, di_t, signal=signal).synchronize()  # the plan is built before the capture
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        done = kv.load_resident(src, dst, si_t, di_t, signal=signal, stream=side)
        if waits:
            for layer in range(L):
                done.wait(layer, main)
                snapshots[layer].copy_(dst.k[layer])
        main.wait_stream(side)
    rng = np.random.default_rng(5)
    for replay in range(2):
        si, di = rng.choice(T, len(si), replace=False), rng.choice(T, len(di), replace=False)
        si_t.copy_(torch.from_numpy(si))
        di_t.copy_(torch.from_numpy(di))
        for layer in dst.k + dst.v:
            layer.view(torch.uint8).fill_(POISON)
        fresh = [np.full_like(np.asarray(b), POISON * 257) for b in dst_np.k]
        fresh_v = [np.full_like(np.asarray(b), POISON * 257) for b in dst_np.v]
        want_np = kv.LayerFirst(fresh, fresh_v)
        reference.copy(src_np, want_np, si, di, None)
        graph.replay()
        torch.cuda.synchronize()
        assert signal.landed() == L
        for layer in range(L):
            np.testing.assert_array_equal(_bytes(dst.k[layer]), fresh[layer].view(np.uint8), err_msg=f"replay {replay}")
            if waits:
                np.testing.assert_array_equal(_bytes(snapshots[layer]), fresh[layer].view(np.uint8))
    kv.check_errors()
