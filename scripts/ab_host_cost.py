"""Host microseconds of one call, two checkouts of kvnumba side by side: a before/after that the machine's
slow swings cannot tilt.

    python scripts/ab_host_cost.py --before PATH [--after PATH] [--rounds 60] [--burst 25] [--quick]

On the H200 host, a process's host times drift by up to 2x from one minute (or one process) to the next,
so two benchmark runs one after the other can show a 10% "regression" that is not there (scripts/RESULTS.md,
the H200 runs of 2026-12-01). Here each checkout runs in its own worker process (``--worker``: its own
kvnumba, and its own ``scripts/bench.py`` and ``scripts/sglang_shapes.py`` for the buffers), both alive
together, taking turns in short bursts (before-after, then after-before), so that a swing falls on both alike.

The case is SGLang's per-layer load (``transfer_kv_per_layer``, a fresh ``pool[0]`` view of 8192 tokens
every call) in four forms: ``miss-staged`` and ``miss-register`` (the plan cache emptied first, with
``KVNUMBA_LOAD_PATH`` auto and register: a whole plan built), ``hit`` (the plan cached), and ``prepared``
(``kv.prepare`` with the buffers bound once: each call passes only the indices). Each call is
timed alone, the device synchronised before it (its launch is included, its GPU time is not). Printed:
min, 10th, 25th percentile and median of wall-clock µs, and the median of the thread's CPU µs, per
checkout and case. ``--quick``: bench.py's tiny sizes (on the simulator always); its figures mean nothing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("miss-staged", "miss-register", "hit", "prepared")
LOAD_PATHS = {"miss-staged": "auto", "miss-register": "register", "hit": "auto", "prepared": "auto"}


# --- one checkout: a worker answering "CASE N" with N timed calls -------------------------------------
def worker(quick):
    tree = os.getcwd()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [tree, os.path.join(tree, "scripts")] + [p for p in sys.path if os.path.abspath(p or ".") != here]
    import numpy as np

    import bench
    import kvnumba
    import kvnumba.config
    import sglang_shapes
    from kvnumba.api.transfer import plain
    from kvnumba.driver.target import SIMULATOR

    strays = [f"{m.__name__} from {m.__file__}" for m in (kvnumba, bench, sglang_shapes)
              if not os.path.abspath(m.__file__).startswith(tree + os.sep)]
    if strays:  # e.g. an installed kvnumba: the figures would be another checkout's
        print(f"not a checkout of kvnumba: {', '.join(strays)}", flush=True)
        return

    backend = bench.SimulatorBackend() if SIMULATOR else bench.TorchBackend()
    shape = bench.QUICK if SIMULATOR or quick else bench.Shape()
    # The indices as sglang_shapes.rows draws them, written out here: a worker may run an older checkout,
    # whose scripts have only Roots and fresh_view_call in common with this one.
    rng = np.random.default_rng(1)
    pages = rng.choice(shape.pool // shape.page_size, shape.tokens // shape.page_size, replace=False)
    src = (pages[:, None] * shape.page_size + np.arange(shape.page_size)).reshape(-1).astype(np.int64)
    dst = rng.permutation(shape.pool)[:shape.tokens].astype(np.int64)
    indices = (backend.indices(src), backend.indices(dst))
    op = "transfer_kv_per_layer"
    roots = sglang_shapes.Roots(backend, shape)
    fresh, _ = sglang_shapes.fresh_view_call(kvnumba, op, roots, indices, shape, shape.block_quota)
    src_k, src_v = (roots.pool("host", "mha", "lf")[0] for _ in range(2))
    dst_k, dst_v = (roots.pool("device", "mha", "lf")[0] for _ in range(2))
    transfer = kvnumba.prepare(op, src_k=src_k, dst_k=dst_k, src_v=src_v, dst_v=dst_v,
                               item_size=sglang_shapes.ITEM["mha"], block_quota=shape.block_quota,
                               num_warps_per_block=shape.warps)

    def prepared():
        transfer(*indices)

    cache = plain(op)._cache
    sync = (lambda: None) if SIMULATOR else sys.modules["torch"].cuda.synchronize

    def timed(case, n):
        wall, cpu = [], []
        with kvnumba.config.override(load_path=LOAD_PATHS[case]):
            for _ in range(n):
                sync()
                if case.startswith("miss"):
                    cache.clear()
                call = prepared if case == "prepared" else fresh
                c, t = time.thread_time(), time.perf_counter()
                call()
                wall.append((time.perf_counter() - t) * 1e6)
                cpu.append((time.thread_time() - c) * 1e6)
        sync()
        return wall, cpu

    for case in CASES:  # compiled, loaded and warm before the first timed burst
        timed(case, 3 if SIMULATOR else 30)
    print("ready", flush=True)
    for line in sys.stdin:
        case, n = line.split()
        print(json.dumps(timed(case, int(n))), flush=True)


# --- both checkouts, interleaved -----------------------------------------------------------------------
def start(tree, quick=False):
    """A worker for the checkout at ``tree``, ready to time (its kvnumba first on the path)."""
    here = os.path.abspath(__file__)
    path = os.pathsep.join([tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    argv = [sys.executable, here, "--worker"] + (["--quick"] if quick else [])
    log = tempfile.TemporaryFile("w+")  # the worker's stderr: a pipe nobody reads could fill and stall it
    process = subprocess.Popen(argv, cwd=tree, env=dict(os.environ, PYTHONPATH=path), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=log, text=True)
    line = process.stdout.readline().strip()
    if line != "ready":
        process.kill()
        stop(process)
        log.seek(0)
        said = line or (log.read().strip().splitlines() or ["nothing"])[-1]
        log.close()
        raise SystemExit(f"ab_host_cost: the worker in {tree} did not start: {said}")
    log.close()  # the worker keeps writing to its own handle
    return process


def stop(process):
    process.stdin.close()  # the worker's loop ends
    process.wait()
    process.stdout.close()


def interleave(trees, rounds, burst, cases=CASES, quick=False):
    """``{(checkout, case): (wall µs, cpu µs)}``: ``rounds`` turns of ``burst`` calls each, the order of the
    checkouts swapped every round."""
    workers = {name: start(tree, quick) for name, tree in trees.items()}
    got = {(name, case): ([], []) for name in trees for case in cases}
    try:
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for case in cases:
                for name in order:
                    workers[name].stdin.write(f"{case} {burst}\n")
                    workers[name].stdin.flush()
                    wall, cpu = json.loads(workers[name].stdout.readline())
                    got[name, case][0].extend(wall)
                    got[name, case][1].extend(cpu)
    finally:
        for process in workers.values():
            stop(process)
    return got


def quantile(values, q):
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def table(got):
    lines = [f"{'case':14s} {'checkout':8s} {'calls':>5s} {'min':>7s} {'p10':>7s} {'p25':>7s} {'median':>7s} "
             f"{'cpu med':>8s}   (us a call)"]
    for (name, case), (wall, cpu) in sorted(got.items(), key=lambda item: (CASES.index(item[0][1]), item[0][0])):
        lines.append(f"{case:14s} {name:8s} {len(wall):5d} {min(wall):7.1f} {quantile(wall, .1):7.1f} "
                     f"{quantile(wall, .25):7.1f} {statistics.median(wall):7.1f} {statistics.median(cpu):8.1f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the checkout to compare with (e.g. a `git archive` of an older commit)")
    parser.add_argument("--after", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the checkout under test (default: this one)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--burst", type=int, default=25, help="calls a worker times in one turn")
    parser.add_argument("--quick", action="store_true", help="bench.py's tiny sizes (a check that it runs)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.quick)
    if not args.before:
        parser.error("--before is required")
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    print(table(interleave(trees, args.rounds, args.burst, quick=args.quick)))


if __name__ == "__main__":
    main()
