"""Loads under compute, for ``scripts/bench.py --only overlap``: HiCache's per-layer loads while a model computes.

HiCache loads layer ``l + 1`` on a side stream while the model computes layer ``l``; a figure taken on an idle
GPU says little about that. Each row here is one *route* (an entry point, a ``kv.copy`` route, a launch shape,
SM lanes) for one host layout: 32 per-layer host->device loads of ``tokens`` tokens (8-KV-head bf16 items of
2048 bytes, MLA 1152; page-aligned random indices, pages of 64), measured three ways:

- ``idle``: the 32 loads alone; GB/s = bytes / event time from the first load to the last;
- ``prefill``: while a compute stream runs 32 back-to-back 8192x8192x8192 bf16 GEMMs (like a prefill), and
- ``decode``: while it runs 256 decode-like layers (a 256-token batch of an 8B model: QKV, output and MLP GEMMs,
  an RMS norm, SiLU and adds).

The compute is queued first, then the loads on their own stream; the compute's time is taken by events on its
stream. For each kind, three rounds alternate the compute alone and the compute with the loads (the GPU's clock
drifts over seconds): ``*_x`` is the median ratio of the two compute times (the price the compute pays),
``*_wall_x`` the median ratio of the whole (first start to last end) to the compute alone, ``*_gbps`` the loads'
GB/s while the compute ran. SM-lane rows run the compute on the lanes' compute stream (fewer SMs) and compare it
with the compute alone on every SM. ``host_us``: host time per load call (20 back to back, median of 5).
``kv.copy auto`` rows say which route ``auto`` took (``auto_took``), and per-layer kernel rows whether their plan
bound the staged kernel (``staged_bound``); SGLang's page-unified pool is loaded so with one head group and with
two. ``resident loader bq=N`` rows load all 32 layers in one ``kv.load_resident`` (N blocks
held for the whole load, each layer signalled as it lands; ``resident load auto`` rows with host indices, where
``auto`` takes the copy engine for long runs: ``auto_took``), ``kv.copy all layers`` rows in one ``kv.copy`` over
every layer, for page-first, page-head, layer-first, page-unified and MLA page-first pools: GB/s over the
whole load, ``host_us`` per whole load. ``waits`` rows give the model's side: the compute split into 32 layers, each
waiting on the GPU for its layer of a resident load queued first (GB/s: the load's bytes over the time from its
issue to its last layer landing, seen on a third stream; ``x``: the compute's time so over its time alone; the
JSON's ``wait_host_us``: host time of one wait). The simulator's quick run has no streams to wait on: no such rows.
``high-priority stream`` rows: the same resident load on a stream of the highest priority, whose blocks the
scheduler places first. ``held`` rows move nothing: 1 to 8 SMs held whole by blocks that only wait, beside the
compute, give what taking SMs costs the compute (``held_sms``), the bound on a loader that takes its SMs whole.

The seed (``--reference``, SGLang's CUDA kernels) runs its own entry points on the same buffers and indices.
``crossover`` rows time one load of runs of 2 KiB to 256 KiB through ``kv.copy`` by each route, idle and under
the GEMMs: where the copy engine starts to win (``kvnumba.plan.routes.COPY_ENGINE_MIN_BYTES``).
Needs torch on a GPU. ``--quick`` (and the simulator, always) runs every route once, idle, on tiny buffers.
"""
import statistics
import time

import numpy as np

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from kvnumba.plan import kernel_plan

ITEM = {"mha": 2048, "mla": 1152}
HEADS = {"mha": 8, "mla": 1}
LAYERS, PAGE = 32, 64
LANE_SMS = 8  # the SM lanes rows' transfer SMs
HIGHEST_PRIORITY = -5  # a stream priority past CUDA's highest (-5 on recent GPUs): torch clamps it to that


class Buffers:
    """Pinned host pools (page-first, with layer-first, page-head and page-first-direct views of the same
    bytes; K and V the two halves of one allocation, which SGLang's page-unified order views whole) and the
    GPU's per-layer caches, for ``tokens`` tokens out of a pool twice as large. torch tensors on a GPU; NumPy
    arrays on the simulator (``torch=None``)."""

    def __init__(self, torch, tokens, layers=LAYERS, page=PAGE):
        self.tokens, self.layers, self.page = tokens, layers, page
        self.pool = pool = max(2 * tokens, 2 * page)
        n = pool * layers * ITEM["mha"]
        rng = np.random.default_rng(0)
        if torch is None:
            self.whole = rng.integers(0, 256, 2 * n, dtype=np.uint8)
            self.gpu = [np.zeros(n, np.uint8) for _ in range(2)]
        else:
            self.whole = torch.empty(2 * n, dtype=torch.uint8, pin_memory=True)
            self.whole.view(torch.int64).random_()
            self.gpu = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.host = [self.whole[:n], self.whole[n:]]
        self.src, self.dst = self._pages(rng), self._pages(rng)
        if torch is None:
            self.src_gpu, self.dst_gpu, self.src_cpu, self.dst_cpu = self.src, self.dst, self.src, self.dst
        else:
            self.src_gpu, self.dst_gpu = (torch.from_numpy(i).cuda() for i in (self.src, self.dst))
            self.src_cpu, self.dst_cpu = (torch.from_numpy(i).pin_memory() for i in (self.src, self.dst))

    def _pages(self, rng):
        pages = rng.choice(self.pool // self.page, self.tokens // self.page, replace=False)
        return (pages[:, None] * self.page + np.arange(self.page)).reshape(-1).astype(np.int64)

    def host_as(self, layout, model="mha"):
        """K and V host pools in ``layout``: ``pf`` [T, L, item], ``lf`` [L, T, item], ``ph`` [T/P, H, P, L, D],
        ``pfd`` [T/P, L, P, item]."""
        item, heads, T, L, P = ITEM[model], HEADS[model], self.pool, self.layers, self.page
        shapes = {"pf": (T, L, item), "lf": (L, T, item), "ph": (T // P, heads, P, L, item // heads),
                  "pfd": (T // P, L, P, item)}
        return [h[:T * L * item].reshape(shapes[layout]) for h in self.host]

    def page_unified(self, groups=1):
        """The host bytes as one SGLang page-unified pool ``[T/P, G, L, 2, P, H/G, D]`` (bytes for D)."""
        item, heads, T, L, P = ITEM["mha"], HEADS["mha"], self.pool, self.layers, self.page
        return kv.PageUnified(self.whole[:2 * T * L * item].reshape(T // P, groups, L, 2, P, heads // groups,
                                                                    item // heads))

    def gpu_layers(self, model="mha"):
        item, T, L = ITEM[model], self.pool, self.layers
        return [g[:L * T * item].reshape(L, T, item) for g in self.gpu]

    def gpu_heads(self):
        """The GPU's layer-first caches with items of 8 heads, as a page-unified pool's are."""
        item, heads, T, L = ITEM["mha"], HEADS["mha"], self.pool, self.layers
        return kv.LayerFirst(*(g[:L * T * item].reshape(L, T, heads, item // heads) for g in self.gpu))

    def bytes_per_load(self, model="mha"):
        return self.tokens * ITEM[model] * (1 if model == "mla" else 2)


def routes(b, sms, reference):
    """``{name: (load(layer), model, on SM lanes?, implementation)}``: every route of every layout, kvnumba's
    and (with ``reference``) the seed's on the same buffers."""
    gk, gv = b.gpu_layers()
    si, di, si_cpu, di_cpu = b.src_gpu, b.dst_gpu, b.src_cpu, b.dst_cpu
    item, L, P = ITEM["mha"], b.layers, b.page
    lf_k, lf_v = b.host_as("lf")
    pf_k, pf_v = b.host_as("pf")
    ph_k, ph_v = b.host_as("ph")
    pfd_k, pfd_v = b.host_as("pfd")
    mla_pf = b.host_as("pf", "mla")[0]
    mla_gpu = b.gpu_layers("mla")[0]
    lf_views = (kv.LayerFirst(lf_k, lf_v), kv.LayerFirst(gk, gv))
    out = {}

    def add(name, load, model="mha", lanes=False, impl="kvnumba"):
        out[f"{name}  [seed]" if impl == "seed" else name] = (load, model, lanes, impl)

    def kernels(module, impl, bq=2, warps=32, lanes=False, suffix=""):
        add(f"layer-first kernel{suffix}", lambda l: module.transfer_kv_per_layer(
            lf_k[l], gk[l], lf_v[l], gv[l], si, di, item, bq, warps), lanes=lanes, impl=impl)
        add(f"page-first kernel{suffix}", lambda l: module.transfer_kv_per_layer_pf_lf(
            pf_k, gk[l], pf_v, gv[l], si, di, l, item, L * item, bq, warps), lanes=lanes, impl=impl)
        add(f"page-head kernel{suffix}", lambda l: module.transfer_kv_per_layer_ph_lf(
            ph_k, gk[l], ph_v, gv[l], si, di, l, item, L * item, P, HEADS["mha"], bq, warps), lanes=lanes, impl=impl)
        add(f"mla page-first kernel{suffix}", lambda l: module.transfer_kv_per_layer_mla_pf_lf(
            mla_pf, mla_gpu[l], si, di, l, ITEM["mla"], L * ITEM["mla"], bq, warps), "mla", lanes=lanes, impl=impl)

    def copy_engines(module, impl):
        add("layer-first direct (copy engine)", lambda l: module.transfer_kv_direct(
            [lf_k[l], lf_v[l]], [gk[l], gv[l]], si_cpu, di_cpu, P), impl=impl)
        add("page-first-direct direct (copy engine)", lambda l: module.transfer_kv_per_layer_direct_pf_lf(
            [pfd_k, pfd_v], [gk[l], gv[l]], si_cpu, di_cpu, l, P), impl=impl)

    kernels(kv, "kvnumba")
    kernels(kv, "kvnumba", bq=sms, warps=1, suffix=" beside compute (one warp per SM)")
    kernels(kv, "kvnumba", bq=LANE_SMS, lanes=True, suffix=f" on SM lanes ({LANE_SMS} SMs)")
    copy_engines(kv, "kvnumba")
    add("layer-first kv.copy auto (host indices)", lambda l: kv.copy(*lf_views, si_cpu, di_cpu, l))
    # SGLang's page-unified pool: with one head group a page's K (or V) of a layer is one run (P x 2 KiB), which
    # auto gives the copy engine; with two, a token's heads are two runs of 1 KiB and auto follows the crossover.
    gpu_heads = b.gpu_heads()
    for groups in (1, 2):
        pu = b.page_unified(groups)
        add(f"page-unified kv.copy auto, {groups} head group{'s' if groups > 1 else ''} (host indices)",
            lambda l, pu=pu: kv.copy(pu, gpu_heads, si_cpu, di_cpu, l))
    pfd_views = (kv.PageFirstDirect(pfd_k, pfd_v, page_size=P), kv.LayerFirst(gk, gv))
    add("page-first-direct kv.copy auto (host indices)", lambda l: kv.copy(*pfd_views, si_cpu, di_cpu, l))
    add("page-first-direct kv.copy kernel", lambda l: kv.copy(*pfd_views, si, di, l, route="kernel"))
    # Every layer in one launch: kv.copy over all layers, and the resident loader (kv.load_resident), each on
    # block_quota SMs for the whole load; such a load runs at layer 0 (whole_load).
    one_launch = {"page-first": (kv.PageFirst(pf_k, pf_v), kv.LayerFirst(gk, gv), "mha"),
                  "page-head": (kv.PageHead(ph_k, ph_v), gpu_heads, "mha"),
                  "layer-first": (*lf_views, "mha"),
                  "page-unified": (b.page_unified(1), gpu_heads, "mha"),
                  "mla page-first": (kv.PageFirst(mla_pf), kv.LayerFirst(mla_gpu), "mla")}
    for layout, (src, dst, model) in one_launch.items():
        for bq in (1, 2, 4):
            signal = kv.LayerSignal(L)
            add(f"{layout} resident loader bq={bq}", whole_load(
                lambda src=src, dst=dst, bq=bq, signal=signal: kv.load_resident(src, dst, si, di, block_quota=bq,
                                                                                 signal=signal)), model)
        # The same load on a stream of the highest priority: the block scheduler gives its blocks the first SMs
        # that free up, so the loader holds its two SMs from the start (the compute then runs on the others).
        signal = kv.LayerSignal(L)
        add(f"{layout} resident loader bq=2, high-priority stream", whole_load(
            lambda src=src, dst=dst, signal=signal: kv.load_resident(src, dst, si, di, block_quota=2, signal=signal),
            priority=HIGHEST_PRIORITY), model)
        add(f"{layout} kv.copy all layers bq=2", whole_load(
            lambda src=src, dst=dst: kv.copy(src, dst, si, di, route="kernel")), model)
    # A resident load with host indices: auto takes the copy engine where a page of a layer is one run (layer-first,
    # page-unified of one head group), a batch per layer, each layer's count written after its copies.
    for layout in ("layer-first", "page-unified", "page-first"):
        src, dst, model = one_launch[layout]
        signal = kv.LayerSignal(L)
        add(f"{layout} resident load auto (host indices)", whole_load(
            lambda src=src, dst=dst, signal=signal: kv.load_resident(src, dst, si_cpu, di_cpu, signal=signal,
                                                                           route="auto")), model)
    # The loader's footprint: 8-warp blocks, and one-warp blocks of the narrow build on every SM (as the register
    # kernel's "beside compute" rows), page-first.
    src, dst, _ = one_launch["page-first"]
    for label, bq, warps in (("bq=2 8 warps", 2, 8), ("one warp per SM", sms, 1)):
        signal = kv.LayerSignal(L)
        add(f"page-first resident loader {label}", whole_load(
            lambda bq=bq, warps=warps, signal=signal: kv.load_resident(src, dst, si, di, block_quota=bq,
                                                                       num_warps_per_block=warps, signal=signal)))
    if reference is not None:
        kernels(reference, "seed")
        copy_engines(reference, "seed")
    return out


def whole_load(load_all, priority=0):
    """A route that loads every layer in one call: ``load(layer)`` runs ``load_all()`` at layer 0 and nothing after,
    so the rows' event times and GB/s cover the whole load; ``load.whole`` tells ``host_us`` to time whole loads.
    ``load.priority``: the priority of the stream ``measure`` loads on (torch's: lower is higher)."""
    def load(layer):
        if layer == 0:
            load.last = load_all()

    load.whole, load.last, load.priority = True, None, priority
    return load


class Compute:
    """The compute streams: ``prefill`` (32 GEMMs of 8192^3 bf16) and ``decode`` (256 decode-like layers)."""

    def __init__(self, torch):
        self.torch = torch
        t, dev, bf16 = torch, "cuda", torch.bfloat16
        self.a, self.b = (t.randn(8192, 8192, dtype=bf16, device=dev) for _ in range(2))
        self.c = t.empty(8192, 8192, dtype=bf16, device=dev)
        hid, inter = 4096, 14336
        self.x = t.randn(256, hid, dtype=bf16, device=dev)
        self.w = [t.randn(*s, dtype=bf16, device=dev) * 0.01
                  for s in ((hid, hid + 2048), (hid, hid), (hid, 2 * inter), (inter, hid))]
        self.hid, self.inter = hid, inter
        self.kinds = {"prefill": (self.prefill, 32), "decode": (self.decode, 256)}

    def prefill(self):
        self.torch.matmul(self.a, self.b, out=self.c)

    def decode(self):
        t, (wqkv, wo, wup, wdn), hid, inter = self.torch, self.w, self.hid, self.inter
        h = self.x
        h = h + (h @ wqkv)[:, :hid] @ wo
        h = h * t.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
        gu = h @ wup
        h + (t.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ wdn


def _events(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _loads(torch, load, stream, layers):
    start, end = _events(torch)
    with torch.cuda.stream(stream):
        start.record()
        for layer in range(layers):
            load(layer)
        end.record()
    return start, end


def _compute(torch, fn, n, stream):
    start, end = _events(torch)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(n):
            fn()
        end.record()
    return start, end


def measure(torch, compute, load, nbytes, layers, lanes=None, rounds=3):
    """One route's figures (see the module docstring)."""
    load_stream = (torch.cuda.Stream(priority=getattr(load, "priority", 0)) if lanes is None
                   else torch.cuda.ExternalStream(lanes.transfer.handle))
    work_stream = torch.cuda.Stream() if lanes is None else torch.cuda.ExternalStream(lanes.compute.handle)
    alone_stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    _loads(torch, load, load_stream, 2)  # warm-up: plans, kernels
    torch.cuda.synchronize()
    idle = []
    for _ in range(3):
        s, e = _loads(torch, load, load_stream, layers)
        torch.cuda.synchronize()
        idle.append(s.elapsed_time(e))
    row = {"idle_gbps": nbytes * layers / statistics.median(idle) / 1e6}
    for kind, (fn, n) in compute.kinds.items():
        ratios, walls, gbps, alone_ms = [], [], [], []
        for _ in range(rounds):
            s, e = _compute(torch, fn, n, alone_stream)
            torch.cuda.synchronize()
            alone = s.elapsed_time(e)
            cs, ce = _compute(torch, fn, n, work_stream)
            ls, le = _loads(torch, load, load_stream, layers)
            torch.cuda.synchronize()
            ratios.append(cs.elapsed_time(ce) / alone)
            walls.append(max(cs.elapsed_time(ce), cs.elapsed_time(le)) / alone)
            gbps.append(nbytes * layers / ls.elapsed_time(le) / 1e6)
            alone_ms.append(alone)
        row.update({f"{kind}_gbps": statistics.median(gbps), f"{kind}_x": statistics.median(ratios),
                    f"{kind}_wall_x": statistics.median(walls), f"{kind}_compute_ms": statistics.median(alone_ms)})
    return row


def host_us(torch, load, stream, calls=20, groups=5):
    """Host microseconds per load call, ``calls`` back to back on ``stream``, median of ``groups``; for a
    route that loads every layer in one call (``whole_load``), per such call."""
    times, whole = [], getattr(load, "whole", False)
    with torch.cuda.stream(stream):
        for _ in range(groups):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for layer in range(calls):
                load(0 if whole else layer % LAYERS)
            times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def crossover(torch, compute, b):
    """One 32-layer load as runs of 2 KiB to 256 KiB, through kv.copy by each route, idle and under GEMMs."""
    rows = []
    lf_k, lf_v = b.host_as("lf")
    gk, gv = b.gpu_layers()
    views = (kv.LayerFirst(lf_k, lf_v), kv.LayerFirst(gk, gv))
    item = ITEM["mha"]
    prefill = {"prefill": compute.kinds["prefill"]}
    for run_tokens in (1, 2, 4, 8, 16, 32, 64, 128):
        rng = np.random.default_rng(run_tokens)
        pages = b.tokens // run_tokens

        def runs():
            starts = rng.choice(b.pool // run_tokens, pages, replace=False) * run_tokens
            return (starts[:, None] + np.arange(run_tokens)).reshape(-1).astype(np.int64)

        si, di = torch.from_numpy(runs()), torch.from_numpy(runs())
        si_gpu, di_gpu = si.cuda(), di.cuda()
        for route, (s, d) in (("copy_engine", (si, di)), ("kernel", (si_gpu, di_gpu))):
            def load(layer, route=route, s=s, d=d):
                kv.copy(*views, s, d, layer, route=route)

            saved, compute.kinds = compute.kinds, prefill
            try:
                row = measure(torch, compute, load, b.bytes_per_load(), LAYERS, rounds=1)
            finally:
                compute.kinds = saved
            rows.append({"case": f"crossover {run_tokens * item // 1024} KiB runs {route}", "route": route,
                         "run_bytes": run_tokens * item, **row})
    return rows


def waits(torch, compute, b, block_quota=2, rounds=3):
    """The model's side of a resident load: the compute split into 32 layers, layer ``l`` waiting on the GPU for
    the load's layer ``l`` (``ResidentLoad.wait``, a ``cuStreamWaitValue32``), the load queued first.

    ``*_gbps``: the load's bytes over the time from its issue to its last layer landing, both seen on a third,
    idle stream (an event just before the load is issued; one after a wait for the last layer), so neither the
    compute's pace nor its waits enter it. ``*_x``: the compute's time so (waits included) over its time alone, by
    events on its stream. ``*_load_ms``: that load time; ``*_load_stream_ms``: the same load by events around it on
    its own stream (a cross-check). ``wait_host_us``: host time of one ``wait`` call."""
    pf_k, pf_v = b.host_as("pf")
    gk, gv = b.gpu_layers()
    views = (kv.PageFirst(pf_k, pf_v), kv.LayerFirst(gk, gv))
    signal = kv.LayerSignal(LAYERS)
    load_stream, work_stream, probe = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    nbytes = b.bytes_per_load() * LAYERS

    def load():
        return kv.load_resident(*views, b.src_gpu, b.dst_gpu, block_quota=block_quota, signal=signal,
                                stream=load_stream)

    done = load()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        start = time.perf_counter()
        for layer in range(LAYERS):
            done.wait(layer, work_stream)
        host.append((time.perf_counter() - start) / LAYERS * 1e6)
    torch.cuda.synchronize()
    name = f"page-first resident loader bq={block_quota}, compute waits per layer"
    row = {"case": f"waits {name} {b.tokens}tok", "route": name, "impl": "kvnumba", "model": "mha",
           "tokens": b.tokens, "bytes": nbytes, "wait_host_us": statistics.median(host),
           "resident_build": done.moved_by}
    for kind, (fn, n) in compute.kinds.items():
        per_layer = max(1, n // LAYERS)

        def model(done=None):
            start, end = _events(torch)
            with torch.cuda.stream(work_stream):
                start.record()
                for layer in range(LAYERS):
                    if done is not None:
                        done.wait(layer, work_stream)
                    for _ in range(per_layer):
                        fn()
                end.record()
            return start, end

        ratios, walls, spans, stream_spans = [], [], [], []
        for _ in range(rounds):
            s, e = model()
            torch.cuda.synchronize()
            alone = s.elapsed_time(e)
            issued, landed = _events(torch)
            ls, le = _events(torch)
            issued.record(probe)  # the probe is idle: this is the load's issue
            ls.record(load_stream)
            done = load()
            le.record(load_stream)
            s, e = model(done)
            done.wait(LAYERS - 1, probe)  # after the model's work is queued: a wait cannot hold it up
            landed.record(probe)  # passes once the last layer has landed
            torch.cuda.synchronize()
            ratios.append(s.elapsed_time(e) / alone)
            walls.append(max(s.elapsed_time(e), issued.elapsed_time(landed)) / alone)
            spans.append(issued.elapsed_time(landed))
            stream_spans.append(ls.elapsed_time(le))
        span = statistics.median(spans)
        row.update({f"{kind}_gbps": nbytes / span / 1e6, f"{kind}_x": statistics.median(ratios),
                    f"{kind}_wall_x": statistics.median(walls), f"{kind}_load_ms": span,
                    f"{kind}_load_stream_ms": statistics.median(stream_spans)})
    return row


def held_sms(torch, compute, counts=(1, 2, 4, 8), rounds=3):
    """What SMs taken whole cost the compute, with no load at all: ``n`` blocks of a kernel that only waits (the
    layer wait's kernel, polling a word of mapped host memory), each asking for the most shared memory a block may
    have, so that each holds an SM alone and no compute block shares it. They are launched first, the compute is
    queued once they hold their SMs, and the word opens them once the compute has finished. ``*_x``: the compute's
    time beside them over its time alone (median of ``rounds``, alternating). A loader that takes ``n`` SMs whole
    costs the compute at least this; one that shares its SMs gets only what the compute leaves it."""
    from numba import cuda

    from kvnumba.driver.launch import BoundKernel, Kernel
    from kvnumba.kernels.jit import kernel
    from kvnumba.kernels.layer_wait import WAIT_SIGNATURE, _wait_layers
    from kvnumba.plan.tensor_maps import shared_limit

    device = torch.cuda.current_device()
    holder = Kernel(kernel(_wait_layers), WAIT_SIGNATURE, shared_limit(device))
    word = cuda.mapped_array(1, np.uint32)
    bound = BoundKernel(holder, device, (word.device_ctypes_pointer.value, 1))
    hold_stream, work_stream, alone_stream = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    for n in counts:
        name = f"compute beside {n} held SM{'s' if n > 1 else ''} (no load)"
        row = {"case": f"held {name}", "route": name, "impl": "kvnumba", "model": "mha", "held_sms": n}
        for kind, (fn, reps) in compute.kinds.items():
            ratios = []
            for _ in range(rounds):
                s, e = _compute(torch, fn, reps, alone_stream)
                torch.cuda.synchronize()
                alone = s.elapsed_time(e)
                word[0] = 0
                bound.launch(n, 32, hold_stream.cuda_stream, bound.blocks.address)
                time.sleep(0.01)  # the holders take their SMs before any compute is queued
                cs, ce = _compute(torch, fn, reps, work_stream)
                ce.synchronize()
                word[0] = 1
                torch.cuda.synchronize()
                ratios.append(cs.elapsed_time(ce) / alone)
            row[f"{kind}_x"] = statistics.median(ratios)
        yield row


def run(reference, tokens_list=(8192, 512), quick=False, words=()):
    """Every overlap row, one record at a time (see the module docstring); ``words``: only the routes whose
    name holds one of them, and no crossover rows."""
    if SIMULATOR or quick:
        yield from (r for r in _run_quick() if not words or any(w in r["route"] for w in words))
        return
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    compute = Compute(torch)
    for kind, (fn, n) in compute.kinds.items():  # warm the GPU to its working clock
        for _ in range(2):
            fn()
    records = []
    lanes = kv.SmLanes(LANE_SMS)
    side = torch.cuda.Stream()
    try:
        if not words or "held" in words:  # first: the bound the load rows are read against
            for row in held_sms(torch, compute):
                row.update(tokens=0, bytes=0)
                records.append(row)
                yield row
        for tokens in tokens_list:
            b = Buffers(torch, tokens)
            for name, (load, model, on_lanes, impl) in routes(b, sms, reference).items():
                if words and not any(w in name for w in words):
                    continue
                made = []
                with kernel_plan.watching(made.append):
                    row = measure(torch, compute, load, b.bytes_per_load(model), LAYERS, lanes if on_lanes else None)
                row.update(kernel_builds(made, tokens, load))
                row["host_us"] = host_us(torch, load, side if not on_lanes else
                                         torch.cuda.ExternalStream(lanes.transfer.handle))
                row.update(case=f"overlap {name} {tokens}tok", route=name, impl=impl, model=model, tokens=tokens,
                           bytes=b.bytes_per_load(model) * LAYERS)
                row.update(route_taken(name, load))
                records.append(row)
                yield row
            if not words or any(w in ("resident", "waits") for w in words):
                for bq in (1, 2):
                    row = waits(torch, compute, b, block_quota=bq)
                    records.append(row)
                    yield row
            if tokens == tokens_list[0] and not words:
                for row in crossover(torch, compute, b):
                    row.update(tokens=tokens, impl="kvnumba", model="mha")
                    records.append(row)
                    yield row
            del b
            torch.cuda.empty_cache()
    finally:
        torch.cuda.synchronize()
        lanes.close()


def kernel_builds(plans, items, load):
    """``staged_bound``: whether a kvnumba kernel plan a per-layer row made bound the staged kernel for calls of
    ``items`` items (blocks of two warps or more launch it; one-warp blocks the register kernel's narrow build);
    nothing where the row made no kernel plan (a copy-engine route, the seed's kernels, views another row planned
    first) or loads every layer in one call (``resident_build`` says what moved a resident load)."""
    made = [p for p in plans if isinstance(p, kernel_plan.KernelPlan)]
    if not made or getattr(load, "whole", False):
        return {}
    return {"staged_bound": any(p.source_maps is not None and items >= p.staged_from for p in made)}


def _run_quick():
    """Every route once, idle, on tiny buffers: a check that each runs (the simulator has no compute to overlap;
    on a GPU, ``--quick`` the same), its times meaning nothing. NumPy buffers on the simulator, torch on a GPU."""
    torch = None
    if not SIMULATOR:
        import torch
    b = Buffers(torch, 8, layers=2, page=4)
    for name, (load, model, _, impl) in routes(b, 1, None).items():
        start = time.perf_counter()
        made = []
        with kernel_plan.watching(made.append):
            for layer in range(b.layers):
                load(layer)
        if torch is not None:
            torch.cuda.synchronize()
        yield {"case": f"overlap {name} {b.tokens}tok", "route": name, "impl": impl, "model": model, "tokens": b.tokens,
               "bytes": b.bytes_per_load(model) * b.layers, "idle_seconds": time.perf_counter() - start,
               **route_taken(name, load), **kernel_builds(made, b.tokens, load)}


def route_taken(name, load):
    """What a row's last load says of its route: ``auto_took`` for ``kv.copy auto`` and ``resident load auto`` rows,
    ``resident_build`` (``staged``, ``register`` or ``copy_engine``) for resident loads."""
    facts = {}
    if "kv.copy auto" in name:
        facts["auto_took"] = kv.last_route()
    last = getattr(load, "last", None)
    if isinstance(last, kv.ResidentLoad):
        facts["resident_build"] = last.moved_by
        if "resident load auto" in name:
            facts["auto_took"] = last.route
    return facts
