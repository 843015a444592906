"""Time the per-layer host->device loads through the staged (bulk-copy) kernel with several rings
(kvnumba.kernels.staged.StagedShape) and L2 promotions, next to the register kernel and a reference,
to choose kvnumba.kernels.staged.SHAPE. Needs an sm_90+ GPU and torch.

    python scripts/tune_staged.py --reference /path/to/seedref.so

Prints GB/s (device time per call, back to back, as scripts/bench.py measures it) per case and ring,
then GB/s by block_quota for the page-first load.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

from kvnumba.api.transfer import clear_plan_caches  # noqa: E402
from kvnumba.driver import tensor_maps  # noqa: E402
from kvnumba.kernels import staged  # noqa: E402
from kvnumba.kernels.staged import StagedShape  # noqa: E402

K = 1024
S = StagedShape()
RINGS = [(S, "L2_256B"), (S._replace(store_warps=8), "L2_256B"), (S._replace(store_warps=0), "L2_256B"),
         (S._replace(stages=2, stage_bytes=96 * K), "L2_256B")]
CASES = [("transfer_kv_per_layer", "h2d", "mha"), ("transfer_kv_per_layer_pf_lf", "h2d", "mha"),
         ("transfer_kv_per_layer_ph_lf", "h2d", "mha"), ("transfer_kv_per_layer_mla", "h2d", "mla"),
         ("transfer_kv_per_layer_mla_pf_lf", "h2d", "mla"),
         ("transfer_kv_per_layer_pf_lf", "d2d", "mha"),  # the kernel's own limit, without PCIe
         ("transfer_kv_per_layer_pf_lf", "h2d", "mha", "random")]  # no runs: direct batches only


def _use(path, ring=None, promotion="L2_256B"):
    os.environ["KVNUMBA_LOAD_PATH"] = path
    staged.SHAPE = ring or StagedShape()
    tensor_maps.L2_PROMOTION = promotion
    clear_plan_caches()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="module or .so with the seed's entry points")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    backend, shape, pools, idx, reference, rng = bench.tuning_setup(args.reference, args.repeat)

    scattered = tuple(backend.indices(rng.permutation(shape.pool)[:shape.tokens].astype(np.int64)) for _ in "sd")

    def gbps(module, op, direction, model, block_quota=2, indices="pages"):
        call, nbytes = bench.build_call(module, op, direction, model, pools, idx if indices == "pages" else scattered,
                                        shape, block_quota)
        return nbytes / shape.device_seconds(call) / 1e9

    names = ["ref", "register"] + [f"r{i}" for i in range(len(RINGS))]
    print(f"{'case':40} " + " ".join(f"{n:>8}" for n in names))
    for op, direction, model, *indices in CASES:
        case = (op, direction, model, 2, *indices)
        row = [gbps(reference, *case) if reference else float("nan")]
        _use("register")
        row.append(gbps(bench.kvnumba, *case))
        for ring, promotion in RINGS:
            _use("staged", ring, promotion)
            row.append(gbps(bench.kvnumba, *case))
        print(f"{' '.join([op, direction, *indices]):40} " + " ".join(f"{v:8.1f}" for v in row), flush=True)
    print("rings:", ", ".join(f"r{i} = {r.stages}x{r.stage_bytes // K}K, {r.slots} slots, {r.store_warps or 'all'} "
                              f"store warps, direct {r.direct_batch}, min {r.min_bulk_bytes // K}K, {p}"
                              for i, (r, p) in enumerate(RINGS)))

    print(f"\n{'pf->lf h2d by block_quota':40} {'ref':>8} {'register':>8} {'staged':>8}")
    for block_quota in (1, 2, 4, 8):
        row = [gbps(reference, "transfer_kv_per_layer_pf_lf", "h2d", "mha", block_quota) if reference else float("nan")]
        for path in ("register", "staged"):
            _use(path)
            row.append(gbps(bench.kvnumba, "transfer_kv_per_layer_pf_lf", "h2d", "mha", block_quota))
        print(f"{'block_quota=' + str(block_quota):40} " + " ".join(f"{v:8.1f}" for v in row), flush=True)
    _use("auto")


if __name__ == "__main__":
    main()
