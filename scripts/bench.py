"""Side-by-side benchmark of kvnumba's entry points against the pinned-copy ceilings, a reference
implementation (the seed's CUDA C++ or sgl_kernel.kvcacheio) and torch indexing.

Cases are shaped like SGLang HiCache: an 8-KV-head, head_dim-128, bf16 model (item 2048 B) and an MLA
model (576 x bf16 = 1152 B), page 64, 32 layers, 8192 tokens moved out of a pool several times
larger, page-aligned random indices; per-layer loads host->device, all-layer backups device->host,
and device->device. GB/s = bytes moved (each payload byte once) / device time per call (CUDA events
around back-to-back calls, median of 5 groups: ``kvnumba.tools.timing.gpu_time``). Host time = wall time per
call of 20 back-to-back calls, before any synchronisation (median of 5 groups:
``kvnumba.tools.timing.host_time``), for the plain call (its plan cached: the
same pool tensors every call, as SGLang passes them), the prepared form (``kvnumba.prepare``) and
a plain call whose plan cache was emptied first ("miss"). The ``64tok`` cases move one page: host
time is the whole cost. The memcpy cases also give GB/s of one synchronised call, host time
included ("wall").

    python scripts/bench.py --reference sgl_kernel.kvcacheio --json out.json --plot out.png
    python scripts/bench.py --reference /path/to/seedref.so
    python scripts/bench.py --only overlap --reference seedref.so --json overlap.json   # loads under compute
    NUMBA_ENABLE_CUDASIM=1 python scripts/bench.py --quick      # smoke test; figures mean nothing

``--only overlap`` measures HiCache's per-layer loads while a model computes, one row per route
(``scripts/overlap.py`` says how). ``--only fp8`` measures the backup and the load with the host's copy in FP8
(``kv.Fp8View``) or vLLM's NVFP4 pages (``kv.Nvfp4View``) beside the same in bf16 and the seed's, idle and under
compute, each quantised call checked against its reference first, and prints its targets last
(``scripts/fp8_wire.py``; ``--only fp8 nvfp4``: the NVFP4 rows alone):

    python scripts/bench.py --only fp8 --reference seedref.so --json fp8.json --commit SHA --machine "one H200"

A full run can be split over several processes (a machine that kills each command after a few minutes):
``--json`` rewrites its file (atomically) after every case, and ``--resume`` keeps the rows already in
it and runs only the cases it lacks (same settings, device and reference, or it refuses). Repeat

    timeout 550 python scripts/bench.py --reference seedref.so --json h200.json --resume

until it says ``nothing left to run`` (a run that finishes exits 0; a killed one loses only the case it
was measuring). ``meta["runs"]`` lists when each part started and how many rows it added.

On a GPU it needs torch (allocation, the reference's tensors).
"""
import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

# This checkout's package, ahead of PYTHONPATH and any installed one: a script that imports this module runs
# the checkout's kernels whatever PYTHONPATH says (the meta's ``kvnumba_from`` names the folder it ran).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvnumba  # noqa: E402
from kvnumba.plan.spec import DIRECT_ENTRY_POINTS, KERNEL_ENTRY_POINTS, PAGE_FIRST_DIRECT, SPECS  # noqa: E402
from kvnumba.driver.target import SIMULATOR  # noqa: E402
from kvnumba.kernels.layouts import Layout  # noqa: E402
from kvnumba.tools.timing import CLOCK, gpu_time, host_time  # noqa: E402
from kvnumba.tools.progress import progress  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_shapes  # noqa: E402

MODELS = {"mha": {"item_size": 2048, "head_num": 8, "kv": True}, "mla": {"item_size": 1152, "head_num": 1, "kv": False}}



def _sglang_direction(name):
    """The direction SGLang uses an entry point in: per-layer loads host->device, backups device->host."""
    return "h2d" if SPECS[name].one_layer else "d2h"


def _model(name):
    return "mla" if SPECS[name].mla else "mha"


# (entry point, direction, model) for every kernel entry point in kvnumba's table (kvnumba.plan.spec): the
# direction SGLang uses, plus device->device.
CASES = [(name, direction, _model(name)) for name in KERNEL_ENTRY_POINTS
         for direction in (_sglang_direction(name), "d2d")]
# Device->device with the whole GPU: block_quota at the SM count.
FULL_GPU_CASES = [("transfer_kv_all_layer", "d2d", "mha"), ("transfer_kv_all_layer_lf_pf", "d2d", "mha"),
                  ("transfer_kv_per_layer_pf_lf", "d2d", "mha")]
# Few tokens: host time is the whole cost (a 64-token prefix hit, one page).
SMALL_CASES = [("transfer_kv_per_layer_pf_lf", "h2d", "mha"), ("transfer_kv_per_layer_pf_lf", "d2d", "mha"),
               ("transfer_kv_per_layer_mla_pf_lf", "h2d", "mla"), ("transfer_kv_all_layer_lf_pf", "d2h", "mha")]
SMALL_TOKENS = 64
# Copy-engine entry points: (entry point, direction, model), on a side stream.
DIRECT_CASES = [(name, _sglang_direction(name), "mha") for name in DIRECT_ENTRY_POINTS]

# kv.copy between cache views: the seed's own pairs (to compare with their entry points), SGLang's
# page_first host pool into vLLM's flash-attention cache, and a layer of SGLang's page-unified host pool (one head
# group) into per-layer caches. (case name, entry point it mirrors, direction, model)
COPY_CASES = [("copy pf->lf per-layer", "transfer_kv_per_layer_pf_lf", "h2d", "mha"),
              ("copy pf->lf per-layer", "transfer_kv_per_layer_pf_lf", "d2d", "mha"),
              ("copy lf->pf all-layer", "transfer_kv_all_layer_lf_pf", "d2h", "mha"),
              ("copy pf->vllm_fa per-layer", None, "h2d", "mha"),
              ("copy pu->lf per-layer", None, "h2d", "mha"),
              ("copy pf->vllm_fa all-layer", None, "d2d", "mha")]

# The operand Pools.operand carves for each (kind of entry point, layout) of kvnumba's table.
_OPERANDS = {("kernel", Layout.LAYER_FIRST): "lf", ("kernel", Layout.LAYER_TABLE): "tbl",
             ("kernel", Layout.PAGE_FIRST): "pf", ("kernel", Layout.PAGE_HEAD): "ph",
             ("direct", Layout.LAYER_FIRST): "lflist", ("direct", PAGE_FIRST_DIRECT): "pfd"}
PLACES = {"h2d": ("host", "device"), "d2h": ("device", "host"), "d2d": ("device", "device2")}


def layouts(op):
    """(source operand, destination operand, moves one layer?) of entry point ``op``."""
    spec = SPECS[op]
    return _OPERANDS[spec.kind, spec.src_layout], _OPERANDS[spec.kind, spec.dst_layout], spec.one_layer


@dataclass
class Shape:
    layers: int = 32
    page_size: int = 64
    tokens: int = 8192
    pool_factor: int = 4
    block_quota: int = 2
    warps: int = 32
    repeat: int = 20  # calls timed per case, split into groups
    host_calls: int = 20  # back-to-back calls per group for host time
    groups: int = 5  # the median of this many groups is reported
    warmup: int = 1  # untimed calls before the device time

    @property
    def pool(self):
        return self.tokens * self.pool_factor

    def device_seconds(self, fn, repeat=None):
        """Device seconds per call of ``fn`` (``kvnumba.tools.timing.gpu_time``): ``repeat`` calls (default:
        ``self.repeat``) in ``groups`` back-to-back groups of at least two (one in a quick run)."""
        per_group = max(2 if self.groups > 1 else 1, (repeat or self.repeat) // self.groups)
        return gpu_time(fn, per_group, groups=self.groups, warmup=self.warmup)

    def host_seconds(self, fn):
        """Host seconds per call of ``fn`` (``kvnumba.tools.timing.host_time``): ``host_calls`` back to back."""
        return host_time(fn, self.host_calls, groups=self.groups)


QUICK = Shape(layers=2, page_size=4, tokens=8, pool_factor=2, block_quota=1, warps=1, repeat=1, host_calls=1,
              groups=1, warmup=0)


# ----------------------------------------------------------------------------------------- backends
class TorchBackend:
    """GPU memory and pinned host memory through torch."""

    def __init__(self):
        import torch

        self.torch = torch
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.name = torch.cuda.get_device_name(0)

    def buffer(self, nbytes, where):
        t = self.torch
        if where == "host":
            return t.empty(nbytes, dtype=t.uint8, pin_memory=True)
        return t.empty(nbytes, dtype=t.uint8, device="cuda")

    def indices(self, array):
        return self.torch.from_numpy(array).cuda()

    def copy_ceiling(self, direction, nbytes, shape):
        src = self.buffer(nbytes, "host" if direction == "h2d" else "device")
        dst = self.buffer(nbytes, "host" if direction == "d2h" else "device")
        return nbytes / shape.device_seconds(lambda: dst.copy_(src, non_blocking=True))


# Host time: few enough back-to-back calls that the launch queue never fills (a full queue would make the
# host wait for the GPU); timing single calls right after a synchronisation measured a cold, woken-up CPU
# instead (2-4x higher for the seed and kvnumba alike, H200 run of 2026-11-30).


class SimulatorBackend:
    """NumPy arrays stand for every kind of memory; the simulator's times (wall clock) mean nothing."""

    sms = 2
    name = "Numba CUDA simulator"

    def buffer(self, nbytes, where):
        return np.zeros(nbytes, np.uint8)

    def indices(self, array):
        return array

    def copy_ceiling(self, direction, nbytes, shape):
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        return nbytes / shape.device_seconds(lambda: np.copyto(dst, src))


# ------------------------------------------------------------------------------------------ buffers
class Pools:
    """One K and one V byte pool per place, carved into whatever layout a case needs."""

    def __init__(self, backend, shape):
        self.backend, self.shape = backend, shape
        self.nbytes = shape.pool * shape.layers * max(m["item_size"] for m in MODELS.values())
        self.pools = {}

    def get(self, place):
        if place not in self.pools:
            self.pools[place] = [self.backend.buffer(self.nbytes, "host" if place == "host" else "device")
                                 for _ in range(2)]
        return self.pools[place]

    def operand(self, layout, pool, item, heads):
        """One K (or V) operand in ``layout`` carved from ``pool`` (a 1-D byte buffer)."""
        s = self.shape
        T, L, P = s.pool, s.layers, s.page_size
        size = T * L * item
        flat = pool[:size]
        if layout == "lf":
            return flat.reshape(L, T, item)[0]
        if layout in ("tbl", "lflist"):
            layers = [flat.reshape(L, T, item)[layer] for layer in range(L)]
            return kvnumba.layer_table(layers) if layout == "tbl" else layers
        if layout == "pf":
            return flat.reshape(T, L, item)
        if layout == "ph":
            return flat.reshape(T // P, heads, P, L, item // heads)
        if layout == "pfd":
            return flat.reshape(T // P, L, P, item)
        raise AssertionError(layout)


def _page_aligned(rng, shape):
    pages = rng.choice(shape.pool // shape.page_size, shape.tokens // shape.page_size, replace=False)
    return (pages[:, None] * shape.page_size + np.arange(shape.page_size)).reshape(-1).astype(np.int64)


def build_call(module, op, direction, model, pools, idx, shape, block_quota, prepared=False):
    """A zero-argument callable running ``module.op`` on this case's buffers, and the bytes it moves.

    ``prepared``: the call through ``kvnumba.prepare`` with everything but the indices and
    ``layer_id`` bound (kvnumba only)."""
    spec = SPECS[op]
    m = MODELS[model]
    item, heads, kv = m["item_size"], m["head_num"], m["kv"]
    src_l, dst_l, one_layer = layouts(op)
    src_place, dst_place = PLACES[direction]
    src_k, src_v = (pools.operand(src_l, p, item, heads) for p in pools.get(src_place))
    dst_k, dst_v = (pools.operand(dst_l, p, item, heads) for p in pools.get(dst_place))
    si, di = idx
    L, P = shape.layers, shape.page_size

    def buffer_list(operand, k, v):
        """A copy-engine side: [K, V] page-first-direct buffers, or per-layer lists, K layers then V."""
        if operand == "pfd":
            return [k, v] if kv else [k]
        if one_layer:
            return [k[0], v[0]] if kv else [k[0]]
        return k + v if kv else k

    if spec.kind == "direct":
        buffers = (buffer_list(src_l, src_k, src_v), buffer_list(dst_l, dst_k, dst_v))
    else:
        buffers = (src_k, dst_k, src_v, dst_v) if kv else (src_k, dst_k)
    # the layer per-layer kernels load; the copy-engine load takes layer 0 of the page-first-direct pool
    layer = 0 if spec.kind == "direct" else min(3, L - 1)
    values = dict(zip(spec.buffers, buffers), src_indices=si, dst_indices=di, layer_id=layer, item_size=item,
                  src_layout_dim=L * item, dst_layout_dim=L * item, num_layers=L, page_size=P, head_num=heads,
                  block_quota=block_quota, num_warps_per_block=shape.warps)
    args = tuple(values[name] for name in spec.params)  # positional: the reference's may have no defaults
    fn = getattr(module, op)
    layers_moved = 1 if one_layer else L
    nbytes = shape.tokens * item * layers_moved * (2 if kv else 1)
    if prepared:
        return _prepared(op, fn, args), nbytes
    return (lambda: fn(*args)), nbytes


def _prepared(op, fn, args):
    spec = SPECS[op]
    named = dict(zip(spec.params, args))
    per_call = [n for n in spec.params if n in ("src_indices", "dst_indices") or spec.role(n) == "layer"]
    transfer = kvnumba.prepare(fn, **{n: v for n, v in named.items() if n not in per_call})
    call_args = tuple(named[n] for n in per_call)
    return lambda: transfer(*call_args)


def build_copy(case, direction, model, pools, idx, shape, block_quota, prepared=False):
    """kv.copy for a COPY_CASES case on the bench's buffers: (call, bytes moved)."""
    m = MODELS[model]
    item, heads = m["item_size"], m["head_num"]
    src_place, dst_place = PLACES[direction]
    T, L, P = shape.pool, shape.layers, shape.page_size
    dim = item // heads // 2  # bf16 elements per head

    def pool_view(place, kind):
        k, v = (flat[: T * L * item] for flat in pools.get(place))
        if kind == "pf":
            return kvnumba.PageFirst(k.reshape(-1, L, heads, dim * 2), v.reshape(-1, L, heads, dim * 2))
        if kind == "lf":
            return kvnumba.LayerFirst([x for x in k.reshape(L, T, heads, dim * 2)], [x for x in v.reshape(L, T, heads, dim * 2)])
        if kind == "pu":  # SGLang's page-unified order, one head group: K and V of L/2 layers in the K pool
            return kvnumba.PageUnified(k.reshape(T // P, 1, L // 2, 2, P, heads, dim * 2))
        blocks = T // P  # vLLM flash-attention: per layer [2, blocks, P, H, D] (K and V halves from the K and V pools)
        per_layer = T * item
        caches = [pools.get(place)[0][2 * layer * per_layer: 2 * (layer + 1) * per_layer].reshape(2, blocks, P, heads, dim * 2)
                  for layer in range(L // 2)]
        return kvnumba.VllmFlashAttn(caches)

    kinds = {"copy pf->lf per-layer": ("pf", "lf"), "copy lf->pf all-layer": ("lf", "pf"),
             "copy pf->vllm_fa per-layer": ("pf", "vllm"), "copy pf->vllm_fa all-layer": ("pf", "vllm"),
             "copy pu->lf per-layer": ("pu", "lf")}[case]
    src, dst = pool_view(src_place, kinds[0]), pool_view(dst_place, kinds[1])
    per_layer = "per-layer" in case
    layers = min(3, L // 2 - 1) if per_layer else (range(0, L // 2) if kinds[1] == "vllm" else None)
    si, di = idx
    layers_moved = 1 if per_layer else (L // 2 if kinds[1] == "vllm" else L)
    nbytes = shape.tokens * item * layers_moved * 2
    if prepared:
        transfer = kvnumba.prepare(kvnumba.copy, src_view=src, dst_view=dst, layers=layers, block_quota=block_quota,
                                   num_warps_per_block=shape.warps)
        return (lambda: transfer(si, di)), nbytes
    return (lambda: kvnumba.copy(src, dst, si, di, layers, block_quota=block_quota,
                                 num_warps_per_block=shape.warps)), nbytes


def _plain_miss(op, call):
    """The plain call with its plan cache emptied first: validation from scratch, every time."""
    from kvnumba.api.transfer import plain

    cache = plain(op)._cache

    def run():
        cache.clear()
        call()

    return run


def torch_indexing_call(backend, op, direction, model, pools, idx, shape):
    """``dst[di] = src[si]`` with torch, for the layer-first and page-first cases (None otherwise)."""
    spec = SPECS[op]
    if SIMULATOR or spec.kind != "kernel" or Layout.PAGE_HEAD in (spec.src_layout, spec.dst_layout):
        return None
    m = MODELS[model]
    item, kv = m["item_size"], m["kv"]
    src_l, dst_l, per_layer = layouts(op)
    src_place, dst_place = PLACES[direction]
    T, L = shape.pool, shape.layers
    si, di = idx
    si_src = si if src_place != "host" else si.cpu()
    di_dst = di if dst_place != "host" else di.cpu()
    pairs = list(zip(pools.get(src_place), pools.get(dst_place)))[: 2 if kv else 1]

    def run():
        for src, dst in pairs:
            s = src[: T * L * item].view(-1, item)
            d = dst[: T * L * item].view(-1, item)
            layers = [min(3, L - 1)] if per_layer else range(L)
            for layer in layers:
                s_rows = si_src + layer * T if src_l in ("lf", "tbl") else si_src * L + layer
                if src_l == "lf":
                    s_rows = si_src
                d_rows = di_dst + layer * T if dst_l in ("lf", "tbl") else di_dst * L + layer
                if dst_l == "lf":
                    d_rows = di_dst
                d[d_rows] = s[s_rows].to(d.device, non_blocking=True)

    return run


def load_reference(spec):
    if spec is None:
        return None
    if spec.endswith(".so") or os.path.sep in spec:
        import torch  # noqa: F401  (the extension needs torch loaded first)

        loaded = importlib.util.spec_from_file_location(os.path.basename(spec).split(".")[0], spec)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def tuning_setup(reference, repeat):
    """What the tuning scripts share: ``(backend, shape, pools, (src, dst) indices in random pages, reference
    module or None, the generator that drew them)`` at the bench's default shape, on a GPU through torch."""
    backend = TorchBackend()
    shape = Shape(repeat=repeat)
    pools = Pools(backend, shape)
    rng = np.random.default_rng(0)
    idx = (backend.indices(_page_aligned(rng, shape)), backend.indices(_page_aligned(rng, shape)))
    return backend, shape, pools, idx, load_reference(reference), rng


def _case(op, direction, model, note):
    """The ``"case"`` string of a planned case (its row's name, and the key ``--resume`` skips by)."""
    return f"{op} {direction} {model}{note}"


def load_previous(path):
    """``(meta, records)`` of an earlier (maybe partial) run written to ``path``, or ``(None, [])``."""
    if not path or not os.path.exists(path):
        return None, []
    with open(path) as f:
        data = json.load(f)
    return data["meta"], data["records"]


def _check_resumable(path, old, meta):
    """Refuse to mix rows measured with other settings, on another device or against another reference."""
    for key in ("shape", "device", "reference", "simulator"):
        if old.get(key) != meta[key]:
            raise SystemExit(f"bench: cannot resume {path}: it was made with {key} {old.get(key)!r}, this run has "
                             f"{meta[key]!r}; use the same settings or another --json file")


def write_json(path, meta, records):
    """Write ``{"meta", "records"}`` to ``path`` atomically: a temporary file beside it, then os.replace, so
    that a run killed at any moment leaves the last complete file."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


SECTIONS = ("overlap", "fp8")  # --only WORD runs that section alone (scripts/overlap.py, scripts/fp8_wire.py)


def _section(args):
    """The section ``--only`` names, or None."""
    return next((s for s in SECTIONS if args.only and s in args.only), None)


def run_section(args, section):
    """``--only overlap`` (loads under compute, ``scripts/overlap.py``, one row per route) or ``--only fp8`` (FP8
    on the wire, ``scripts/fp8_wire.py``); the other words of ``--only`` pick rows by name. ``(meta, records)``."""
    backend = SimulatorBackend() if SIMULATOR else TorchBackend()
    meta = {"date": time.strftime("%Y-%m-%d"), "device": backend.name, "clock": CLOCK, "kvnumba": kvnumba.__version__,
            "reference": args.reference, "simulator": SIMULATOR, "versions": _versions(), "section": section,
            **_provenance(args)}
    reference = load_reference(args.reference)
    words = [w for w in args.only if w != section]  # --only overlap direct: the routes named so, no crossover
    summary = None
    if section == "overlap":
        import overlap  # here: scripts/ab_host_cost.py loads bench.py from checkouts that may not have it

        header, row, rows = OVERLAP_HEADER, _overlap_row, overlap.run(reference, quick=args.quick, words=words)
    else:
        import fp8_wire

        shape = _shape(args)
        meta.update(shape=asdict(shape), targets=fp8_wire.TARGETS)
        bench = fp8_wire.Bench(backend, shape, Pools(backend, shape), reference, build_call)
        header, row, rows = fp8_wire.HEADER, fp8_wire.row, fp8_wire.run(bench, quick=args.quick, words=words)
        summary = fp8_wire.summary
    records = []
    stream = None if getattr(args, "quiet", False) else sys.stderr
    print(header)
    for record in rows:
        records.append(record)
        if args.json:
            write_json(args.json, meta, records)
        print(row(record), flush=True)
        if stream is not None:
            print(f"bench: {record['case']}", file=stream, flush=True)
    if args.json:
        write_json(args.json, meta, records)
    if summary is not None:
        print(summary(records), flush=True)
    return meta, records


OVERLAP_HEADER = (f"{'route':64} {'idle':>6} {'prefill':>7} {'x':>5} {'wall':>5} {'decode':>6} {'x':>5} {'wall':>5} "
                  f"{'host us':>8}   (GB/s; x: compute time with the loads / alone; wall: all / compute alone)")


def _overlap_row(r):
    def f(key, spec):
        return _fmt(r.get(key), spec)

    return (f"{r['case']:64} {f('idle_gbps', '6.1f'):>6} {f('prefill_gbps', '7.1f'):>7} {f('prefill_x', '5.2f'):>5} "
            f"{f('prefill_wall_x', '5.2f'):>5} {f('decode_gbps', '6.1f'):>6} {f('decode_x', '5.2f'):>5} "
            f"{f('decode_wall_x', '5.2f'):>5} {f('host_us', '8.1f'):>8}")


def _shape(args):
    return QUICK if args.quick else Shape(layers=args.layers, page_size=args.page_size, tokens=args.tokens,
                                          pool_factor=args.pool_factor, block_quota=args.block_quota, warps=args.warps,
                                          repeat=args.repeat)


def run(args):
    section = _section(args)
    if section is not None:
        return run_section(args, section)
    shape = _shape(args)
    backend = SimulatorBackend() if SIMULATOR else TorchBackend()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    meta = {"date": time.strftime("%Y-%m-%d"), "device": backend.name, "clock": CLOCK, "shape": asdict(shape),
            "ceilings_gbps": None, "kvnumba": kvnumba.__version__, "reference": args.reference,
            "simulator": SIMULATOR, "versions": _versions(), **_provenance(args)}
    resume = getattr(args, "resume", False)
    old_meta, old_records = load_previous(args.json) if resume else (None, [])
    if old_meta is not None:
        _check_resumable(args.json, old_meta, meta)
    # every run that wrote rows to this file: {"started": date and time, "cases": rows it added}
    runs = (old_meta.get("runs") or [{"started": old_meta["date"], "cases": len(old_records)}]) if old_meta else []
    this_run = {"started": started, "cases": 0}
    meta["runs"] = runs + [this_run]
    done = {r["case"] for r in old_records}

    pools = Pools(backend, shape)
    rng = np.random.default_rng(0)
    idx = (backend.indices(_page_aligned(rng, shape)), backend.indices(_page_aligned(rng, shape)))
    small = Shape(**{**asdict(shape), "tokens": min(SMALL_TOKENS, shape.tokens)})
    small_idx = (backend.indices(_page_aligned(rng, small)), backend.indices(_page_aligned(rng, small)))
    plan = [(c, shape.block_quota, "", shape, idx) for c in CASES]
    plan += [(c, backend.sms, f" bq={backend.sms}", shape, idx) for c in FULL_GPU_CASES]
    plan += [(c, shape.block_quota, f" {small.tokens}tok", small, small_idx) for c in SMALL_CASES]
    plan += [(c, shape.block_quota, " side-stream", shape, idx) for c in DIRECT_CASES if hasattr(kvnumba, c[0])]
    plan += [((name, direction, model), shape.block_quota, " view", shape, idx) for name, _, direction, model in COPY_CASES]
    if args.only:
        plan = [p for p in plan if any(word in p[0][0] + p[2] for word in args.only)]
    sglang = not args.only or "sglang" in args.only
    sglang_cases = sglang_shapes.cases(shape) if sglang else []
    sglang_todo = [c for c in sglang_cases if c not in done]
    todo = [p for p in plan if _case(*p[0], p[2]) not in done]
    skipped = len(plan) - len(todo) + len(sglang_cases) - len(sglang_todo)
    stream = None if getattr(args, "quiet", False) else sys.stderr
    if skipped and stream is not None:
        print(f"bench: {skipped} cases already in {args.json}, skipped; {len(todo) + len(sglang_todo)} to run",
              file=stream, flush=True)
    if skipped and not todo and not sglang_todo:
        if stream is not None:
            print(f"bench: nothing left to run: every case is in {args.json}", file=stream, flush=True)
        return old_meta, old_records

    reference = load_reference(args.reference)
    ceiling_bytes = 256 * 2**20 if not SIMULATOR else 2**16
    ceilings = {d: backend.copy_ceiling(d, ceiling_bytes, shape) for d in ("h2d", "d2h", "d2d")}
    meta["ceilings_gbps"] = {k: v / 1e9 for k, v in ceilings.items()}
    records = list(old_records)  # the earlier runs' rows first, in their order
    # Rows go to stdout; progress to stderr: a tqdm bar on a terminal, else a line per case.
    bar = progress("bench", len(todo) + len(sglang_todo), stream=stream, unit="case", line_per_step=True)

    def add(record):
        """Keep a finished row: print it, and rewrite the JSON file with it (a killed run keeps every row)."""
        records.append(record)
        this_run["cases"] += 1
        if args.json:
            write_json(args.json, meta, records)
        bar.write(_row(record))
        bar.advance(1, record["case"])

    for (op, direction, model), block_quota, note, case_shape, case_idx in todo:
        case = _case(op, direction, model, note)
        record = {"op": op, "case": case, "direction": direction, "model": model, "block_quota": block_quota,
                  "tokens": case_shape.tokens}
        impls = {"kvnumba": kvnumba}
        if reference is not None and hasattr(reference, op):
            impls["reference"] = reference
        if note == " view":  # kv.copy: the mirrored seed entry point is reported beside it by its own row
            record.update(_copy_record(backend, op, direction, model, pools, case_idx, case_shape, block_quota))
            add(record)
            continue
        for name, module in impls.items():
            call, nbytes = build_call(module, op, direction, model, pools, case_idx, case_shape, block_quota)
            if "side-stream" in note and not SIMULATOR:
                call = _on_side_stream(backend, call)
            seconds = shape.device_seconds(call)
            record["bytes"] = nbytes
            record[f"{name}_gbps"] = nbytes / seconds / 1e9
            record[f"{name}_host_us"] = shape.host_seconds(call) * 1e6
            if "side-stream" in note:  # the memcpy target counts host time: wall time of one synchronised call
                wall = host_time(call, 1, groups=max(3, shape.repeat), include_sync=True)
                record[f"{name}_wall_gbps"] = nbytes / wall / 1e9
            if name == "kvnumba":  # host time of the prepared form, and of a plain call that misses the cache
                prepared, _ = build_call(module, op, direction, model, pools, case_idx, case_shape, block_quota,
                                         prepared=True)
                miss = _plain_miss(op, call)
                if "side-stream" in note and not SIMULATOR:
                    prepared = _on_side_stream(backend, prepared)
                record["prepared_host_us"] = shape.host_seconds(prepared) * 1e6
                record["miss_host_us"] = shape.host_seconds(miss) * 1e6
        torch_call = torch_indexing_call(backend, op, direction, model, pools, idx, shape)
        record["torch_gbps"] = (record["bytes"] / shape.device_seconds(torch_call, max(3, shape.repeat // 4)) / 1e9
                                if torch_call else None)
        record["ceiling_gbps"] = ceilings[direction] / 1e9
        record["ratio_to_ceiling"] = record["kvnumba_gbps"] / record["ceiling_gbps"]
        record["reference_gbps"] = record.get("reference_gbps")
        record["ratio_to_reference"] = (record["kvnumba_gbps"] / record["reference_gbps"]
                                        if record["reference_gbps"] else None)
        record["host_us"] = record.pop("kvnumba_host_us")
        record["reference_host_us"] = record.pop("reference_host_us", None)
        add(record)
    if sglang_todo:
        for record in sglang_shapes.rows(backend, shape, reference, shape.block_quota, skip=done):
            record.update(model="mla" if "mla" in record["case"] else "mha", block_quota=shape.block_quota)
            record["ceiling_gbps"] = ceilings[record["direction"]] / 1e9
            record["ratio_to_ceiling"] = record["kvnumba_gbps"] / record["ceiling_gbps"]
            record["reference_gbps"] = record.get("reference_gbps")
            record["ratio_to_reference"] = (record["kvnumba_gbps"] / record["reference_gbps"]
                                            if record["reference_gbps"] else None)
            record["torch_gbps"] = None
            record["host_us"] = record.pop("kvnumba_host_us")
            record["reference_host_us"] = record.pop("reference_host_us", None)
            add(record)
    bar.close()
    if args.json:  # also when no case ran (an --only that matches nothing): the file is written, as before
        write_json(args.json, meta, records)
    return meta, records


def _copy_record(backend, case, direction, model, pools, idx, shape, block_quota):
    call, nbytes = build_copy(case, direction, model, pools, idx, shape, block_quota)
    prepared, _ = build_copy(case, direction, model, pools, idx, shape, block_quota, prepared=True)
    seconds = shape.device_seconds(call)
    ceiling = backend.copy_ceiling(direction, 256 * 2**20 if not SIMULATOR else 2**16, shape) / 1e9
    gbps = nbytes / seconds / 1e9
    return {"bytes": nbytes, "kvnumba_gbps": gbps, "reference_gbps": None, "ratio_to_reference": None,
            "torch_gbps": None, "ceiling_gbps": ceiling, "ratio_to_ceiling": gbps / ceiling,
            "host_us": shape.host_seconds(call) * 1e6,
            "prepared_host_us": shape.host_seconds(prepared) * 1e6, "reference_host_us": None}


def _on_side_stream(backend, call):
    torch = backend.torch
    side = torch.cuda.Stream()

    def run():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)

    return run


def _provenance(args):
    """``commit`` and ``machine`` for the meta, where given (the docs' captions name them), and the folder the
    measured package was imported from (``kvnumba_from``)."""
    given = {key: getattr(args, key) for key in ("commit", "machine") if getattr(args, key, None)}
    return {**given, "kvnumba_from": os.path.dirname(os.path.realpath(kvnumba.__file__))}


def _versions():
    out = {}
    for name in ("numba", "numba_cuda", "numpy", "torch", "cuda.bindings"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:  # noqa: BLE001
            pass
    return out


HEADER = (f"{'case':54} {'MB':>8} {'kvnumba':>9} {'ref':>9} {'torch':>8} {'ceiling':>8} {'x ceil':>7} "
          f"{'x ref':>6} {'host us':>8} {'prep us':>8} {'miss us':>8} {'ref us':>7}")


def _fmt(value, spec):
    return format(value, spec) if value is not None else "-"


def _row(r):
    return (f"{r['case']:54} {r['bytes'] / 1e6:8.1f} {r['kvnumba_gbps']:9.2f} {_fmt(r['reference_gbps'], '9.2f'):>9} "
            f"{_fmt(r['torch_gbps'], '8.2f'):>8} {r['ceiling_gbps']:8.1f} {r['ratio_to_ceiling']:7.2f} "
            f"{_fmt(r['ratio_to_reference'], '6.2f'):>6} {r['host_us']:8.1f} {_fmt(r.get('prepared_host_us'), '8.1f'):>8} "
            f"{_fmt(r.get('miss_host_us'), '8.1f'):>8} {_fmt(r['reference_host_us'], '7.1f'):>7}")


def plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["case"].replace("transfer_kv_", "") for r in records]
    y = np.arange(len(records))
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(records) + 1.5))
    ax.barh(y - 0.2, [r["kvnumba_gbps"] for r in records], 0.4, label="kvnumba")
    ax.barh(y + 0.2, [r["reference_gbps"] or 0 for r in records], 0.4, label="reference")
    ax.scatter([r["ceiling_gbps"] for r in records], y, marker="|", s=200, color="k", label="copy ceiling")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("GB/s (bytes moved / median event time)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="module name or path of a .so exposing the seed's entry points")
    parser.add_argument("--json", help="write one record per case to this file (rewritten after every case)")
    parser.add_argument("--resume", action="store_true",
                        help="with --json: keep the rows already in that file and run only the cases it lacks")
    parser.add_argument("--plot", help="write a PNG bar chart to this file")
    parser.add_argument("--quick", action="store_true", help="every case at a tiny size (works on the simulator)")
    parser.add_argument("--only", nargs="*", help="run only cases whose name contains one of these words")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--pool-factor", type=int, default=4)
    parser.add_argument("--block-quota", type=int, default=2)
    parser.add_argument("--warps", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr (the table still goes to stdout)")
    parser.add_argument("--commit", help="the commit of the code measured, recorded in --json's meta (the GPU "
                                         "machine's copy of a checkout may have no .git)")
    parser.add_argument("--machine", help="words for the machine, recorded in --json's meta")
    args = parser.parse_args(argv)
    if args.resume and not args.json:
        parser.error("--resume needs --json (the file to resume)")
    if _section(args) is None:
        print(HEADER)
    meta, records = run(args)
    if args.plot and _section(args) is None:
        plot(records, args.plot)
    return records


if __name__ == "__main__":
    main()
