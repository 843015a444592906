"""torch, CuPy and Numba arrays as users pass them on a GPU, and torch's current stream.

These need a real GPU and the framework; on the simulator they are skipped (NumPy stands for
every kind of memory there, and is covered by every other test).
"""
import numpy as np
import pytest

import kvnumba
from kvnumba import reference
from placement import ON_GPU

pytestmark = pytest.mark.skipif(not ON_GPU, reason="needs a real GPU")

T, L, ITEM = 256, 4, 256


def _data(rng):
    return rng.integers(0, 256, (L, T, ITEM), dtype=np.uint8)


def test_torch_backup_and_load_follow_current_stream():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    k, v = _data(rng), _data(rng)
    si = rng.choice(T, 64, replace=False).astype(np.int64)
    di = rng.choice(T, 64, replace=False).astype(np.int64)
    gpu_k = [torch.from_numpy(k[i]).cuda() for i in range(L)]
    gpu_v = [torch.from_numpy(v[i]).cuda() for i in range(L)]
    host_k = torch.full((T, L, ITEM), 0xA5, dtype=torch.uint8).pin_memory()
    host_v = torch.full((T, L, ITEM), 0xA5, dtype=torch.uint8).pin_memory()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kvnumba.transfer_kv_all_layer_lf_pf(kvnumba.layer_table(gpu_k), host_k, kvnumba.layer_table(gpu_v), host_v,
                                            torch.from_numpy(si).cuda(), torch.from_numpy(di).cuda(), ITEM,
                                            L * ITEM, L)
    side.synchronize()
    want_k = np.full((T, L, ITEM), 0xA5, np.uint8)
    want_v = want_k.copy()
    reference.transfer_kv_all_layer_lf_pf(list(k), want_k, list(v), want_v, si, di, ITEM, L * ITEM, L)
    np.testing.assert_array_equal(host_k.numpy(), want_k)
    np.testing.assert_array_equal(host_v.numpy(), want_v)

    # per-layer load back, bf16 views, into fresh device buffers
    out_k = torch.zeros((T, ITEM // 2), dtype=torch.bfloat16, device="cuda")
    out_v = torch.zeros_like(out_k)
    kvnumba.transfer_kv_per_layer_pf_lf(host_k.view(torch.bfloat16), out_k, host_v.view(torch.bfloat16), out_v,
                                        torch.from_numpy(di).cuda(), torch.from_numpy(si).cuda(), 2, ITEM, L * ITEM)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out_k.view(torch.uint8).cpu().numpy()[si], k[2][si])
    np.testing.assert_array_equal(out_v.view(torch.uint8).cpu().numpy()[si], v[2][si])


def test_cupy_arrays_and_stream():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(1)
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


def test_numba_stream_and_host_indices():
    from numba import cuda

    rng = np.random.default_rng(2)
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
