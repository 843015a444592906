"""Does kvnumba run on numba-cuda-mlir? Each kernel family compiled, run, checked byte for byte against
``kvnumba.reference`` / ``kvnumba.quant_reference`` and timed, on numba-cuda and on numba-cuda-mlir, same rows.

Three worlds, each in its own process (a worker), run side by side within one overall time budget (their
timed sections take turns: a file lock), so that the long kernel builds overlap:

- ``numba-cuda``: kvnumba as it is (the baseline GB/s);
- ``mlir-import``: kvnumba's kernel modules on numba-cuda-mlir by the change of import alone
  (``scripts/mlir_port``, ``IMPORT_ONLY``): what numba-cuda-mlir's "change the import" promise gives;
- ``mlir-ported``: the same plus ``scripts/mlir_port``'s ports of the llvmlite intrinsics to ``inline_ptx``:
  the smallest change found that compiles every family.

Rows (family, what it moves) go through ``kv.copy``, as users call it; the kernels the row's plans launch
are recorded (module.function), so a row says which family it exercised. Each worker writes a row as
soon as it has it; a worker still running at the deadline is killed and its remaining rows read "not run".

    python3 scripts/mlir_probe.py --mlir-path /tmp/mlir --budget 200 --out results.json
    NUMBA_ENABLE_CUDASIM=1 python scripts/mlir_probe.py --worlds numba-cuda --small   # smoke test (no GPU)

numba-cuda-mlir is imported only by the mlir workers (``--mlir-path`` goes first on their PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLDS = ("mlir-ported", "numba-cuda", "mlir-import")
# Each world's rows run in two processes: the staged kernels' (mbarrier waits: a wrong port could hang the GPU,
# and their builds are the longest) apart from the others, so that one cannot stop the other.
GROUPS = (("simulator", "direct", "d2d", "h2d-register", "fp8-backup", "fp8-load-register"),
          ("h2d-staged", "fp8-load-staged"))
ROWS = (  # the instant ones first, the FP8 staged kernel (the longest build) last
    ("simulator", "simulator", "the simulator's Python stand-ins"),
    ("direct", "direct", "layer-first pinned host -> layer-first device, route=copy_engine (no kernel)"),
    ("register", "d2d", "page-first -> layer-first, device -> device, every layer"),
    ("register", "h2d-register", "page-first pinned host -> layer-first device, one layer, load_path=register"),
    ("staged", "h2d-staged", "page-first pinned host -> layer-first device, one layer, load_path=staged"),
    ("fp8", "fp8-backup", "layer-first device bf16 -> FP8 page-first pinned host, every layer (quantise)"),
    ("fp8", "fp8-load-register", "FP8 page-first pinned host -> layer-first device bf16, one layer, register"),
    ("fp8", "fp8-load-staged", "FP8 page-first pinned host -> layer-first device bf16, one layer, staged"),
)


def _attribute(function, name):
    """A loaded kernel's attribute (``CU_FUNC_ATTRIBUTE_<name>``), or None."""
    from cuda.bindings import driver as cu

    err, value = cu.cuFuncGetAttribute(getattr(cu.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_" + name), function)
    return None if int(err) else int(value)


# --- the worker: one world, every row ---------------------------------------------------------------------

def _construct(exc):
    """The last frames of ``exc`` in kvnumba's or the port's code, and the error, in one line."""
    frames = [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.startswith(ROOT)]
    text = " ".join(str(exc).split())
    return {"error": f"{type(exc).__name__}: {text[:600]}", "where": frames[-3:]}


class Worker:
    def __init__(self, world, small, lock=None):
        self.world, self.small, self.lock = world, small, lock
        if world.startswith("mlir"):
            sys.path.insert(0, os.path.join(ROOT, "scripts"))
            import mlir_port

            if world == "mlir-import":
                mlir_port.install(mlir_port.IMPORT_ONLY)
            else:
                mlir_port.install()
        sys.path.insert(0, ROOT)
        import numpy as np

        import kvnumba as kv

        self.np, self.kv = np, kv
        # geometry: L layers, T token slots, H heads of D bf16 elements, pages of P tokens, N tokens moved
        if small:
            self.L, self.T, self.H, self.D, self.P, self.N = 2, 64, 2, 8, 8, 16
        else:
            self.L, self.T, self.H, self.D, self.P, self.N = 4, 16384, 8, 128, 64, 4096
        rng = np.random.default_rng(0)
        pages = rng.choice(self.T // self.P, self.N // self.P, replace=False)
        self.src_idx = (pages[:, None] * self.P + np.arange(self.P)).reshape(-1).astype(np.int64)
        self.dst_idx = rng.permutation(self.T)[:self.N].astype(np.int64)
        self.rng = rng

    # buffers: a NumPy twin for the reference and a placed copy for kvnumba
    def _plain(self, shape):
        import ml_dtypes

        np = self.np
        bits = self.rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
        exponent_ok = (bits & 0x7F80) != 0x7F80  # finite values: the FP8 rows quantise them
        bits = np.where(exponent_ok, bits, bits & 0xBFFF)
        return bits.view(ml_dtypes.bfloat16)

    def _placed(self, array, where):
        """A copy of NumPy ``array`` in GPU memory (``where="device"``) or pinned host memory: torch tensors on a
        GPU (a Numba device array cannot hold bfloat16), NumPy copies on the simulator."""
        from kvnumba.driver.target import SIMULATOR
        from kvnumba.testing import device_array, pinned

        if SIMULATOR:
            return device_array(array) if where == "device" else pinned(array)
        import torch

        np = self.np
        array = np.ascontiguousarray(array)
        if array.dtype.name == "bfloat16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return tensor.cuda() if where == "device" else tensor.pin_memory()

    def _views(self, cls, shape, where, poison=True):
        plain_k, plain_v = self._plain(shape), self._plain(shape)
        if not poison:
            plain_k[...] = 0
            plain_v[...] = 0
        twin = cls(plain_k.copy(), plain_v.copy())
        placed = cls(self._placed(plain_k, where), self._placed(plain_v, where))
        return twin, placed

    def _bytes(self, view):
        np = self.np
        if hasattr(view, "codes"):  # an Fp8View: codes and scales
            return b"".join(self._bytes(part) for part in (view.codes, view.scales))
        return b"".join(self._host(b).tobytes() for w in ("k", "v") for b in view.buffers(w))

    def _host(self, buffer):
        np = self.np
        if type(buffer).__module__.startswith("torch"):
            import torch

            flat = buffer.detach().contiguous().view(torch.uint8).cpu()
            return flat.numpy()
        from kvnumba.testing import to_numpy

        return np.ascontiguousarray(to_numpy(buffer)).view(np.uint8)

    def _run_row(self, key):
        kv, np = self.kv, self.np
        from kvnumba import config, quant_reference, reference
        from kvnumba.layouts import LayerFirst, PageFirst
        from kvnumba.testing import device_array
        from kvnumba.tools.timing import gpu_time

        L, T, H, D = self.L, self.T, self.H, self.D
        layer_first, page_first = (L, T, H, D), (T, L, H, D)
        item = H * D * 2
        one_layer = key not in ("d2d", "fp8-backup")
        layers = 0 if one_layer else None
        moved = self.N * item * 2 * (1 if one_layer else L)  # K and V payload bytes (bf16 side for FP8)
        load_path = {"h2d-register": "register", "h2d-staged": "staged", "fp8-load-register": "register",
                     "fp8-load-staged": "staged"}.get(key, "auto")
        route = "copy_engine" if key == "direct" else "kernel"
        if key == "d2d":
            src_np, src = self._views(PageFirst, page_first, "device")
            dst_np, dst = self._views(LayerFirst, layer_first, "device")
        elif key in ("h2d-register", "h2d-staged"):
            src_np, src = self._views(PageFirst, page_first, "host")
            dst_np, dst = self._views(LayerFirst, layer_first, "device")
        elif key == "direct":
            src_np, src = self._views(LayerFirst, layer_first, "host")
            dst_np, dst = self._views(LayerFirst, layer_first, "device")
        elif key == "fp8-backup":
            src_np, src = self._views(LayerFirst, layer_first, "device")
            host_np, host = self._views(PageFirst, page_first, "host", poison=False)
            dst_np, dst = kv.fp8_like(host_np), kv.fp8_like(host)
        else:  # FP8 loads: a host FP8 pool quantised from random values by the reference
            plain_np, _ = self._views(PageFirst, page_first, "host")
            src_np = kv.fp8_like(plain_np)
            quant_reference.copy(plain_np, src_np, self.src_idx, self.src_idx)  # the tokens the row reads
            codes = PageFirst(*(self._placed(b, "host") for w in ("k", "v") for b in src_np.codes.buffers(w)))
            scales = PageFirst(*(self._placed(b, "host") for w in ("k", "v") for b in src_np.scales.buffers(w)))
            src = kv.Fp8View(codes, scales, src_np.fmt, dtype=src_np.dtype)
            dst_np, dst = self._views(LayerFirst, layer_first, "device")
        si, di = device_array(self.src_idx), device_array(self.dst_idx)
        if key == "direct":  # the copy engine takes host indices
            si, di = self.src_idx, self.dst_idx
        from kvnumba.driver import launch

        launch._launchables.clear()  # the kernels this row's plans take are the ones made again below

        geometry = {"block_quota": 1, "num_warps_per_block": 2} if self.small else {}

        def call():
            kv.copy(src, dst, si, di, layers, route=route, **geometry)

        with config.override(load_path=load_path):
            start = time.perf_counter()
            call()
            from kvnumba.testing import synchronize

            synchronize()
            first_s = time.perf_counter() - start
            if key.startswith("fp8"):
                quant_reference.copy(src_np, dst_np, self.src_idx, self.dst_idx, layers)
            else:
                reference.copy(src_np, dst_np, self.src_idx, self.dst_idx, layers)
            exact = self._bytes(dst) == self._bytes(dst_np)
            with self._turn():
                seconds = gpu_time(call, repeats=2 if self.small else 10, groups=3, warmup=0)
        kernels = {}
        for k in launch._launchables.values():
            name = f"{k.dispatcher.py_func.__module__.rsplit('.', 1)[-1]}.{k.dispatcher.py_func.__name__}"
            kernels[name] = {"registers": [_attribute(f, "NUM_REGS") for f in k._functions.values()],
                             "local_bytes": [_attribute(f, "LOCAL_SIZE_BYTES") for f in k._functions.values()]}
        return {"compiles": True, "runs": True, "bit_exact": exact, "gbps": moved / seconds / 1e9,
                "first_call_s": round(first_s, 2), "kernels": kernels, "route": kv.last_route()}

    def _turn(self):
        """The GPU to this worker alone while it times (the other worlds' workers wait at the same lock)."""
        import contextlib

        if self.lock is None:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def held():
            import fcntl

            with open(self.lock, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

        return held()

    def simulator_row(self):
        """Whether this world has a CUDA simulator that runs kvnumba's Python stand-ins."""
        import importlib.util

        if self.world == "numba-cuda":
            return {"has_simulator": importlib.util.find_spec("numba.cuda.simulator") is not None,
                    "simulator": "NUMBA_ENABLE_CUDASIM=1 runs kvnumba's Python stand-ins (the test suite does)"}
        import pkgutil

        import numba_cuda_mlir

        names = [m.name for m in pkgutil.walk_packages(numba_cuda_mlir.__path__, "numba_cuda_mlir.",
                                                       onerror=lambda _: None)
                 if "sim" in m.name.rsplit(".", 1)[-1]] if importlib.util.find_spec("numba_cuda_mlir") else []
        return {"has_simulator": bool(names), "simulator_modules": names,
                "version": getattr(numba_cuda_mlir, "__version__", "?")}

    def run(self, out_path, only):
        for family, key, what in ROWS:
            if only and key not in only:
                continue
            row = {"world": self.world, "family": family, "row": key, "what": what}
            start = time.perf_counter()
            try:
                row.update(self.simulator_row() if key == "simulator" else self._run_row(key))
            except Exception as exc:  # noqa: BLE001 - every failure is a finding: name it
                row.update(compiles=None, runs=False, bit_exact=None, **_construct(exc))
            row["seconds"] = round(time.perf_counter() - start, 2)
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[{self.world}] {key}: {json.dumps({k: row.get(k) for k in ('runs', 'bit_exact', 'gbps')})} "
                  f"{row.get('error', '')[:200]}", flush=True)


# --- the driver: the three worlds within the budget ------------------------------------------------------

def environment(mlir_path, commit=None):
    """The run's facts; ``commit``: the code measured, where git cannot say (a GPU machine's copy of a checkout
    may carry another commit's ``.git``, or none)."""
    info = {"python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        info["commit"] = commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - a copy without git
        info["commit"] = None
    from importlib import metadata

    for name in ("numba", "numba-cuda", "cuda-core", "cuda-bindings", "numpy", "torch"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    probe = ("import json, numba_cuda_mlir, importlib.metadata as m; print(json.dumps({'numba-cuda-mlir': "
             "numba_cuda_mlir.__version__, 'cuda-core': m.version('cuda-core')}))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                              env=_env(mlir_path))
        info["mlir"] = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-800:]}
    except Exception as exc:  # noqa: BLE001
        info["mlir"] = {"error": repr(exc)}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        info["gpu"] = out or None
    except Exception:  # noqa: BLE001
        info["gpu"] = None
    return info


def _env(mlir_path, world="mlir"):
    env = dict(os.environ)
    if world.startswith("mlir") and mlir_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (mlir_path, env.get("PYTHONPATH", "")) if p)
    return env


def run_worlds(args):
    deadline = time.monotonic() + args.budget
    info = environment(args.mlir_path, args.commit)
    worlds = [w for w in WORLDS if w in args.worlds]
    scratch = tempfile.mkdtemp(prefix="mlir_probe_")
    lock = os.path.join(scratch, "gpu.lock")
    running = {}
    for world in worlds:
        for n, group in enumerate(GROUPS):
            chosen = [key for key in group if not args.only or key in args.only
                      or any(f == fam and k == key for fam, k, _ in ROWS for f in args.only)]
            if not chosen:
                continue
            path = os.path.join(scratch, f"{world}-{n}.jsonl")
            open(path, "w").close()
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", world, "--rows-to", path, "--lock", lock]
            cmd += ["--small"] if args.small else []
            cmd += ["--only", *chosen]
            log = open(os.path.join(scratch, f"{world}-{n}.log"), "w")
            proc = subprocess.Popen(cmd, env=_env(args.mlir_path, world), stdout=log, stderr=subprocess.STDOUT)
            running[(world, n)] = (proc, path, log, chosen)
    print(f"== {', '.join(worlds)}: side by side, until {args.budget:.0f} s from the start", flush=True)
    for (world, n), (proc, _, _, _) in running.items():
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"== {world} (group {n}): stopped at the deadline", flush=True)
    rows = []
    for (world, n), (proc, path, log, chosen) in running.items():
        log.close()
        with open(path) as f:
            got = [json.loads(line) for line in f if line.strip()]
        with open(log.name) as f:
            tail = f.read()[-1500:]
        seen = {r["row"] for r in got}
        for family, key, what in ROWS:
            if key in chosen and key not in seen:
                got.append({"world": world, "family": family, "row": key, "what": what, "runs": None,
                            "error": "not run: out of time" if proc.returncode < 0 else
                            f"not run: the worker exited {proc.returncode}: {' '.join(tail.split())[-300:]}"})
        info.setdefault("logs", {})[f"{world}-{n}"] = tail
        rows += got
    order = {key: i for i, (_, key, _) in enumerate(ROWS)}
    rows.sort(key=lambda r: (WORLDS.index(r["world"]), order[r["row"]]))
    result = {"meta": info, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print_table(rows)
    return result


def print_table(rows):
    by = {(r["world"], r["row"]): r for r in rows}
    keys = [key for _, key, _ in ROWS if any(r["row"] == key for r in rows)]
    print(f"\n{'row':18} " + " ".join(f"{w:>26}" for w in WORLDS))
    for key in keys:
        cells = []
        for w in WORLDS:
            r = by.get((w, key))
            if r is None:
                cells.append("-")
            elif key == "simulator":
                cells.append("has simulator" if r.get("has_simulator") else "no simulator")
            elif r.get("runs"):
                cells.append(f"{'exact' if r.get('bit_exact') else 'WRONG'} {r['gbps']:6.1f} GB/s")
            else:
                cells.append(("FAIL " + r.get("error", "")[:21]) if r.get("error") else "-")
        print(f"{key:18} " + " ".join(f"{c:>26}" for c in cells))
    for r in rows:
        if r.get("error") and not r["error"].startswith("not run"):
            print(f"  {r['world']} {r['row']}: {r['error'][:240]} @ {r.get('where')}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for everything (default 200)")
    parser.add_argument("--mlir-path", default="/tmp/mlir", help="where numba-cuda-mlir is installed (a --target)")
    parser.add_argument("--worlds", nargs="+", choices=WORLDS, default=list(WORLDS))
    parser.add_argument("--only", nargs="+", help="rows or families to run (default: all)")
    parser.add_argument("--small", action="store_true", help="tiny sizes (the simulator)")
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--commit", help="the commit of the code measured (default: git's answer in this tree)")
    parser.add_argument("--worker", choices=WORLDS, help=argparse.SUPPRESS)
    parser.add_argument("--rows-to", help=argparse.SUPPRESS)
    parser.add_argument("--lock", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error("--budget must be positive")
    if args.worker:
        try:
            worker = Worker(args.worker, args.small, args.lock)
        except Exception as exc:  # noqa: BLE001 - the world does not even import: every row says why
            with open(args.rows_to, "a") as f:
                for family, key, what in ROWS:
                    f.write(json.dumps({"world": args.worker, "family": family, "row": key, "what": what,
                                        "runs": False, "imports": False, **_construct(exc)}) + "\n")
            raise
        worker.run(args.rows_to, args.only)
        return 0
    run_worlds(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
