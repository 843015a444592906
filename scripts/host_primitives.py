"""Host microseconds of the pieces a copy-engine call is made of, on a GPU: driver calls, torch attribute reads,
the compiled pass, the batch call, whole calls of ``transfer_kv_per_layer_direct_pf_lf`` (64 tokens, host and GPU
indices), and a cProfile of 2000 such calls. Each figure is the median over 15 groups of calls.

    python scripts/host_primitives.py        # torch on a GPU; pins 2 GiB of host memory

What a Python call of the copy-engine routes cannot do without, against what it spends (scripts/RESULTS.md,
"GPU index tensors on the copy-engine entry points").
"""
import cProfile
import ctypes
import io
import pstats
import statistics
import time

import numpy as np
import torch

import kvnumba as kv
from kvnumba.driver import batch_copy
from kvnumba.driver.bindings import cu
from kvnumba.driver.launch import stream_object
from kvnumba.plan import direct_fill

PAGES, LAYERS, PAGE, ITEM = 256, 32, 64, 2048


def timed(label, fn, calls=3000, groups=15):
    for _ in range(200):
        fn()
    per_call = []
    for _ in range(groups):
        start = time.perf_counter_ns()
        for _ in range(calls // groups):
            fn()
        per_call.append((time.perf_counter_ns() - start) / (calls // groups))
    print(f"{label:55s} {statistics.median(per_call) / 1000:7.3f} us", flush=True)


def attributes(host, layer):
    for name, x in (("host pool", host), ("gpu layer view", layer)):
        for attribute in ("data_ptr()", "shape", "dtype", "is_contiguous()", "nbytes", "_base", "get_device()",
                          "is_cuda"):
            getter = getattr(x, attribute[:-2]) if attribute.endswith("()") else (lambda a=attribute: getattr(x, a))
            timed(f"{name}.{attribute}", getter)


def main():
    torch.cuda.init()
    side = torch.cuda.Stream()
    handle = side.cuda_stream
    hosts = [torch.zeros(PAGES * LAYERS * PAGE * ITEM, dtype=torch.uint8).pin_memory().reshape(PAGES, LAYERS, PAGE,
                                                                                                 ITEM)
             for _ in range(2)]
    gpus = [torch.zeros(LAYERS, 4096, ITEM, dtype=torch.uint8, device="cuda") for _ in range(2)]
    layer = gpus[0][3]
    idx_host = torch.arange(PAGE, dtype=torch.int64).pin_memory()
    idx_gpu = idx_host.cuda()
    timed("a Python call that does nothing", lambda: None)
    timed("cuCtxGetCurrent", cu.cuCtxGetCurrent)
    stream = stream_object(handle)
    timed("cuStreamIsCapturing", lambda: cu.cuStreamIsCapturing(stream))
    timed("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
    attributes(hosts[0], layer)
    timed("gpu[3] (a fresh view)", lambda: gpus[0][3])
    timed("host index tensor .numpy()", idx_host.numpy)
    timed("GPU index tensor .cpu().numpy() (64)", lambda: idx_gpu.cpu().numpy())
    # the compiled pass and the batch call
    lf_idx = pf_idx = np.arange(PAGE, dtype=np.int64)
    params = np.array([PAGE, 4000, PAGES * PAGE, ITEM, LAYERS * PAGE * ITEM, PAGE * ITEM, 0], np.int64)
    bases, out = np.zeros((2, 1, 2), np.int64), np.zeros((3, PAGE), np.int64)
    timed("direct_fill.fill_pages (64 tokens)", lambda: direct_fill.fill_pages(lf_idx, pf_idx, params, bases, out))
    runtime = batch_copy.runtime()
    timed("batch_copy.runtime()", batch_copy.runtime)
    print("batch route", getattr(runtime, "route", None))
    batch = batch_copy.PreparedBatch(None, 0)  # two copies of 128 KiB, host -> GPU, on the side stream
    copies = batch.reserve(2)
    copies[0, :2] = [layer.data_ptr(), layer.data_ptr() + PAGE * ITEM]
    copies[1, :2] = [hosts[0].data_ptr(), hosts[0].data_ptr() + PAGE * ITEM]
    copies[2, :2] = PAGE * ITEM
    timed("PreparedBatch.submit (2 copies of 128 KiB)", lambda: batch.submit(2, handle), calls=1500)
    side.synchronize()
    cudart = runtime.cudart
    attrs = ctypes.byref(cudart.attributes(None, 0))
    timed("CudartBatch.call (2 copies)", lambda: cudart.call(batch.pointers, 2, attrs, handle), calls=1500)
    side.synchronize()

    def call(indices):
        kv.transfer_kv_per_layer_direct_pf_lf(hosts, [gpus[0][3], gpus[1][3]], indices, indices, 3, PAGE, stream=side)

    timed("transfer_kv_per_layer_direct_pf_lf, 64 tokens, host indices", lambda: call(idx_host), calls=1500)
    side.synchronize()
    timed("transfer_kv_per_layer_direct_pf_lf, 64 tokens, GPU indices", lambda: call(idx_gpu), calls=1500)
    side.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        call(idx_host)
    profile.disable()
    side.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())


if __name__ == "__main__":
    main()
