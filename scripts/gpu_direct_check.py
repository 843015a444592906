"""GPU check of the three copy-engine entry points on torch tensors (needs a CUDA GPU and torch).

Runs ``transfer_kv_all_layer_direct_lf_pf`` (GPU -> pinned host), ``transfer_kv_per_layer_direct_pf_lf``
(pinned host -> GPU, every layer) and ``transfer_kv_direct`` on a side stream (``torch.cuda.Stream()``),
at HiCache's shape (8192 tokens, page 128, 32 layers, 2048-byte items: 4096 copies in one batch), plus
a page-1 case (many copies), MLA, and calls on the legacy default stream, which must fall back to page
copies and never crash. Every destination byte is checked against ``kvnumba.reference``. Prints the
path taken (batch or page), the host time per call and GB/s from CUDA events (bytes moved once: each
byte crosses PCIe once).

    python scripts/gpu_direct_check.py            # about 20-40 s
"""
import argparse
import sys
import time

import numpy as np

POISON = 0xA5


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--page-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--item", type=int, default=2048, help="bytes per token per layer (bf16 elements x 2)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    import kvnumba
    from kvnumba import reference
    from kvnumba.api import direct
    from kvnumba.driver import batch_copy

    print(f"kvnumba from {kvnumba.__file__}")
    rt = batch_copy.runtime()
    print(f"cuda-bindings major {rt.binding_major}, driver {rt.driver_version}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), {torch.cuda.get_device_name()}")
    print(f"batch call usable on a side stream: {batch_copy.batch_copy_available()}; "
          f"on the legacy default stream: {batch_copy.batch_copy_available(0)}")
    failures = []

    def check(name, got, want):
        same = all(np.array_equal(g, w) for g, w in zip(got, want))
        print(f"  bytes {'OK' if same else 'DIFFER'}")
        if not same:
            failures.append(name)

    def timed(name, fn, nbytes, stream, repeats=args.repeats):
        """Run fn once (checked by the caller), then ``repeats`` times: host time per call and GB/s."""
        host, device = [], []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record()
                t = time.perf_counter()
                fn()
                host.append(time.perf_counter() - t)
                end.record()
            end.synchronize()
            device.append(start.elapsed_time(end) / 1e3)
        h, d = float(np.median(host)), float(np.median(device))
        print(f"{name}: path={direct.last_path()} host {h * 1e6:9.1f} us/call, {nbytes / 2**20:8.1f} MiB in "
              f"{d * 1e3:7.2f} ms = {nbytes / d / 1e9:6.1f} GB/s (events, host time included)")

    def as_bytes(t):
        return t.detach().cpu().contiguous().view(torch.uint8).numpy()

    elems = args.item // 2
    side = torch.cuda.Stream()
    gen = np.random.default_rng(0)

    def lf_layers(n, pool, elems=elems):
        return [torch.randint(-30000, 30000, (pool, elems), dtype=torch.int16, device="cuda").view(torch.bfloat16)
                for _ in range(n)]

    def pf_pool(kinds, pages, layers, page, elems=elems):
        out = [torch.empty((pages, layers, page, elems), dtype=torch.bfloat16, pin_memory=True) for _ in range(kinds)]
        for t in out:
            t.view(torch.uint8).fill_(POISON)
        return out

    def paged(pages_pool, pages, page):
        starts = gen.choice(pages_pool, pages, replace=False) * page
        return (starts[:, None] + np.arange(page)).reshape(-1).astype(np.int64)

    def run_lf_pf(label, tokens, page, layers, kinds, elems=elems, stream=side, explicit=None,
                  repeats=args.repeats):
        pages = tokens // page
        lf = lf_layers(kinds * layers, tokens, elems)
        pf = pf_pool(kinds, pages, layers, page, elems)
        s = torch.from_numpy(paged(pages, pages, page)).cuda()
        d = torch.from_numpy(paged(pages, pages, page))  # host indices
        torch.cuda.synchronize()
        call = (lambda: kvnumba.transfer_kv_all_layer_direct_lf_pf(lf, pf, s, d, page, stream=explicit))
        t = time.perf_counter()
        with torch.cuda.stream(stream):
            call()
        first = time.perf_counter() - t
        torch.cuda.synchronize()
        copies = pages * layers * kinds
        print(f"{label}: {copies} copies, first call path={direct.last_path()} host {first * 1e3:.2f} ms")
        want = [np.full_like(as_bytes(p), POISON) for p in pf]
        reference.transfer_kv_all_layer_direct_lf_pf([as_bytes(x) for x in lf], want, s.cpu().numpy(), d.numpy(), page)
        check(label, [as_bytes(p) for p in pf], want)
        timed(label, call, copies * page * elems * 2, stream, repeats)
        return lf, pf

    t0 = time.perf_counter()
    T, P, L = args.tokens, args.page_size, args.layers
    # 1. all-layer backup GPU -> pinned host, side stream (the batch path)
    lf, pf = run_lf_pf(f"lf->pf D2H {T} tok, page {P}, {L} layers, side stream", T, P, L, 2)

    # 2. per-layer load pinned host -> GPU, every layer, side stream
    pages = T // P
    back = lf_layers(2 * L, T)
    for b in back:
        b.view(torch.int16).fill_(-1)
    s = torch.from_numpy(paged(pages, pages, P))
    d = torch.from_numpy(paged(pages, pages, P)).cuda()
    torch.cuda.synchronize()

    def load_all():
        for layer in range(L):
            kvnumba.transfer_kv_per_layer_direct_pf_lf(pf, [back[layer], back[L + layer]], s, d, layer, P)

    with torch.cuda.stream(side):
        load_all()
    torch.cuda.synchronize()
    print(f"pf->lf H2D per layer x {L}: {pages * 2} copies per call, path={direct.last_path()}")
    pf_np = [as_bytes(p) for p in pf]
    want = [np.full_like(as_bytes(b), 0xFF) for b in back]
    for layer in range(L):
        reference.transfer_kv_per_layer_direct_pf_lf(pf_np, [want[layer], want[L + layer]], s.numpy(),
                                                     d.cpu().numpy(), layer, P)
    check("pf->lf", [as_bytes(b) for b in back], want)
    timed(f"pf->lf H2D {L} per-layer calls (numbers per {L} calls)", load_all, T * L * 2 * args.item, side)

    # 3. many small copies: page 1 (one batch of tokens x layers x 2 copies) and MLA (1152-byte items)
    run_lf_pf(f"lf->pf D2H page 1, 2048 tok, {L} layers", 2048, 1, L, 2, repeats=3)
    run_lf_pf(f"MLA lf->pf D2H {T} tok, page {P}, {L} layers, item 1152 B", T, P, L, 1, elems=576)

    # 4. transfer_kv_direct: runs of whole pages (merged) and scattered tokens, GPU -> pinned host
    host_layers = [torch.empty((T, elems), dtype=torch.bfloat16, pin_memory=True) for _ in range(2 * L)]
    for label, (si, di) in {
        "pages (merged runs)": (paged(pages, pages, P), paged(pages, pages, P)),
        "256 scattered tokens": (gen.choice(T, 256, replace=False), gen.choice(T, 256, replace=False)),
    }.items():
        for h in host_layers:
            h.view(torch.uint8).fill_(POISON)
        si, di = torch.from_numpy(si.astype(np.int64)).cuda(), torch.from_numpy(di.astype(np.int64)).cuda()
        call = (lambda: kvnumba.transfer_kv_direct(lf, host_layers, si, di, 1))
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            call()
        torch.cuda.synchronize()
        print(f"transfer_kv_direct D2H {label}, {2 * L} layers")
        want = [np.full_like(as_bytes(h), POISON) for h in host_layers]
        reference.transfer_kv_direct([as_bytes(x) for x in lf], want, si.cpu().numpy(), di.cpu().numpy(), 1)
        check(label, [as_bytes(h) for h in host_layers], want)
        timed(f"transfer_kv_direct {label}", call, len(si) * 2 * L * args.item, side, repeats=3)

    # 5. the legacy default stream: the seed's batch path segfaults here; kvnumba falls back
    for label, stream, explicit in (("torch default stream (stream=None)", torch.cuda.default_stream(), None),
                                    ("stream=0", side, 0), ("stream=1 (cudaStreamLegacy)", side, 1)):
        run_lf_pf(f"legacy default stream, {label}, 1024 tok, page 64", 1024, 64, 4, 2, stream=stream,
                  explicit=explicit)
        if direct.last_path() != "page":
            failures.append(f"legacy {label}: path {direct.last_path()}")

    print(f"path counts {direct.path_counts()}; total {time.perf_counter() - t0:.1f} s")
    print("FAILED: " + ", ".join(failures) if failures else "ALL OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
