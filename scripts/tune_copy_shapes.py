"""Time every kernel entry point with several inner-loop shapes (kvnumba.kernels.warp_copy.CopyShape), next to
a reference, to choose kvnumba.kernels.factory.COPY_SHAPES. Needs a GPU and torch.

    python scripts/tune_copy_shapes.py --reference /path/to/seedref.so

Prints GB/s (device time per call, back to back, as scripts/bench.py measures it) per case and shape.
The table that chose the current COPY_SHAPES is in scripts/RESULTS.md ("Tuning").
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

from kvnumba import config  # noqa: E402
from kvnumba.kernels.warp_copy import CopyShape  # noqa: E402

SHAPES = [CopyShape(2, True, True), CopyShape(1, False, False), CopyShape(1, True, True), CopyShape(4, True, False),
          CopyShape(2, False, True)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="module or .so with the seed's entry points")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    backend, shape, pools, idx, reference, _ = bench.tuning_setup(args.reference, args.repeat)
    cases = [(*c, 2) for c in bench.CASES] + [(*c, backend.sms) for c in bench.FULL_GPU_CASES]
    print(f"{'case':56} {'ref':>7} " + " ".join(f"{'s%d' % i:>7}" for i in range(len(SHAPES))))
    for op, direction, model, block_quota in cases:
        row = []
        for module, forced in [(reference, None)] * (reference is not None) + [(bench.kvnumba, s) for s in SHAPES]:
            # every kernel built with the forced shape (the factory's choice for the reference)
            with config.override(copy_shape=forced):
                call, nbytes = bench.build_call(module, op, direction, model, pools, idx, shape, block_quota)
                row.append(nbytes / shape.device_seconds(call) / 1e9)
        cells = ([f"{row.pop(0):7.1f}"] if reference is not None else ["      -"]) + [f"{v:7.1f}" for v in row]
        print(f"{op + ' ' + direction + ' ' + model + ' bq' + str(block_quota):56} " + " ".join(cells), flush=True)
    print("shapes:", ", ".join(f"s{i} = {tuple(s)}" for i, s in enumerate(SHAPES)))


if __name__ == "__main__":
    main()
