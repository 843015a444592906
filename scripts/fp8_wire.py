"""FP8 on the wire, for ``scripts/bench.py --only fp8``: HiCache's transfers with the host copy of the KV cache in
FP8 (``kv.Fp8View``: the backup quantises and the load dequantises inside ``kv.copy``'s kernel), beside the same
transfers in bf16, by kvnumba and by the seed (``--reference``); and with the host copy as vLLM's NVFP4 pages
(``kv.Nvfp4View``: uint8 ``[T/P, 2, P, 8, 72]`` a layer, e2m1 codes and e4m3 scales per 16 elements in regions of
the page, ``kvnumba.quant.nvfp4``; global scales 1.0), format ``nvfp4`` in the rows.

The model and sizes are the bench's (``bench.Shape``): 8 KV heads of 128 bf16 (2048 bytes a token and layer for K,
as many for V), 32 layers, 8192 tokens in random 64-token pages of a pool four times larger. The GPU's cache is
SGLang's: per-layer ``[T, 8, 128]`` bf16 K and V arrays (``kv.LayerFirst`` of per-layer arrays; the bf16 entry
points read the same bytes through a layer table). The host's is page-first, in pinned memory: FP8 codes
``[T, L, 8, 128]`` (uint8, e4m3) with float32 scales ``[T, L, 8, 1]`` (one per token, layer, K/V and head: the
format of ``kvnumba.quant_reference``), or bf16 ``[T, L, 8, 128]`` for the bf16 rows.

Rows (every ``case`` starts with ``fp8``):

- ``backup``: one all-layer backup, GPU (layer-first) -> host (page-first), 8192 tokens, ``block_quota=2``:
  ``kv.copy`` into the FP8 view (quantising), ``kv.copy`` between bf16 views, ``transfer_kv_all_layer_lf_pf``
  (kvnumba's, and the seed's);
- ``load``: one per-layer load, host (page-first) -> GPU (layer-first), layer 3 (``kv.copy(..., layers=3)``), at
  ``block_quota`` 4 and 2: ``kv.copy`` out of the FP8 view (dequantising), ``kv.copy`` between bf16 views,
  ``transfer_kv_per_layer_pf_lf`` (kvnumba's, and the seed's);
- NVFP4 alone, ``backup`` and ``load`` as above at ``block_quota`` 8, 16 and 32 (``NVFP4_QUOTAS``): its kernels
  convert more per byte than FP8's, so the quota at which they fill the link is a row of its own;
- ``under compute``: at ``block_quota=2``, 4 backups in a row and 32 per-layer loads (every layer), each way of
  the rows above, idle and while a compute stream runs: ``scripts/overlap.py``'s prefill GEMMs and decode layers,
  measured as its rows are (``overlap.measure``: ``*_x`` is what the compute pays); and the same 32 layers of
  FP8 and NVFP4 in one ``kv.load_resident`` (``kv.load_resident`` rows).

Every row has ``bf16_bytes`` (the tokens' bytes in bf16: 4096 a token and layer, K and V) and ``link_bytes`` (the
bytes that cross PCIe: FP8 codes and scales, 2 x (1024 + 32) a token and layer, NVFP4's 2 x 576, or the bf16
bytes), and their
ratio ``link_per_bf16``. Idle rows: ``gpu_ms`` (CUDA events, median of groups: ``Shape.device_seconds``),
``host_us`` (``Shape.host_seconds``), ``bf16_gbps`` (bf16 bytes / GPU time: the rate tokens move at) and
``link_gbps`` (link bytes / GPU time). Under-compute rows: ``overlap.measure``'s figures in GB/s of bf16 bytes
(``idle_gbps``, ``prefill_gbps``, ``decode_gbps``), with ``*_link_gbps`` beside them.

Before it is timed, every FP8 call runs once onto poisoned destinations and is checked bit for bit against
``kvnumba.quant_reference`` (``quantise``, ``dequantise``) on a sample of its tokens: ``verified``. ``summary``
prints the targets (``TARGETS``, PASS or MISS) and a short table, last.

``--quick`` (a GPU) and the simulator run every row on tiny buffers, the under-compute rows idle only.
"""
import dataclasses
import time
from typing import Any, Callable

import numpy as np

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.driver.target import SIMULATOR
from kvnumba.quant import nvfp4
from kvnumba.quant.fp8 import PLAIN_DTYPES
from kvnumba.tools.timing import synchronize

import overlap
import sglang_shapes

FMT = "e4m3"
HEADS = sglang_shapes.HEADS["mha"]
ITEM = sglang_shapes.ITEM["mha"]  # bf16 bytes of one token's K (or V) in one layer
HEAD_DIM = ITEM // 2 // HEADS
FP8_ITEM = HEADS * HEAD_DIM + 4 * HEADS  # codes and scales of the same
NVFP4_ITEM = HEADS * nvfp4.full_dim(HEAD_DIM)  # NVFP4 codes and scales of the same
BACKUP_OP, LOAD_OP = "transfer_kv_all_layer_lf_pf", "transfer_kv_per_layer_pf_lf"
LOAD_QUOTAS = (4, 2)
NVFP4_QUOTAS = (8, 16, 32)  # NVFP4 rows alone: the quotas at which its kernels can fill the link
BACKUPS_UNDER_COMPUTE = 4  # backups in a row under compute (32 GEMMs take about as long as 4 FP8 backups)
SAMPLE = 64  # tokens checked against the reference per FP8 call
POISON_CODE = 0xAB

# (what, case of the row, key, "<=" or ">=", bound): printed by summary, kept in the JSON's meta
TARGETS = [("link bytes per bf16 byte", "fp8 backup e4m3 kv.copy bq=2", "link_per_bf16", "<=", 0.52),
           ("backup, GB/s of bf16", "fp8 backup e4m3 kv.copy bq=2", "bf16_gbps", ">=", 90.0),
           ("per-layer load bq=4, GB/s of bf16", "fp8 load e4m3 kv.copy bq=4", "bf16_gbps", ">=", 90.0),
           ("per-layer load bq=2, GB/s of bf16", "fp8 load e4m3 kv.copy bq=2", "bf16_gbps", ">=", 80.0),
           ("NVFP4 backup, GB/s of bf16", "fp8 backup nvfp4 kv.copy bq=2", "bf16_gbps", ">=", 150.0),
           ("NVFP4 load bq=4, GB/s of bf16", "fp8 load nvfp4 kv.copy bq=4", "bf16_gbps", ">=", 150.0),
           ("NVFP4 backup bq=16, GB/s of bf16", "fp8 backup nvfp4 kv.copy bq=16", "bf16_gbps", ">=", 150.0),
           ("NVFP4 load bq=16, GB/s of bf16", "fp8 load nvfp4 kv.copy bq=16", "bf16_gbps", ">=", 150.0)]


@dataclasses.dataclass
class Bench:
    """What ``bench.py`` hands over: its backend (torch or the simulator's NumPy), shape, byte pools, the seed
    (or None) and ``build_call`` (an entry point's call on the pools)."""

    backend: Any
    shape: Any
    pools: Any
    reference: Any
    build_call: Callable


# --------------------------------------------------------------------------------------- buffers
def _typed(buffer, dtype, shape):
    """The bytes of ``buffer`` (a 1-D uint8 torch tensor or NumPy array) as ``dtype`` shaped ``shape``."""
    if type(buffer).__module__.startswith("torch"):
        import torch

        return buffer.view(getattr(torch, dtype)).reshape(shape)
    return buffer.view(PLAIN_DTYPES.get(dtype, dtype)).reshape(shape)


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _bits(x):
    """A NumPy copy of ``x``'s elements as unsigned integers of their size (bit patterns: NaN compares)."""
    if _is_torch(x):
        import torch

        x = x.detach().cpu().contiguous()
        x = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]).numpy()
    x = np.ascontiguousarray(x)
    return x.view(f"u{x.dtype.itemsize}")


def _take(x, index):
    """``x[index]`` (rows of the first axis), ``index`` a NumPy array."""
    if _is_torch(x):
        import torch

        return x.index_select(0, torch.from_numpy(index).to(x.device))
    return x[index]


def _fill(x, index, value):
    """``x[index] = value`` in place."""
    if _is_torch(x):
        import torch

        x.index_fill_(0, torch.from_numpy(index).to(x.device), value)
    else:
        x[index] = value


class Caches:
    """The GPU's bf16 cache (the bench's device pools, normal random values) and the host's page-first caches in
    bf16 (the bench's host pools) and FP8 (pinned buffers of its own), with the indices of the calls: ``d1`` GPU
    tokens backed up into host tokens ``h1``, which the loads bring back to GPU tokens ``d2`` (random pages, ``d1``
    and ``d2`` apart)."""

    def __init__(self, bench, rng):
        backend, s = bench.backend, bench.shape
        T, L, P = s.pool, s.layers, s.page_size
        n = T * L * ITEM
        device = [_typed(p[:n], "bfloat16", (L, T, HEADS, HEAD_DIM)) for p in bench.pools.get("device")]
        for d in device:
            if _is_torch(d):
                d.normal_()
            else:
                d[...] = rng.standard_normal(d.shape, dtype=np.float32).astype(d.dtype)
        self.layers = [[d[layer] for layer in range(L)] for d in device]  # K, V: per layer [T, H, D]
        self.device = kv.LayerFirst(*self.layers)
        host = bench.pools.get("host")
        self.host_bf16 = kv.PageFirst(*(_typed(p[:n], "bfloat16", (T, L, HEADS, HEAD_DIM)) for p in host))
        self.host_bytes = [p[:n].reshape(T, L, ITEM) for p in host]  # the entry points' operands
        self.device_bytes = [[layer.reshape(T, ITEM) for layer in _typed(p[:n], "uint8", (L, T * ITEM))]
                             for p in bench.pools.get("device")]
        codes_n = T * L * HEADS * HEAD_DIM
        raw = [backend.buffer(codes_n + T * L * HEADS * 4, "host") for _ in range(2)]
        self.codes = [r[:codes_n].reshape(T, L, HEADS, HEAD_DIM) for r in raw]
        self.scales = [_typed(r[codes_n:], "float32", (T, L, HEADS, 1)) for r in raw]
        self.host_fp8 = kv.Fp8View(kv.PageFirst(*self.codes), kv.PageFirst(*self.scales), FMT)
        pages = backend.buffer(L * T * 2 * NVFP4_ITEM, "host").reshape(L, T // P, 2, P, HEADS, NVFP4_ITEM // HEADS)
        self.host_nvfp4 = kv.Nvfp4View([pages[layer] for layer in range(L)], dtype="bfloat16")
        device_pages = np.split(rng.choice(T // P, 2 * s.tokens // P, replace=False), 2)
        host_pages = rng.choice(T // P, s.tokens // P, replace=False)
        self.d1, self.d2, self.h1 = ((p[:, None] * P + np.arange(P)).reshape(-1).astype(np.int64)
                                     for p in device_pages + [host_pages])
        self.on_gpu = {name: backend.indices(getattr(self, name)) for name in ("d1", "d2", "h1")}
        self.sample = np.sort(rng.choice(s.tokens, min(SAMPLE, s.tokens), replace=False))


# ----------------------------------------------------------------------------------------- calls
def _calls(bench, c, what, block_quota):
    """``{(format, api, impl): call}`` for one row group: ``call(layer)`` moves the tokens of the backup (every
    layer; ``layer`` ignored) or of the load (that layer)."""
    warps = bench.shape.warps
    L = bench.shape.layers
    d1, d2, h1 = c.on_gpu["d1"], c.on_gpu["d2"], c.on_gpu["h1"]
    launch = {"block_quota": block_quota, "num_warps_per_block": warps}
    impls = {"kvnumba": kv}
    if bench.reference is not None and hasattr(bench.reference, BACKUP_OP if what == "backup" else LOAD_OP):
        impls["seed"] = bench.reference
    out = {}
    if what == "backup":
        out[FMT, "kv.copy", "kvnumba"] = lambda layer=None: kv.copy(c.device, c.host_fp8, d1, h1, **launch)
        out["nvfp4", "kv.copy", "kvnumba"] = lambda layer=None: kv.copy(c.device, c.host_nvfp4, d1, h1, **launch)
        out["bf16", "kv.copy", "kvnumba"] = lambda layer=None: kv.copy(c.device, c.host_bf16, d1, h1, route="kernel",
                                                                       **launch)
        for impl, module in impls.items():
            call, _ = bench.build_call(module, BACKUP_OP, "d2h", "mha", bench.pools, (d1, h1), bench.shape,
                                       block_quota)
            out["bf16", BACKUP_OP, impl] = lambda layer=None, call=call: call()
        return out
    out[FMT, "kv.copy", "kvnumba"] = lambda layer: kv.copy(c.host_fp8, c.device, h1, d2, layer, **launch)
    out["nvfp4", "kv.copy", "kvnumba"] = lambda layer: kv.copy(c.host_nvfp4, c.device, h1, d2, layer, **launch)
    out["bf16", "kv.copy", "kvnumba"] = lambda layer: kv.copy(c.host_bf16, c.device, h1, d2, layer, route="kernel",
                                                              **launch)
    (hk, hv), (dk, dv) = c.host_bytes, c.device_bytes
    for impl, module in impls.items():
        out["bf16", LOAD_OP, impl] = lambda layer, fn=getattr(module, LOAD_OP): fn(
            hk, dk[layer], hv, dv[layer], h1, d2, layer, ITEM, L * ITEM, block_quota, warps)
    return out


def _resident(c, block_quota=2):
    """The under-compute load rows' resident loads: every layer in one ``kv.load_resident`` call at layer 0 (and
    nothing at the others, ``overlap.whole_load``), each layer signalled as it lands."""
    d2, h1 = c.on_gpu["d2"], c.on_gpu["h1"]
    out = {}
    for fmt, view in ((FMT, c.host_fp8), ("nvfp4", c.host_nvfp4)):
        signal = kv.LayerSignal(len(c.layers[0]))
        out[fmt, "kv.load_resident", "kvnumba"] = overlap.whole_load(
            lambda view=view, signal=signal: kv.load_resident(view, c.device, h1, d2, block_quota=block_quota,
                                                              signal=signal))
    return out


def _case(what, fmt, api, impl, block_quota, under=False):
    return (f"fp8 {'under compute ' if under else ''}{what} {fmt} {api} bq={block_quota}"
            + (" [seed]" if impl == "seed" else ""))


def _bytes(bench, what, fmt):
    """``(bf16 bytes, link bytes)`` one call moves."""
    s = bench.shape
    moved = s.tokens * 2 * (s.layers if what == "backup" else 1)
    return moved * ITEM, moved * {FMT: FP8_ITEM, "nvfp4": NVFP4_ITEM}.get(fmt, ITEM)


# ---------------------------------------------------------------------------------------- checks
def verify(c, what, call, layer, fmt=FMT):
    """Run ``call(layer)`` once onto poisoned destinations and compare a sample of its tokens with
    ``kvnumba.quant_reference`` (NVFP4: ``kvnumba.quant.nvfp4``), bit for bit; ``AssertionError`` when they differ."""
    host = c.h1[c.sample]
    gpu = (c.d1 if what == "backup" else c.d2)[c.sample]
    synchronize()
    for which in range(2):
        if what == "load":
            _fill(c.layers[which][layer], gpu, float("nan"))
        elif fmt == "nvfp4":
            P = c.host_nvfp4.page_size
            for part in (part for l in range(len(c.layers[which])) for part in c.host_nvfp4.layer_regions(l)):
                part[host // P, which, host % P] = POISON_CODE
        else:
            _fill(c.codes[which], host, POISON_CODE)
            _fill(c.scales[which], host, float("nan"))
    call(layer)
    synchronize()
    kv.check_errors()
    for which in range(2):
        codes, scales = _host_tokens(c, fmt, which, host)  # [n, L, H, ...]
        if what == "backup":
            values = np.stack([_bits(_take(x, gpu)) for x in c.layers[which]], axis=1)  # [n, L, H, D]
            want_codes, want_scales = (nvfp4.quantise(values, 1.0, "bfloat16") if fmt == "nvfp4"
                                       else qr.quantise(values, FMT, "bfloat16"))
            _same(codes, want_codes, f"{what} codes")
            _same(scales, want_scales.view(scales.dtype), f"{what} scales")
            continue
        codes, scales = codes[:, layer], scales[:, layer]
        want = (nvfp4.dequantise(codes, scales) if fmt == "nvfp4"
                else qr.dequantise(codes, scales.view(np.float32), "bfloat16", FMT))
        _same(_bits(_take(c.layers[which][layer], gpu)), want.view(np.uint16), f"{what} layer {layer}")


def _host_tokens(c, fmt, which, tokens):
    """``(codes, scales)`` of the host's K (``which`` 0) or V at ``tokens``, every layer, as NumPy bits."""
    if fmt != "nvfp4":
        return _bits(_take(c.codes[which], tokens)), _bits(_take(c.scales[which], tokens))
    P = c.host_nvfp4.page_size
    parts = [c.host_nvfp4.layer_regions(l) for l in range(len(c.layers[which]))]
    return tuple(np.stack([p[i][tokens // P, which, tokens % P] for p in parts], axis=1) for i in (0, 1))


def _same(got, want, what):
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = int((got != want).sum()) if got.shape == want.shape else "all"
        raise AssertionError(f"fp8 bench: the {what} differ from kvnumba.quant_reference ({bad} of {want.size} "
                             "elements of the sample)")


# ------------------------------------------------------------------------------------------- rows
def run(bench, quick=False, words=()):
    """Every row of the module docstring, one record at a time; ``words``: only the rows whose case holds one."""
    s = bench.shape
    rng = np.random.default_rng(3)
    c = Caches(bench, rng)
    kv.copy(c.device, c.host_fp8, c.on_gpu["d1"], c.on_gpu["h1"], block_quota=2, num_warps_per_block=s.warps)
    kv.copy(c.device, c.host_nvfp4, c.on_gpu["d1"], c.on_gpu["h1"], block_quota=2, num_warps_per_block=s.warps)
    synchronize()  # the host's FP8 and NVFP4 tokens the loads read, whatever rows run

    def wanted(case):
        return not words or any(w in case for w in words)

    layer = min(3, s.layers - 1)
    groups = ([("backup", 2)] + [("load", bq) for bq in LOAD_QUOTAS]
              + [(what, bq) for bq in NVFP4_QUOTAS for what in ("backup", "load")])
    for what, bq in groups:
        for (fmt, api, impl), call in _calls(bench, c, what, bq).items():
            case = _case(what, fmt, api, impl, bq)
            if not wanted(case) or (bq in NVFP4_QUOTAS and fmt != "nvfp4"):
                continue
            record = _record(bench, case, what, fmt, api, impl, bq)
            if fmt != "bf16":
                verify(c, what, call, layer, fmt)
                record["verified"] = True
            one = (lambda call=call: call(layer))
            seconds = s.device_seconds(one)
            record.update(gpu_ms=seconds * 1e3, host_us=s.host_seconds(one) * 1e6,
                          bf16_gbps=record["bf16_bytes"] / seconds / 1e9, link_gbps=record["link_bytes"] / seconds / 1e9)
            yield record
    under = [(case, what, key, call) for what in ("backup", "load")
             for key, call in {**_calls(bench, c, what, 2), **(_resident(c) if what == "load" else {})}.items()
             for case in [_case(what, *key, 2, under=True)] if wanted(case)]
    if not under:
        return
    measure = _measure_idle if (quick or SIMULATOR) else _measure_under_compute()
    for case, what, (fmt, api, impl), call in under:
        calls = BACKUPS_UNDER_COMPUTE if what == "backup" else s.layers
        record = _record(bench, case, what, fmt, api, impl, 2)
        if fmt != "bf16":
            verify(c, what, call, 0, fmt)
            record["verified"] = True
        record["calls"] = calls
        record.update(measure(call, record["bf16_bytes"], calls))
        ratio = record["link_per_bf16"]
        for key in [k for k in record if k.endswith("_gbps")]:
            record[key.replace("_gbps", "_link_gbps")] = record[key] * ratio
        yield record


def _record(bench, case, what, fmt, api, impl, block_quota):
    bf16, link = _bytes(bench, what, fmt)
    return {"case": case, "section": "fp8", "what": what, "format": fmt, "api": api, "impl": impl,
            "block_quota": block_quota, "warps": bench.shape.warps, "tokens": bench.shape.tokens,
            "layers_moved": bench.shape.layers if what == "backup" else 1, "bf16_bytes": bf16, "link_bytes": link,
            "link_per_bf16": link / bf16, "verified": None}


def _measure_idle(call, nbytes, calls):
    """The calls once, idle (``--quick``, the simulator: a check that they run; the time means nothing)."""
    synchronize()
    start = time.perf_counter()
    for layer in range(calls):
        call(layer)
    synchronize()
    seconds = time.perf_counter() - start
    return {"idle_seconds": seconds, "idle_gbps": nbytes * calls / seconds / 1e9}


def _measure_under_compute():
    """``overlap.measure`` with its compute streams, after one call of each layer (every plan built first)."""
    import torch

    compute = overlap.Compute(torch)
    for fn, n in compute.kinds.values():  # the GPU at its working clock
        for _ in range(2):
            fn()
    torch.cuda.synchronize()

    def measure(call, nbytes, calls):
        for layer in range(calls):
            call(layer)
        torch.cuda.synchronize()
        return overlap.measure(torch, compute, call, nbytes, calls)

    return measure


# ---------------------------------------------------------------------------------------- printing
HEADER = (f"{'case':72} {'link/bf16':>9} {'gpu ms':>8} {'bf16 GB/s':>9} {'link GB/s':>9} {'host us':>8} "
          f"{'checked':>8}\n(under compute: GB/s of bf16 bytes idle, beside the prefill GEMMs, beside the decode "
          "layers; x: the compute's time with the transfers / alone)")


def _fmt(value, spec):
    return format(value, spec) if value is not None else "-"


def row(r):
    """One printed line of a record."""
    checked = {True: "bitexact", None: "-"}[r["verified"]]
    if "idle_gbps" in r:
        return (f"{r['case']:72} {r['link_per_bf16']:9.3f} idle {_fmt(r.get('idle_gbps'), '6.1f')} prefill "
                f"{_fmt(r.get('prefill_gbps'), '6.1f')} x {_fmt(r.get('prefill_x'), '4.2f')} decode "
                f"{_fmt(r.get('decode_gbps'), '6.1f')} x {_fmt(r.get('decode_x'), '4.2f')} {checked:>8}")
    return (f"{r['case']:72} {r['link_per_bf16']:9.3f} {r['gpu_ms']:8.3f} {r['bf16_gbps']:9.1f} {r['link_gbps']:9.1f} "
            f"{r['host_us']:8.1f} {checked:>8}")


def summary(records):
    """The targets, PASS or MISS, and the GB/s of bf16 bytes side by side: the lines printed last."""
    by_case = {r["case"]: r for r in records}
    lines = ["", "FP8 on the wire: targets"]
    for what, case, key, op, bound in TARGETS:
        r = by_case.get(case)
        if r is None:
            lines.append(f"  {what:40} {'-':>8}  {op} {bound:<6} not run")
            continue
        value = r[key]
        ok = value <= bound if op == "<=" else value >= bound
        lines.append(f"  {what:40} {value:8.3f}  {op} {bound:<6} {'PASS' if ok else 'MISS'}")
    columns = [(FMT, "kv.copy", "kvnumba"), ("nvfp4", "kv.copy", "kvnumba"), ("bf16", "kv.copy", "kvnumba"),
               ("bf16", None, "kvnumba"), ("bf16", None, "seed")]
    lines += ["", "GB/s of bf16 bytes (link GB/s)",
              f"  {'':24} {'e4m3 kv.copy':>15} {'nvfp4 kv.copy':>15} {'bf16 kv.copy':>15} {'bf16 entry point':>16} "
              f"{'bf16 seed':>15}"]
    quotas = ([("backup", 2)] + [("load", q) for q in LOAD_QUOTAS]
              + [(w, q) for q in NVFP4_QUOTAS for w in ("backup", "load")])
    rows = ([(f"{what} bq={bq}", what, bq, False, "") for what, bq in quotas]
            + [(f"{what} bq=2 {kind}", what, 2, True, kind) for what in ("backup", "load") for kind in ("prefill", "decode")])
    for label, what, bq, under, kind in rows:
        cells = []
        for fmt, api, impl in columns:
            api = api or (BACKUP_OP if what == "backup" else LOAD_OP)
            r = by_case.get(_case(what, fmt, api, impl, bq, under))
            key = f"{kind}_gbps" if under else "bf16_gbps"
            link = f"{kind}_link_gbps" if under else "link_gbps"
            cells.append(f"{r[key]:6.1f} ({r[link]:5.1f})" if r is not None and r.get(key) is not None else "-")
        lines.append(f"  {label:24} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {cells[3]:>16} {cells[4]:>15}")
    return "\n".join(lines)
