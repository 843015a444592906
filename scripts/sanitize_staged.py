"""Small staged and register loads for compute-sanitizer (racecheck / memcheck), each checked byte for
byte: the default ring, and tiny rings whose buffers and slots wrap many times. Staged kernels carry line
info, so reports name kvnumba/kernels/staged.py lines. Runs on the simulator too (no sanitizer there).

    compute-sanitizer --tool racecheck python scripts/sanitize_staged.py ph_tiny
    compute-sanitizer --tool memcheck python scripts/sanitize_staged.py        # every case
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the checkout
import kvnumba  # noqa: E402  (before numba.cuda: it picks the simulator where there is no GPU)
from numba import cuda  # noqa: E402

from tests.helpers.cases import Case, run_case  # noqa: E402
from kvnumba.kernels import staged  # noqa: E402

if not kvnumba.driver.target.SIMULATOR:
    staged.kernel = lambda fn, **o: cuda.jit(fn, lineinfo=True, **o)
TINY = staged.StagedShape(stages=2, stage_bytes=8 * 1024, slots=4, store_warps=2, direct_batch=8, min_bulk_bytes=2048)


def case(op, item, page, heads, pattern, warps, ring, path="staged"):
    pool = 256
    rng = np.random.default_rng(1)
    if pattern == "pages":
        pages = rng.permutation(pool // page)[:6]
        src = (pages[:, None] * page + np.arange(page)).reshape(-1)
    elif pattern == "runs":
        src = np.concatenate([np.arange(s, s + 37) for s in (0, 50, 100, 150)])
    else:
        src = rng.choice(pool, 96, replace=False)
    dst = rng.permutation(pool)[:len(src)]
    with kvnumba.config.override(load_path=path, staged_shape=ring):
        run_case(Case(op, item_size=item, num_layers=2, page_size=page, head_num=heads, pool=pool, count=len(src),
                      src_place="host", dst_place="device", num_warps_per_block=warps, layer_id=1,
                      indices=(src, dst), dtype="int8"))
        cuda.synchronize()
    print("ok", op, item, page, heads, pattern, warps, path, ring == TINY and "tiny" or "default", flush=True)


which = sys.argv[1] if len(sys.argv) > 1 else "all"
S = staged.StagedShape()
CASES = {
    "ph": [("transfer_kv_per_layer_ph_lf", 2048, 16, 8, "pages", 4, S)],
    "ph_tiny": [("transfer_kv_per_layer_ph_lf", 2048, 16, 8, "pages", 5, TINY)],
    "pf": [("transfer_kv_per_layer_pf_lf", 2048, 1, 1, "runs", 4, S)],
    "pf_tiny": [("transfer_kv_per_layer_pf_lf", 1024, 1, 1, "runs", 5, TINY)],
    "mla": [("transfer_kv_per_layer_mla_pf_lf", 1152, 1, 1, "runs", 4, S)],
    "random": [("transfer_kv_per_layer_pf_lf", 2048, 1, 1, "random", 4, S)],  # blocks of few runs: the register mark
    "random_ring": [("transfer_kv_per_layer_pf_lf", 2048, 1, 1, "random", 4, S._replace(fallback_runs=0))],
    "register": [("transfer_kv_per_layer_ph_lf", 2048, 16, 8, "pages", 4, S, "register"),
                 ("transfer_kv_per_layer_pf_lf", 2048, 1, 1, "runs", 4, S, "register")],
}
for name, cases in CASES.items():
    if which in ("all", name):
        for c in cases:
            case(*c)
