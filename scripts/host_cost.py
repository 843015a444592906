"""Host microseconds per call, on a GPU: where a call's time goes, from the launch floor up.

    python scripts/host_cost.py --reference /path/to/seedref.so [--profile]

For a few-token (one page: host time is the whole cost) per-layer load and an MLA load, with torch
tensors as SGLang passes them, it times back-to-back calls (median of groups, no synchronisation
inside a group) of:

- ``launch``: the prepared transfer's own ``cuLaunchKernel`` with its parameter block already
  written (``BoundKernel.launch``): the floor any Python launcher of this kernel has here;
- ``prepared``: ``kv.prepare(...)`` then ``transfer(src_indices, dst_indices, layer_id)``;
- ``plain``: the plain entry point, its plan cached (the same pool tensors every call);
- ``miss``: the plain entry point with its plan cache emptied first (full validation);
- ``seed``: the reference implementation's call (``--reference``), same buffers.

``--profile`` adds a cProfile of prepared and plain calls (top functions by own time).
"""
import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvnumba as kv  # noqa: E402
from kvnumba.api.transfer import plain  # noqa: E402
from kvnumba.config import batch_copy_route  # noqa: E402
from kvnumba.tools.timing import host_time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import load_reference  # noqa: E402


def per_call(fn, calls=50, groups=21):
    """Host us per call: 20 warm-up calls, then the median of ``groups`` groups of ``calls`` back to back."""
    return host_time(fn, calls, groups=groups, warmup=20) * 1e6


def cases(torch, tokens=64, layers=32, pool=32768):
    dev = torch.device("cuda")
    item, mla_item = 2048, 1152
    host_k = torch.zeros((pool, layers, item), dtype=torch.uint8).pin_memory()
    host_v = torch.zeros_like(host_k).pin_memory()
    dk = torch.zeros((pool, item), dtype=torch.uint8, device=dev)
    dv = torch.zeros_like(dk)
    host_mla = torch.zeros((pool, layers, mla_item), dtype=torch.uint8).pin_memory()
    dmla = torch.zeros((pool, mla_item), dtype=torch.uint8, device=dev)
    si = torch.arange(tokens, dtype=torch.int64, device=dev) + 640
    di = torch.arange(tokens, dtype=torch.int64, device=dev) + 128
    return {
        "per_layer_pf_lf 64tok h2d": ("transfer_kv_per_layer_pf_lf",
                                      dict(src_k=host_k, dst_k=dk, src_v=host_v, dst_v=dv, item_size=item,
                                           src_layout_dim=layers * item), (si, di, 3)),
        "per_layer_mla_pf_lf 64tok h2d": ("transfer_kv_per_layer_mla_pf_lf",
                                          dict(src=host_mla, dst=dmla, item_size=mla_item,
                                               src_layout_dim=layers * mla_item), (si, di, 3)),
        "per_layer_mla 64tok d2d": ("transfer_kv_per_layer_mla", dict(src=dmla, dst=torch.zeros_like(dmla),
                                                                     item_size=mla_item), (si, di)),
    }


def batch_routes(torch, reference, tokens=8192, layers=32, page=64, item=2048):
    """Host us per call of the page-first-direct entry points through each batch route, on a side
    stream (the legacy default stream never batches), against the seed's. Indices in host memory, so
    the host time is the submission's own (device indices would wait for the previous copies)."""
    lf = [torch.zeros((4 * tokens, item), dtype=torch.uint8, device="cuda") for _ in range(2 * layers)]
    pf = [torch.zeros((4 * tokens // page, layers, page, item), dtype=torch.uint8).pin_memory() for _ in range(2)]
    pages = torch.randperm(4 * tokens // page)[: tokens // page]
    idx = (pages[:, None] * page + torch.arange(page)).reshape(-1)  # host indices: no wait for the GPU
    side = torch.cuda.Stream()
    cases = {"all_layer_direct_lf_pf": ("transfer_kv_all_layer_direct_lf_pf", (lf, pf, idx, idx, page)),
             "per_layer_direct_pf_lf": ("transfer_kv_per_layer_direct_pf_lf",
                                        (pf, [lf[3], lf[layers + 3]], idx, idx, 3, page))}
    print(f"{'batch route host us':34}{'cudart':>10}{'bindings':>10}{'page':>10}{'seed':>10}   copies")
    for label, (op, call_args) in cases.items():
        row = []
        chosen = batch_copy_route()
        for route in ("cudart", "bindings", "page"):
            os.environ["KVNUMBA_BATCH_COPY"] = route  # kvnumba reads it at every copy-engine call
            fn = getattr(kv, op)
            with torch.cuda.stream(side):
                row.append(per_call(lambda: fn(*call_args), calls=3, groups=5))
        os.environ["KVNUMBA_BATCH_COPY"] = chosen
        if reference is not None:
            ref = getattr(reference, op)
            with torch.cuda.stream(side):
                row.append(per_call(lambda: ref(*call_args), calls=3, groups=5))
        copies = (tokens // page) * 2 * (layers if op.startswith("transfer_kv_all") else 1)
        print(f"{label:34}" + "".join(f"{v:10.1f}" for v in row) + f"   {copies}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="module name or path of a .so with the seed's entry points")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--routes", action="store_true", help="host time of each batch-copy route too")
    args = parser.parse_args(argv)
    import torch

    reference = load_reference(args.reference)
    rows = []
    for label, (op, bound, call_args) in cases(torch).items():
        spec = kv.plan.spec.SPECS[op]
        named = dict(bound, **dict(zip([n for n in spec.params if n in ("src_indices", "dst_indices", "layer_id")],
                                       call_args)))
        named.update(block_quota=2, num_warps_per_block=32)  # the seed's binding has no defaults
        ordered = tuple(named[n] for n in spec.params)
        transfer = kv.prepare(getattr(kv, op), **bound)
        transfer(*call_args)
        plan = transfer._plan
        kernel = plan.kernel
        grid, threads, stream = 1, 1024, torch.cuda.current_stream().cuda_stream
        address = kernel.blocks.address
        fn = getattr(kv, op)
        cache = plain(op)._cache

        def miss():
            cache.clear()
            fn(*ordered)

        row = {"case": label,
               "launch": per_call(lambda: kernel.launch(grid, threads, stream, address)),
               "prepared": per_call(lambda: transfer(*call_args)),
               "plain": per_call(lambda: fn(*ordered)),
               "miss": per_call(miss, calls=20, groups=7)}
        if reference is not None:
            ref = getattr(reference, op)
            row["seed"] = per_call(lambda: ref(*ordered))
        rows.append(row)
        if args.profile:
            for name, call in (("prepared", lambda: transfer(*call_args)), ("plain", lambda: fn(*ordered))):
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(3000):
                    call()
                profile.disable()
                torch.cuda.synchronize()
                print(f"--- cProfile, 3000 {name} calls of {label} (own time) ---")
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    if args.routes:
        batch_routes(torch, reference)
    columns = ["launch", "prepared", "plain", "miss", "seed"]
    print(f"{'host us per call':34}" + "".join(f"{c:>10}" for c in columns))
    for row in rows:
        print(f"{row['case']:34}" + "".join(f"{row[c]:10.2f}" if c in row else f"{'-':>10}" for c in columns))
    return rows


if __name__ == "__main__":
    main()
