"""The host-cost model ``kv.copy(route="auto")`` weighs (``kvnumba.plan.routes.HOST_COST``), measured.

    python scripts/route_costs.py                  # a GPU: prints the HOST_COST line for plan/routes.py
    python scripts/route_costs.py --json costs.json

One layer of 32, item 2048 B, pages of 64, from layer-first and page-first-direct pinned host views into a GPU
layer-first view, with host indices (random whole pages), on a side stream, at 64 to 8192 tokens:

- the copy engine: host us of one ``kv.copy(route="copy_engine")``, calls back to back (the median group),
  against the copies it submitted; a straight line through them gives ``engine_fixed_us`` and
  ``engine_per_copy_us``;
- the kernel: us of one ``kv.copy(route="kernel")`` with the same host indices until its stream is done (it
  stages them on the GPU and waits for its load), against the bytes it moved (read and written once:
  ``tokens * item * 2`` for K and V); a straight line gives ``kernel_fixed_us`` and ``kernel_bytes_per_us``.

On the simulator the batch call is the stand-in of ``direct_host_profile.py`` and the kernel is simulated:
the line printed says nothing of a GPU (the tests run it to keep it working).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from direct_host_profile import CLOCK, ITEM, LAYER, PAGE, Setup, harness, kv, run_calls  # noqa: E402

from kvnumba.driver import batch_copy  # noqa: E402
from kvnumba.driver.target import SIMULATOR  # noqa: E402

TOKENS = (64, 256, 512, 2048, 8192)


class CopyCounter:
    """Wraps ``PreparedBatch.submit`` while alive: the copy count of the last submission."""

    def __init__(self):
        self.last = 0
        self.original = batch_copy.PreparedBatch.submit

    def __enter__(self):
        original, counter = self.original, self

        def submit(batch, count, stream):
            counter.last = count
            return original(batch, count, stream)

        batch_copy.PreparedBatch.submit = submit
        return self

    def __exit__(self, *exc):
        batch_copy.PreparedBatch.submit = self.original
        return False


def measure(tokens_list, calls=20, groups=5):
    """Rows ``{"route", "view", "tokens", "copies", "bytes", "us"}``: the engine's host us a call, the kernel's
    us until its stream is done."""
    rows = []
    with harness() as (torch, stream, sync), CopyCounter() as counter:
        for tokens in tokens_list:
            setup = Setup(tokens, torch, distinct=4)
            pairs = setup.pairs["host"]
            nbytes = tokens * ITEM * 2
            for view in ("lf", "pfd"):
                src, dst = setup.views[view], setup.views["gpu"]

                def engine(s, d, src=src, dst=dst):
                    kv.copy(src, dst, s, d, LAYER, route="copy_engine", stream=stream)

                def kernel(s, d, src=src, dst=dst):  # the call waits for its load; sync makes sure
                    kv.copy(src, dst, s, d, LAYER, route="kernel", stream=stream)
                    sync()

                host_us, _ = run_calls(engine, pairs, calls, groups, sync)
                copies = counter.last
                rows.append({"route": "copy_engine", "view": view, "tokens": tokens, "copies": copies,
                             "bytes": nbytes, "us": host_us})
                kernel_us, _ = run_calls(kernel, pairs, max(calls // 4, 2), groups, sync)
                rows.append({"route": "kernel", "view": view, "tokens": tokens, "copies": None, "bytes": nbytes,
                             "us": kernel_us})
                print(f"{view:4} {tokens:5} tok  engine {host_us:8.1f} us ({copies} copies)  "
                      f"kernel {kernel_us:8.1f} us", flush=True)
            del setup
    return rows


def fit(rows):
    """``HostCost`` fields from the rows: least-squares lines (engine: us against copies; kernel: us against
    bytes). A slope that comes out at zero or below (noise over too few sizes) is refused."""
    engine = [(r["copies"], r["us"]) for r in rows if r["route"] == "copy_engine"]
    kernel = [(r["bytes"], r["us"]) for r in rows if r["route"] == "kernel"]
    per_copy, engine_fixed = np.polyfit(*np.array(engine, dtype=float).T, 1)
    per_byte, kernel_fixed = np.polyfit(*np.array(kernel, dtype=float).T, 1)
    if per_copy <= 0 or per_byte <= 0:
        raise ValueError(f"a slope at or below zero (per copy {per_copy:.3g} us, per byte {per_byte:.3g} us): "
                         "measure more sizes")
    return {"engine_fixed_us": round(float(engine_fixed), 1), "engine_per_copy_us": round(float(per_copy), 3),
            "kernel_fixed_us": round(float(kernel_fixed), 1), "kernel_bytes_per_us": float(f"{1 / per_byte:.3g}")}


def host_cost_line(fields):
    """The line ``kvnumba/plan/routes.py`` holds."""
    return "HOST_COST = HostCost(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--calls", type=int, default=20, help="calls a group (the kernel: a quarter)")
    parser.add_argument("--groups", type=int, default=5, help="groups a case (the median one counts)")
    parser.add_argument("--json", help="write the rows and the fit to this file")
    args = parser.parse_args(argv)
    if any(t % PAGE for t in args.tokens):
        parser.error(f"--tokens must be multiples of the page ({PAGE})")
    print("simulator (stand-in batch call): not a GPU's figures" if SIMULATOR else "GPU", f"; clock {CLOCK.__name__}")
    rows = measure(args.tokens, args.calls, args.groups)
    fields = fit(rows)
    print(host_cost_line(fields))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "host_cost": fields}, f, indent=1)
    return rows, fields


if __name__ == "__main__":
    main()
