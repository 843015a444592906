"""Per-layer loads beside compute, as a timeline: CUDA events of every load and every layer's compute, saved as
JSON for notebooks/08_why_offload.ipynb to draw. Needs torch on a GPU.

    python scripts/timeline.py --commit $(git rev-parse --short HEAD) --machine "one H200, PCIe Gen5 x16"

HiCache's pattern: layer ``l``'s load runs on a load stream; the model's layer ``l`` (here one bf16 GEMM of
``--gemm`` cubed) waits for it on the compute stream, so layer ``l + 1`` loads while layer ``l`` computes. Each
route is timed twice after a warm-up (kernels compiled, plans built outside the timed run):

- ``overlapped``: loads and compute on their own streams, as above;
- ``serial``: every load and every GEMM on one stream, one after the other (the puzzle: nothing overlaps).

Routes: ``kernel`` (``transfer_kv_per_layer_pf_lf`` from a page-first pool: 2 KiB rows, read by the SMs),
``copy engine, long runs`` (``kv.copy(..., route="copy_engine")`` from a layer-first pool: one run a 64-token
page per layer, K and V), ``copy engine, 2 KiB rows`` (the same from the page-first pool: one copy a row).
Also the host->device GB/s of one large copy from pageable and from pinned memory (torch ``.to("cuda")``).

Writes ``scripts/results/<card>-<date>-timeline-<commit>.json`` (``--out`` to choose): the meta (date, commit,
device, machine, versions, sizes) and, per route and mode, every event's start and end in ms from the first.
"""
import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ITEM, PAGE = 2048, 64  # 8 KV heads x 128 x bf16: one token's K of one layer of Llama-3.1-8B


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _pages(rng, pool, tokens):
    pages = rng.choice(pool // PAGE, tokens // PAGE, replace=False)
    return (pages[:, None] * PAGE + np.arange(PAGE)).reshape(-1).astype(np.int64)


def routes(torch, kv, layers, tokens):
    """``{name: load(layer)}`` on pinned host pools of ``2 * tokens`` slots and per-layer GPU caches."""
    pool = 2 * tokens
    rng = np.random.default_rng(0)
    host = [torch.empty(pool * layers * ITEM, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    for h in host:
        h.view(torch.int64).random_()
    gpu = [torch.empty(layers, pool, ITEM, dtype=torch.uint8, device="cuda") for _ in range(2)]
    src, dst = _pages(rng, pool, tokens), _pages(rng, pool, tokens)
    si, di = torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda()
    si_cpu, di_cpu = torch.from_numpy(src).pin_memory(), torch.from_numpy(dst).pin_memory()
    pf = [h.view(pool, layers, ITEM) for h in host]
    lf = [h.view(layers, pool, ITEM) for h in host]
    (gk, gv), (pk, pv) = gpu, pf
    lf_views = kv.LayerFirst(*lf), kv.LayerFirst(*gpu)
    pf_views = kv.PageFirst(*pf), kv.LayerFirst(*gpu)
    return {
        "kernel": lambda l: kv.transfer_kv_per_layer_pf_lf(pk, gk[l], pv, gv[l], si, di, l, ITEM, layers * ITEM),
        "copy engine, long runs": lambda l: kv.copy(*lf_views, si_cpu, di_cpu, l, route="copy_engine"),
        "copy engine, 2 KiB rows": lambda l: kv.copy(*pf_views, si_cpu, di_cpu, l, route="copy_engine"),
    }


def timeline(torch, load, gemm, layers, overlapped):
    """Every load's and every layer's (start, end) in ms from the first event. Both streams are side streams: the
    copy engine's batch call cannot run on the legacy default stream (docs/guides/copy-engines.md)."""
    a, b = (torch.randn(gemm, gemm, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    c = torch.empty_like(a)
    torch.cuda.synchronize()
    compute = torch.cuda.Stream()
    loads = torch.cuda.Stream() if overlapped else compute

    def event():
        return torch.cuda.Event(enable_timing=True)

    def layer_compute():
        start, end = event(), event()
        with torch.cuda.stream(compute):
            start.record(compute)
            torch.matmul(a, b, out=c)
            end.record(compute)
        marks["compute"].append((start, end))

    first = event()
    first.record(compute)
    loads.wait_stream(compute)
    marks = {"load": [], "compute": []}
    done = []
    for layer in range(layers):  # the loads, queued first (as HiCache queues them ahead of the model)
        with torch.cuda.stream(loads):
            start, end = event(), event()
            start.record(loads)
            load(layer)
            end.record(loads)
        marks["load"].append((start, end))
        done.append(end)
        if not overlapped:  # one stream: the layer's compute right after its load
            layer_compute()
    if overlapped:
        for layer in range(layers):
            compute.wait_event(done[layer])  # layer l computes once its KV is in
            layer_compute()
    torch.cuda.synchronize()
    return {kind: [(first.elapsed_time(s), first.elapsed_time(e)) for s, e in pairs] for kind, pairs in marks.items()}


def copy_gbps(torch, nbytes, repeats=5):
    """GB/s of one host->device copy of ``nbytes`` from pageable and from pinned memory (median of ``repeats``)."""
    out = {}
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for kind, pinned in (("pageable", False), ("pinned", True)):
        source = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out[kind] = nbytes / (float(np.median(times[1:])) * 1e-3) / 1e9
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens each layer's load moves (pages of 64)")
    parser.add_argument("--gemm", type=int, default=6144, help="a layer's compute: one bf16 GEMM of this size cubed")
    parser.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse --short HEAD)")
    parser.add_argument("--machine", default="", help="the machine, in words (the notebook prints it)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import kvnumba as kv
    from kvnumba.driver.target import SIMULATOR

    if SIMULATOR:
        sys.exit("timeline.py needs a GPU (CUDA events): on the simulator there is no timeline to take")
    import torch

    device = torch.cuda.get_device_name()
    commit = args.commit or _commit()
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    card = device.split()[-1].lower()
    out = args.out or ROOT / "scripts" / "results" / f"{card}-{date}-timeline-{commit}.json"
    records = []
    for name, load in routes(torch, kv, args.layers, args.tokens).items():
        for overlapped in (True, False):
            try:
                timeline(torch, load, args.gemm, args.layers, overlapped)  # warm-up: compile, plan, clocks up
                marks = timeline(torch, load, args.gemm, args.layers, overlapped)
            except Exception as error:  # noqa: BLE001 - a route this machine refuses is recorded, not fatal
                records.append({"route": name, "mode": "overlapped" if overlapped else "serial",
                                "error": f"{type(error).__name__}: {error}"})
                print(f"{name:26s} failed: {records[-1]['error']}")
                continue
            records.append({"route": name, "mode": "overlapped" if overlapped else "serial", **marks})
            end = max(e for pairs in marks.values() for _, e in pairs)
            print(f"{name:26s} {records[-1]['mode']:10s} {end:8.2f} ms")
    copies = copy_gbps(torch, 256 << 20)
    print("host->device, 256 MiB:", ", ".join(f"{k} {v:.1f} GB/s" for k, v in copies.items()))
    meta = {"date": date, "commit": commit, "device": device, "machine": args.machine, "clock": "CUDA events",
            "kvnumba": kv.__version__, "torch": torch.__version__, "layers": args.layers, "tokens": args.tokens,
            "item_bytes": ITEM, "page": PAGE, "gemm": args.gemm,
            "load_bytes": 2 * args.tokens * ITEM, "source": "python scripts/timeline.py"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "records": records, "copy_gbps": copies}, indent=1) + "\n")
    print("saved", out)


if __name__ == "__main__":
    main()
