"""FP8 and bf16 one-layer loads (8192 tokens in random 64-token pages, 8 heads of 128, layer 3) from pinned host
caches in three layouts (page-first, layer-first, page-first-direct) into the GPU's per-layer arrays (a layer
table), at ``block_quota`` 4 and 2: does the host layout (a token's one-layer run of 1 KB codes in a 32 KB row,
page-first) bound the FP8 load? Each FP8 call is checked bit for bit on 32 tokens against
``kvnumba.quant_reference`` before it is timed. Prints GB/s of bf16 bytes, link GB/s and host microseconds per
call of the FP8 load, and GB/s of the bf16 load (``route="kernel"``) beside it. A GPU and torch only.

    python scripts/fp8_load_layouts.py [--only pf lf pfd] [--no-bf16] [--reps N]

``--only``: the layouts run; ``--no-bf16``: no bf16 row; ``--reps N``: N untimed FP8 loads at ``block_quota=2`` and
no timing, for a profiler (e.g. Nsight Compute). Results: scripts/RESULTS.md (2026-12-02)."""
import argparse

import numpy as np
import torch
import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.tools.timing import gpu_time, host_time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--only", nargs="+", default=["pf", "lf", "pfd"], choices=["pf", "lf", "pfd"])
parser.add_argument("--no-bf16", action="store_true")
parser.add_argument("--reps", type=int, default=0)
args = parser.parse_args()
ONLY, REPS = args.only, args.reps

T, L, H, D, P, N, LAYER = 16384, 32, 8, 128, 64, 8192, 3  # pool tokens, layers, heads, head size, page, tokens moved
WARPS = 32
rng = np.random.default_rng(0)
dev = [[torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(L)] for _ in range(2)]
device = kv.LayerFirst(*dev)
codes_raw = [torch.from_numpy(rng.integers(0, 256, T * L * H * D, dtype=np.uint8) & 0xF7).pin_memory()  # no NaN code
             for _ in range(2)]
scales_raw = [torch.from_numpy(rng.uniform(0.01, 2, T * L * H).astype(np.float32)).pin_memory() for _ in range(2)]
bf16_raw = [torch.empty(T * L * H * D, dtype=torch.bfloat16).pin_memory() for _ in range(2)]
for b in bf16_raw:
    b.normal_()
shapes = {"pf": (kv.PageFirst, lambda n: (T, L, H, n), lambda t: (t, LAYER)),
          "lf": (kv.LayerFirst, lambda n: (L, T, H, n), lambda t: (LAYER, t)),
          "pfd": (kv.PageFirstDirect, lambda n: (T // P, L, P, H, n), lambda t: (t // P, LAYER, t % P))}
pages = rng.choice(T // P, 2 * N // P, replace=False)
src_idx = ((pages[:N // P, None] * P + np.arange(P)).reshape(-1)).astype(np.int64)
dst_idx = ((pages[N // P:, None] * P + np.arange(P)).reshape(-1)).astype(np.int64)
si, di = torch.from_numpy(src_idx).cuda(), torch.from_numpy(dst_idx).cuda()
sample = np.sort(rng.choice(N, 32, replace=False))
for name, (cls, shape, at) in shapes.items():
    if name not in ONLY:
        continue
    codes = [c.view(*shape(D)) for c in codes_raw]
    scales = [s.view(*shape(1)) for s in scales_raw]
    fp8 = kv.Fp8View(cls(*codes), cls(*scales), "e4m3")
    bf16 = cls(*(b.view(*shape(D)) for b in bf16_raw))
    for bq in (4, 2):
        launch = dict(block_quota=bq, num_warps_per_block=WARPS)
        call = lambda: kv.copy(fp8, device, si, di, LAYER, **launch)
        if REPS:  # for a profiler: REPS calls at bq=2, no timing
            if bq == 2:
                for _ in range(REPS):
                    call()
                torch.cuda.synchronize()
            continue
        for d in dev:
            d[LAYER].fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        for which in range(2):
            for j in sample:
                t, u = int(src_idx[j]), int(dst_idx[j])
                want = qr.dequantise(codes[which][at(t)].numpy(), scales[which][at(t)].numpy(), "bfloat16", "e4m3")
                got = dev[which][LAYER][u].cpu().view(torch.int16).numpy().view(np.uint16)
                assert np.array_equal(got, want.view(np.uint16)), (name, bq, which, j)
        fp8_s = gpu_time(call, 10, groups=5, warmup=2)
        fp8_h = host_time(call, 50, groups=3)
        bcall = lambda: kv.copy(bf16, device, si, di, LAYER, route="kernel", **launch)
        bf_s = gpu_time(bcall, 10, groups=5, warmup=2) if not args.no_bf16 else float("nan")
        gb = N * 2 * H * D * 2 / 1e9
        link = N * 2 * (H * D + 4 * H) / 1e9
        print(f"{name:4} bq={bq} fp8 {gb / fp8_s:6.1f} GB/s of bf16 ({link / fp8_s:5.1f} link) "
              f"host {fp8_h * 1e6:5.1f} us"
              f" | bf16 kernel {gb / bf_s:6.1f} GB/s  verified", flush=True)
