"""The FP8 one-layer loads of ``scripts/fp8_wire.py`` (8192 tokens of 8 heads of 128, pinned host page-first
-> GPU layer-first, ``block_quota`` 4 and 2, idle) under each ``KVNUMBA_LOAD_PATH``: ``register`` (no staging:
the pipelined kernel, ``kernels.dequantise_pipelined``; before 2026-12-02 the wide kernel's dequantising pass) and
``staged`` (``kernels.dequantise_staged``). Each call is checked bit for bit
against ``kvnumba.quant_reference`` before it is timed, as in the bench. A GPU only.

    python scripts/fp8_load_paths.py [register] [staged] [--ring 3x64 --ring 6x32 ...] [--scale-copies]

``--ring STAGESxKIB``: the staged path with that ring (stages of KIB KiB; the kernel's own ring,
``kernels.dequantise_staged.SHAPE``, otherwise), once per ring given. ``--scale-copies``: the staged path once more
with its loader's lanes copying the scales (``config.override(scale_boxes=False)``) where the bulk unit
brings them otherwise: the two in one process.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - the bench's buffers and shapes
import fp8_wire  # noqa: E402

from kvnumba import config  # noqa: E402
from kvnumba.kernels import dequantise_staged  # noqa: E402
from kvnumba.plan import fp8_staged_plan  # noqa: E402

ROWS = ("fp8 load e4m3 kv.copy bq=4", "fp8 load e4m3 kv.copy bq=2")


def ring(text):
    """``3x64`` -> the staged FP8 kernel's ring with 3 stages of 64 KiB."""
    stages, kib = (int(part) for part in text.lower().split("x"))
    return dequantise_staged.SHAPE._replace(stages=stages, stage_bytes=kib * 1024)


def main(paths, rings, scale_copies=False):
    shape = bench.Shape(layers=32, page_size=64, tokens=8192, pool_factor=4, block_quota=2, warps=32, repeat=20)
    backend = bench.TorchBackend()
    wire = fp8_wire.Bench(backend, shape, bench.Pools(backend, shape), None, bench.build_call)
    runs = [(path, None) for path in paths if path != "staged" or not rings]
    runs += [("staged", r) for r in rings if "staged" in paths]
    if scale_copies:
        runs.append(("staged copies", None))
    for path, staged_shape in runs:
        name = path if staged_shape is None else f"staged {staged_shape.stages}x{staged_shape.stage_bytes // 1024}"
        tuning = {} if staged_shape is None else {"staged_shape": staged_shape}
        if path == "staged copies":  # the scales by the loader's lanes, not the bulk unit
            path, tuning = "staged", {**tuning, "scale_boxes": False}
        chosen = []  # what each load's plan bound: the staged kernel, or None (the register kernels)

        def note(plan, staged, chosen=chosen):
            if plan.mode == "dequantise":
                chosen.append(staged)

        with config.override(load_path=path, **tuning), fp8_staged_plan.watching(note):
            for r in fp8_wire.run(wire, words=ROWS):
                if "under" not in r["case"]:
                    print(f"{name:12} {r['case']:28} {r['bf16_gbps']:6.1f} GB/s of bf16 {r['link_gbps']:6.1f} on the "
                          f"link {r['gpu_ms']:7.3f} ms  host {r['host_us']:5.1f} us  verified={r['verified']}",
                          flush=True)
        kernels = sorted({("staged, scales in boxes" if staged.scale_maps else "staged, scales copied") if staged
                          else "register" for staged in chosen})
        print(f"{name:12} the loads' kernels: {', '.join(kernels)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", choices=("register", "staged"), default=["register", "staged"])
    parser.add_argument("--ring", type=ring, action="append", default=[], help="staged ring: STAGESxKIB")
    parser.add_argument("--scale-copies", action="store_true",
                        help="also the staged path with the scales copied by the loader's lanes")
    args = parser.parse_args()
    main(args.paths, args.ring, args.scale_copies)
