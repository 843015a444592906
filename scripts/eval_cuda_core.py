"""Host cost of describing an array and of timing with events: kvnumba's own code against cuda.core's.

Whether cuda.core's ``StridedMemoryView`` could replace ``kvnumba.arrays.array_info`` (what an
entry point reads off every buffer, table and index array on every call) and cuda.core's ``Event`` the
events of ``kvnumba.tools.timing`` (Numba's), where they are not slower on the host path. This measures:

- describing an array: ``array_info(x, "x")`` against ``StridedMemoryView(x, stream_ptr=-1)`` followed by
  reading what kvnumba needs (``ptr``, ``shape``, ``dtype``, ``is_device_accessible``, ``readonly``), for
  NumPy arrays and, if torch is installed, CPU torch tensors; with a GPU, CUDA torch tensors and Numba
  device arrays too. No GPU is needed for the NumPy and CPU torch rows.
- events (a GPU only): ``numba.cuda.event()`` record + synchronize + ``elapsed_time`` against
  ``cuda.core`` ``Stream.record()`` + ``Event.sync()`` + ``end - start``.

    python scripts/eval_cuda_core.py            # median ns per call, one line per case
    python scripts/eval_cuda_core.py --json out.json
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def per_call_ns(fn, calls=20000, groups=7):
    """Median over ``groups`` of the mean ns per call of ``fn()`` (after a warm-up group)."""
    for _ in range(calls // 10):
        fn()
    times = []
    for _ in range(groups):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(times)


def _smv_reader(StridedMemoryView):
    make = getattr(StridedMemoryView, "from_any_interface", None)  # cuda.core >= 1.x; the constructor before
    if make is None:
        def make(x, stream_ptr):
            return StridedMemoryView(x, stream_ptr=stream_ptr)

    def describe(x):
        view = make(x, stream_ptr=-1)
        return view.ptr, view.shape, view.dtype, view.is_device_accessible, view.readonly
    return describe


def arrays_here():
    """(label, array) to describe: NumPy always; torch CPU if installed; CUDA ones with a GPU."""
    found = [("numpy int64 [64] (indices)", np.arange(64, dtype=np.int64)),
             ("numpy uint8 [8192, 32, 2048] view (a pool)", np.lib.stride_tricks.as_strided(
                 np.zeros(1, np.uint8), (8192, 32, 2048), (65536, 2048, 1)))]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        found += [("torch cpu int64 [64] (indices)", torch.arange(64, dtype=torch.int64)),
                  ("torch cpu bfloat16 [1024, 8, 128]", torch.zeros(1024, 8, 128, dtype=torch.bfloat16))]
    from kvnumba.driver.target import SIMULATOR, gpu_available

    if not SIMULATOR and gpu_available():
        from numba import cuda

        found.append(("numba device uint8 [1024, 2048]", cuda.device_array((1024, 2048), np.uint8)))
        if torch is not None:
            found.append(("torch cuda int64 [64] (indices)", torch.arange(64, dtype=torch.int64, device="cuda")))
    return found


def describe_rows():
    from cuda.core.utils import StridedMemoryView

    from kvnumba.arrays import array_info

    smv = _smv_reader(StridedMemoryView)
    rows = []
    for label, x in arrays_here():
        row = {"case": label, "array_info_ns": per_call_ns(lambda: array_info(x, "x"))}
        try:
            smv(x)
            row["strided_memory_view_ns"] = per_call_ns(lambda: smv(x))
        except Exception as exc:  # noqa: BLE001 - recorded, not raised: what it cannot describe is a finding
            row["strided_memory_view_ns"] = None
            row["strided_memory_view_error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def event_rows():
    from kvnumba.driver.target import SIMULATOR, gpu_available

    if SIMULATOR or not gpu_available():
        return [{"case": "events", "skipped": "needs a GPU (CUDA events)"}]
    from cuda.core import Device
    from numba import cuda

    def numba_events():
        start, end = cuda.event(), cuda.event()
        start.record()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    device = Device()
    device.set_current()
    stream = device.create_stream()

    def core_events():
        start = stream.record(options={"timing_disabled": False})
        end = stream.record(options={"timing_disabled": False})
        end.sync()
        return end - start

    return [{"case": "events: create 2, record, sync, elapsed", "numba_ns": per_call_ns(numba_events, 2000),
             "cuda_core_ns": per_call_ns(core_events, 2000)}]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    import cuda.core

    from kvnumba.driver.target import CHOICE

    meta = {"cuda_core": cuda.core.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
            "target": CHOICE.reason}
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    rows = describe_rows() + event_rows()
    for row in rows:
        print(json.dumps(row))
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
