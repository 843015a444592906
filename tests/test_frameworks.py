"""torch, CuPy and Numba arrays as users pass them, and the stream a call runs on.

On a GPU: CUDA and pinned torch tensors, CuPy arrays and streams, Numba device arrays and streams.
On the simulator the same calls run with CPU torch tensors and the simulator's Numba arrays and
streams (which stand for GPU memory there, as NumPy arrays do); what only a GPU has (torch's
current stream, CuPy) is marked ``gpu``. torch and CuPy are optional: their tests skip without them.
"""
import numpy as np
import pytest

import kvnumba
from kvnumba import reference
from tests.helpers.placement import TORCH_PLACE, to_numpy

pytestmark = pytest.mark.needs_target

T, L, ITEM = 256, 4, 256
POISON = 0xA5


def _data(rng):
    return rng.integers(0, 256, (L, T, ITEM), dtype=np.uint8)


def _backup_case(rng):
    """Layer-first K/V of L layers, and the token slots of a backup: source on the GPU side, destination
    in the page-first host pool."""
    k, v = _data(rng), _data(rng)
    si = rng.choice(T, 64, replace=False).astype(np.int64)
    di = rng.choice(T, 64, replace=False).astype(np.int64)
    want_k = np.full((T, L, ITEM), POISON, np.uint8)
    want_v = want_k.copy()
    reference.transfer_kv_all_layer_lf_pf(list(k), want_k, list(v), want_v, si, di, ITEM, L * ITEM, L)
    return k, v, si, di, want_k, want_v


def test_torch_backup_and_load_back():
    """All layers backed up into a page-first host pool, then one layer loaded back through bf16 views;
    torch index tensors on the GPU side."""
    torch = pytest.importorskip("torch")
    dev, host = TORCH_PLACE["device"], TORCH_PLACE["host"]
    k, v, si, di, want_k, want_v = _backup_case(np.random.default_rng(0))
    gpu_k, gpu_v = [dev(k[i]) for i in range(L)], [dev(v[i]) for i in range(L)]
    host_k, host_v = host(np.full((T, L, ITEM), POISON, np.uint8)), host(np.full((T, L, ITEM), POISON, np.uint8))
    kvnumba.transfer_kv_all_layer_lf_pf(kvnumba.layer_table(gpu_k), host_k, kvnumba.layer_table(gpu_v), host_v,
                                        dev(si), dev(di), ITEM, L * ITEM, L)
    np.testing.assert_array_equal(to_numpy(host_k), want_k)
    np.testing.assert_array_equal(to_numpy(host_v), want_v)

    out_k, out_v = dev(np.zeros((T, ITEM), np.uint8)).view(torch.bfloat16), dev(np.zeros((T, ITEM), np.uint8))
    kvnumba.transfer_kv_per_layer_pf_lf(host_k.view(torch.bfloat16), out_k, host_v.view(torch.bfloat16),
                                        out_v.view(torch.bfloat16), dev(di), dev(si), 2, ITEM, L * ITEM)
    np.testing.assert_array_equal(to_numpy(out_k.view(torch.uint8))[si], k[2][si])
    np.testing.assert_array_equal(to_numpy(out_v)[si], v[2][si])
    untouched = np.setdiff1d(np.arange(T), si)
    assert (to_numpy(out_v)[untouched] == 0).all()


@pytest.mark.gpu
def test_torch_runs_on_torchs_current_stream():
    """A backup issued inside ``torch.cuda.stream(side)``: waiting on ``side`` alone is enough."""
    torch = pytest.importorskip("torch")
    k, v, si, di, want_k, want_v = _backup_case(np.random.default_rng(1))
    gpu_k = [torch.from_numpy(k[i]).cuda() for i in range(L)]
    gpu_v = [torch.from_numpy(v[i]).cuda() for i in range(L)]
    host_k = torch.full((T, L, ITEM), POISON, dtype=torch.uint8).pin_memory()
    host_v = torch.full((T, L, ITEM), POISON, dtype=torch.uint8).pin_memory()
    src, dst = torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kvnumba.transfer_kv_all_layer_lf_pf(kvnumba.layer_table(gpu_k), host_k, kvnumba.layer_table(gpu_v), host_v,
                                            src, dst, ITEM, L * ITEM, L)
    side.synchronize()
    np.testing.assert_array_equal(host_k.numpy(), want_k)
    np.testing.assert_array_equal(host_v.numpy(), want_v)


@pytest.mark.gpu
def test_cupy_arrays_and_stream():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, (T, ITEM), dtype=np.uint8)
    si = rng.choice(T, 40, replace=False).astype(np.int64)
    di = rng.choice(T, 40, replace=False).astype(np.int64)
    dst = cp.zeros((T, ITEM), dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    kvnumba.transfer_kv_per_layer_mla(cp.asarray(src), dst, cp.asarray(si), cp.asarray(di), ITEM, stream=stream)
    stream.synchronize()
    want = np.zeros_like(src)
    reference.transfer_kv_per_layer_mla(src, want, si, di, ITEM)
    np.testing.assert_array_equal(dst.get(), want)


def test_numba_arrays_stream_and_host_indices():
    from numba import cuda

    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (T, ITEM), dtype=np.uint8)
    si = rng.choice(T, 40, replace=False).astype(np.int64)
    di = rng.choice(T, 40, replace=False).astype(np.int64)
    dst = cuda.to_device(np.zeros_like(src))
    stream = cuda.stream()
    # NumPy (pageable) indices are copied to the device by kvnumba.
    kvnumba.transfer_kv_per_layer_mla(cuda.to_device(src), dst, si, di, ITEM, stream=stream)
    stream.synchronize()
    want = np.zeros_like(src)
    reference.transfer_kv_per_layer_mla(src, want, si, di, ITEM)
    np.testing.assert_array_equal(dst.copy_to_host(), want)
