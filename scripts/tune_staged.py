"""Measure the per-layer host->device loads of the staged (bulk-copy) kernel: by block quota against the
register kernel and a reference, with ring variants (kvnumba.kernels.staged.StagedShape), and with
variants that leave one stage out, to find what limits it. Needs an sm_90+ GPU and torch.

    python scripts/tune_staged.py --reference /path/to/seedref.so --table --variants base no_data ring_only
    python scripts/tune_staged.py --once pf --variant base        # one warm call, then one more: for ncu

GB/s = bytes moved / device time per call, back to back, as scripts/bench.py measures it (8192 tokens in
random 64-token pages, 32 layers, 2048-byte items or 1152 for MLA, 32 warps). "random": 8192 random,
unpaged indices (no runs); "runs8": random 8-token runs. Tables go to stdout, last; ``--json`` keeps every figure.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

from kvnumba import config  # noqa: E402
from kvnumba.kernels.staged import StagedShape  # noqa: E402

K = 1024
S = StagedShape()
CASES = {  # name: (entry point, direction, model, indices)
    "pf": ("transfer_kv_per_layer_pf_lf", "h2d", "mha", "pages"),
    "ph": ("transfer_kv_per_layer_ph_lf", "h2d", "mha", "pages"),
    "mla": ("transfer_kv_per_layer_mla_pf_lf", "h2d", "mla", "pages"),
    "random": ("transfer_kv_per_layer_pf_lf", "h2d", "mha", "random"),
    "runs8": ("transfer_kv_per_layer_pf_lf", "h2d", "mha", "runs8"),  # random 8-token runs: short bulk pieces
    "lf": ("transfer_kv_per_layer", "h2d", "mha", "pages"),
    "pf_d2d": ("transfer_kv_per_layer_pf_lf", "d2d", "mha", "pages"),  # the kernel's own limit, without PCIe
}
VARIANTS = {
    "base": S,
    "warp_stores": S._replace(bulk_stores=False),  # pieces written out by the store warps' registers
    "no_data": S._replace(leave_out="data"),  # the loader, barriers and stores, no bulk loads
    "no_stores": S._replace(leave_out="stores"),  # the loader and the bulk loads, nothing written out
    "warp_stores_no_data": S._replace(bulk_stores=False, leave_out="data"),
    "ring_only": S._replace(fallback_runs=0),  # no block copies as the register kernel does (as before aec6417)
    "s6x32": S._replace(stages=6, stage_bytes=32 * K),
    "s6x36": S._replace(stages=6, stage_bytes=36 * K),
    "direct256": S._replace(direct_batch=256),  # fewer, longer direct posts: less barrier traffic per item
    "direct512": S._replace(direct_batch=512, slots=32),
}


_settings = []  # the override in force (config.override: the load path and the ring; plans dropped)


def use(path, ring=S):
    while _settings:
        _settings.pop().__exit__(None, None, None)
    setting = config.override(load_path=path, staged_shape=ring)
    setting.__enter__()
    _settings.append(setting)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="module or .so with the seed's entry points")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--table", action="store_true", help="block quotas 1, 2, 4: reference, registers, staged")
    parser.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS))
    parser.add_argument("--cases", nargs="*", default=["pf", "ph", "mla", "random", "pf_d2d"], choices=sorted(CASES))
    parser.add_argument("--quotas", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--once", choices=sorted(CASES), help="run one case twice (for a profiler) and stop")
    parser.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    parser.add_argument("--path", default="staged", choices=["staged", "register"])
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    backend, shape, pools, idx, reference, rng = bench.tuning_setup(args.reference, args.repeat)
    scattered = tuple(backend.indices(rng.permutation(shape.pool)[:shape.tokens].astype(np.int64)) for _ in "sd")
    starts = rng.permutation(shape.pool // 8)[:shape.tokens // 8] * 8
    runs8 = (backend.indices((starts[:, None] + np.arange(8)).reshape(-1).astype(np.int64)), scattered[1])
    patterns = {"pages": idx, "random": scattered, "runs8": runs8}

    def call(module, case, block_quota):
        op, direction, model, indices = CASES[case]
        return bench.build_call(module, op, direction, model, pools, patterns[indices], shape,
                                block_quota)

    if args.once:
        use(args.path, VARIANTS[args.variant])
        fn, _ = call(bench.kvnumba, args.once, 2)
        fn()
        backend.torch.cuda.synchronize()
        fn()
        backend.torch.cuda.synchronize()
        return

    def gbps(module, case, block_quota):
        fn, nbytes = call(module, case, block_quota)
        return nbytes / shape.device_seconds(fn) / 1e9

    results = []
    tables = []
    if args.table:
        lines = [f"{'GB/s':22} " + " ".join(f"{'bq=' + str(q):>22}" for q in (1, 2, 4)),
                 f"{'case':22} " + " ".join(f"{'seed reg staged':>22}" for _ in (1, 2, 4))]
        for case in args.cases:
            row = []
            for q in (1, 2, 4):
                figures = [gbps(reference, case, q) if reference else float("nan")]
                for path in ("register", "staged"):
                    use(path)
                    figures.append(gbps(bench.kvnumba, case, q))
                results += [dict(table=True, case=case, block_quota=q, kernel=k, gbps=v)
                            for k, v in zip(("seed", "register", "staged"), figures)]
                row.append(" ".join(f"{v:6.1f}" for v in figures))
                print(case, q, row[-1], file=sys.stderr, flush=True)
            lines.append(f"{case:22} " + " ".join(f"{r:>22}" for r in row))
        tables.append("\n".join(lines))

    if args.variants:
        heads = [f"{c}@{q}" for c in args.cases for q in args.quotas]
        lines = [f"{'variant':14} " + " ".join(f"{h:>10}" for h in heads)]
        for name in args.variants:
            use("staged", VARIANTS[name])
            row = []
            for case in args.cases:
                for q in args.quotas:
                    v = gbps(bench.kvnumba, case, q)
                    results.append(dict(variant=name, case=case, block_quota=q, gbps=v))
                    row.append(v)
            lines.append(f"{name:14} " + " ".join(f"{v:10.1f}" for v in row))
            print(lines[-1], file=sys.stderr, flush=True)
        tables.append("\n".join(lines))
    use("auto")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=backend.name, results=results,
                           variants={k: v._asdict() for k, v in VARIANTS.items()}), f, indent=1)
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
