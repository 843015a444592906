"""CUDA graph capture (torch.cuda.graph), on a GPU: every kernel entry point and kv.copy, plain and prepared,
captured once and replayed with new indices written into the same index tensors; every destination byte
checked against the reference after each replay (destinations poisoned again before it)."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS
from tests.helpers.cases import POISON, Case, _args, _buffers, _draw_indices
from tests.helpers.placement import TORCH_PLACE
from tests.helpers.view_cases import make_view, view_bytes

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

# Per-layer loads from pinned host memory (HiCache's), everything else device to device.
PLACES = {name: ("host", "device") if SPECS[name].one_layer and SPECS[name].src_layout.value in ("pf", "ph")
          else ("device", "device") for name in KERNEL_ENTRY_POINTS}


def _case(op, seed):
    src_place, dst_place = PLACES[op]
    paged = SPECS[op].src_layout.value == "ph" or SPECS[op].dst_layout.value == "ph"
    return Case(op, item_size=256, num_layers=3, page_size=4 if paged else 1, head_num=2 if paged else 1, pool=64,
                count=16, paged=paged, src_place=src_place, dst_place=dst_place, seed=seed, layer_id=1,
                num_warps_per_block=4)


def _placed(side, where):
    return None if side is None else [TORCH_PLACE[where](b) for b in side]


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
@pytest.mark.parametrize("op", KERNEL_ENTRY_POINTS)
def test_a_captured_transfer_follows_new_indices(op, prepared):
    c = _case(op, seed=3)
    rng = np.random.default_rng(c.seed)
    src = _buffers(c.layouts[0], c, rng, poison=False)
    dst = _buffers(c.layouts[1], c, rng, poison=True)
    gpu_src = [_placed(side, c.src_place) for side in src]
    gpu_dst = [_placed(side, c.dst_place) for side in dst]
    si_t = torch.from_numpy(_draw_indices(c, rng)).cuda()
    di_t = torch.from_numpy(_draw_indices(c, rng)).cuda()
    args = _args(c, gpu_src, gpu_dst, si_t, di_t, tables=kv.layer_table)
    spec = SPECS[op]
    named = dict(zip(spec.params, args))
    call_names = [n for n in ("src_indices", "dst_indices", "layer_id") if n in spec.params]
    if prepared:
        transfer = kv.prepare(op, **{n: v for n, v in named.items() if n not in call_names})

        def run():
            transfer(*[named[n] for n in call_names])
    else:
        def run():
            getattr(kv, op)(*args)

    run()  # the plan is built outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for replay in range(2):
        si, di = _draw_indices(c, rng), _draw_indices(c, rng)
        si_t.copy_(torch.from_numpy(si))
        di_t.copy_(torch.from_numpy(di))
        for side in gpu_dst:
            for buffer in side or ():
                buffer.fill_(POISON)
        want = [None if side is None else [np.full_like(b, POISON) for b in side] for side in dst]
        getattr(reference, op)(*_args(c, src, want, si, di, tables=lambda bufs: bufs))
        graph.replay()
        torch.cuda.synchronize()
        for got_side, want_side in zip(gpu_dst, want):
            for got, expected in zip(got_side or (), want_side or ()):
                np.testing.assert_array_equal(got.cpu().numpy().view(np.uint8).reshape(expected.shape), expected,
                                              err_msg=f"{op} replay {replay}")
    kv.check_errors()


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
@pytest.mark.parametrize("pair", [("PageFirst", "VllmFlashAttn"), ("PageHead", "LayerFirstList")])
def test_a_captured_copy_follows_new_indices(pair, prepared):
    L, T, P, H, D = 3, 32, 4, 2, 64
    rng = np.random.default_rng(4)
    src_np, src = make_view(pair[0], L, T, P, H, D, rng, poison=False, mla=False, place=("host", "torch"))
    dst_np, dst = make_view(pair[1], L, T, P, H, D, rng, poison=True, mla=False, place=("device", "torch"))
    si_t = torch.from_numpy(rng.choice(T, 8, replace=False).astype(np.int64)).cuda()
    di_t = torch.from_numpy(rng.choice(T, 8, replace=False).astype(np.int64)).cuda()
    transfer = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=range(1, 3)) if prepared else None

    def run():
        if prepared:
            transfer(si_t, di_t)
        else:
            kv.copy(src, dst, si_t, di_t, range(1, 3))

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    si, di = (rng.choice(T, 8, replace=False).astype(np.int64) for _ in range(2))
    si_t.copy_(torch.from_numpy(si))
    di_t.copy_(torch.from_numpy(di))
    for which in ("k", "v"):
        for buffer in dst.buffers(which):
            buffer.view(torch.uint8).fill_(POISON)  # the warm-up's copies gone: what follows is the replay's alone
    graph.replay()
    torch.cuda.synchronize()
    reference.copy(src_np, dst_np, si, di, range(1, 3))
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
