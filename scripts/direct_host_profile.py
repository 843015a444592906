"""Host time of the copy-engine routes, stage by stage, with SGLang's call shapes.

    python scripts/direct_host_profile.py                          # the simulator (CPU) or a GPU
    python scripts/direct_host_profile.py --reference seedref.so   # a GPU: beside SGLang's calls
    python scripts/direct_host_profile.py --tokens 512 --cprofile  # one size, with a cProfile summary

For 64, 512 and 8192 tokens (item 2048 B, 32 layers, pages of 64, page-aligned random pages of a pool twice
that size) it calls, the way SGLang's HiCache "direct" backend does (a fresh ``pool[layer]`` view and new index
arrays on every call), with host indices and with device indices:

- ``per_layer_direct_pf_lf``: ``transfer_kv_per_layer_direct_pf_lf`` from page-first-direct host pools into
  one GPU layer;
- ``all_layer_direct_lf_pf``: ``transfer_kv_all_layer_direct_lf_pf`` from every GPU layer into the host pools;
- ``direct``: ``transfer_kv_direct`` of one layer, host -> GPU;
- ``copy ce lf`` / ``copy ce pfd``: ``kv.copy(route="copy_engine")`` of one layer from layer-first or
  page-first-direct host views.

Per case: host microseconds per call (back to back; wall time and the median group on a GPU; on the
simulator's shared CPU, the process's CPU time and the fastest group), then the same calls with each stage
timed by the same clock (exclusive: a stage's own time, its timed children taken out; ``other`` is
the rest). Timing a stage adds a fraction of a microsecond to it, so the stages add up to more than the clean
figure. ``--cprofile`` prints the functions with the most own time.

On the simulator the batch call is a stand-in that moves nothing (``StubBatch``): the figures are the
Python work around ``cudaMemcpyBatchAsync``, which is the same code on a GPU. On a GPU the copies are real
(``cudaMemcpyBatchAsync`` on a side stream); ``--reference`` adds the reference module's calls on the same
buffers and indices (host us, and GB/s counted until the stream is done).
"""
import argparse
import contextlib
import cProfile
import ctypes
import importlib
import io
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvnumba as kv  # noqa: E402
from kvnumba.driver import batch_copy  # noqa: E402
from kvnumba.driver.target import SIMULATOR  # noqa: E402

ITEM, LAYERS, PAGE, LAYER = 2048, 32, 64, 3
TOKENS = (64, 512, 8192)
# The clock: wall time on a GPU (a call's waits count there); this process's CPU time on the simulator, whose
# CPU is shared: time spent descheduled is not the call's.
CLOCK = time.process_time_ns if SIMULATOR else time.perf_counter_ns

# (label, module, attribute): what a stage is. An attribute that a checkout lacks is skipped, so the same
# script profiles a checkout before and after a change of its per-call path.
STAGES = (
    ("plan lookup", "kvnumba.api.transfer", "Transfer._plan_for_geometry"),
    ("plan lookup", "kvnumba.plan.cache", "PlanCache.find"),
    ("view checks", "kvnumba.layouts.base", "CacheView.check_unchanged"),
    ("describe indices", "kvnumba.checks.validate", "indices"),
    ("describe indices", "kvnumba.plan.per_call", "_index"),
    ("describe indices", "kvnumba.plan.direct_plan", "_index"),
    ("stream", "kvnumba.plan.direct_plan", "stream_handle"),
    ("stream", "kvnumba.plan.direct_plan", "refuse_in_capture"),
    ("stream", "kvnumba.plan.per_call", "stream_handle"),
    ("clearance", "kvnumba.plan.per_call", "_clear_of_destinations"),
    ("host copy of indices", "kvnumba.checks.bounds", "host_indices"),
    ("index checks", "kvnumba.checks.bounds", "check_indices"),
    ("runs", "kvnumba.plan.routes", "runs"),
    ("runs", "kvnumba.plan.routes", "EnginePlan.runs"),
    ("token offsets", "kvnumba.plan.sides", "Side.token_offsets"),
    ("addresses", "kvnumba.plan.routes", "EnginePlan.copies"),
    ("one pass (check, runs, addresses)", "kvnumba.plan.direct_fill", "fill_pages"),
    ("one pass (check, runs, addresses)", "kvnumba.plan.direct_fill", "fill_runs"),
    ("one pass (check, runs, addresses)", "kvnumba.plan.direct_fill", "fill_engine"),
    ("one pass (check, runs, addresses)", "kvnumba.plan.routes", "EnginePlan.scan"),
    ("compiled call: check, fill, submit", "kvnumba.plan.direct_fill", "submit_pages"),
    ("compiled call: check, fill, submit", "kvnumba.plan.direct_fill", "submit_runs"),
    ("submit", "kvnumba.driver.batch_copy", "PreparedBatch.native"),
    ("submit", "kvnumba.driver.batch_copy", "PreparedBatch.settle"),
    ("submit", "kvnumba.driver.batch_copy", "copy_many"),
    ("submit", "kvnumba.driver.batch_copy", "PreparedBatch.submit"),
    ("batch call", "kvnumba.driver.batch_copy", "CudartBatch.__call__"),
    ("batch call", "kvnumba.driver.batch_copy", "CudartBatch.call"),
    ("batch call", __name__, "StubBatch.__call__"),
    ("batch call", __name__, "StubBatch.call"),
)


class StubBatch:
    """The simulator's stand-in for libcudart's ``cudaMemcpyBatchAsync``: takes what ``CudartBatch`` takes,
    moves nothing, answers success (``kvnumba.driver.batch_copy`` falls back to a Python loop of memmoves on
    the simulator, which is no picture of a GPU's path)."""

    has_fail_index = False
    attrs_index = ctypes.c_size_t(0)

    def __init__(self):
        self.native = _stub_native_calls()  # the compiled submission's C functions, where this checkout has it
        self._attributes = ctypes.c_int(0)

    def attributes(self, src_device, dst_device):
        return self._attributes

    def __call__(self, dsts, srcs, sizes, src_device, dst_device, stream, addresses=None):
        return batch_copy.BatchResult(0, None)

    def call(self, *args):  # the raw form a prepared batch uses (kvnumba.plan.direct_fill), where it exists
        return batch_copy.BatchResult(0, None)


def _stub_native_calls():
    """``NativeCalls`` of three compiled C functions standing in for libcudart's and libcuda's (a batch that
    moves nothing, a stream that never captures, the one context current), or None before the compiled
    submission existed."""
    if not hasattr(batch_copy, "NativeCalls"):
        return None
    from numba import cfunc, types

    from kvnumba.driver.c_calls import int64_view

    word = types.int64

    @cfunc(types.int32(word, word, word, word, word, word, word, word))
    def batch(dsts, srcs, sizes, count, attrs, attrs_index, num_attrs, stream):
        return 0

    @cfunc(types.int32(word, word))
    def capturing(stream, status):
        int64_view(status, 1)[0] = 0
        return 0

    @cfunc(types.int32(word))
    def current_context(context):
        int64_view(context, 1)[0] = 1
        return 0

    _stub_native_calls.keep = (batch, capturing, current_context)  # their code lives as long as these do
    return batch_copy.NativeCalls(batch.address, capturing.address, current_context.address, lambda device: 1)


class StubRuntime:
    binding_major, driver_version, has_batch, route = 13, 13000, True, "cudart"

    def __init__(self):
        self.cudart = StubBatch()

    def memcpy(self, dst, src, nbytes, stream):  # pragma: no cover - the batch call never fails here
        raise AssertionError("the stand-in batch call never falls back")

    def device_of(self, ptr):
        return 0


class Timers:
    """Exclusive nanoseconds per stage label, from wrappers installed over ``STAGES``."""

    def __init__(self):
        self.totals, self.stack, self.saved = {}, [], []

    def install(self):
        for label, module_name, attribute in STAGES:
            *path, name = attribute.split(".")
            if module_name == __name__:  # this script's own stand-ins (it may be loaded under another name)
                owner = globals().get(path[0]) if path else None
                path = path[1:]
            else:
                try:
                    owner = importlib.import_module(module_name)
                except ImportError:
                    continue
            for part in path:
                owner = getattr(owner, part, None)
            if owner is None or name not in vars(owner):  # a stage this checkout lacks
                continue
            original = vars(owner)[name]
            self.saved.append((owner, name, original))
            setattr(owner, name, self._wrap(label, getattr(owner, name)))

    def remove(self):
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()

    def _wrap(self, label, function):
        totals, stack, clock = self.totals, self.stack, CLOCK

        def timed(*args, **kwargs):
            frame = [0]
            stack.append(frame)
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = clock() - start
                stack.pop()
                totals[label] = totals.get(label, 0) + elapsed - frame[0]
                if stack:
                    stack[-1][0] += elapsed

        return timed


class Setup:
    """Pools for ``tokens`` tokens (a pool of twice as many), index pairs and the calls of every case."""

    def __init__(self, tokens, torch=None, distinct=16):
        self.tokens, self.torch = tokens, torch
        pool = max(2 * tokens, 4 * PAGE)
        self.pool = pool
        if torch is None:  # NumPy on the simulator: zeros are mapped lazily, and nothing is copied
            host = [np.zeros(pool * LAYERS * ITEM, np.uint8) for _ in range(2)]
            gpu = [np.zeros(pool * LAYERS * ITEM, np.uint8) for _ in range(2)]
        else:
            host = [torch.zeros(pool * LAYERS * ITEM, dtype=torch.uint8).pin_memory() for _ in range(2)]
            gpu = [torch.zeros(pool * LAYERS * ITEM, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.host_pfd = [h.reshape(pool // PAGE, LAYERS, PAGE, ITEM) for h in host]
        self.host_lf = [h.reshape(LAYERS, pool, ITEM) for h in host]
        self.gpu_lf = [g.reshape(LAYERS, pool, ITEM) for g in gpu]
        self.gpu_layers = [self.gpu_lf[0][i] for i in range(LAYERS)] + [self.gpu_lf[1][i] for i in range(LAYERS)]
        rng = np.random.default_rng(tokens)
        self.pairs = {"host": [], "device": []}
        for _ in range(distinct):  # distinct index objects, cycled: a new pair on every call
            s, d = (self._pages(rng) for _ in range(2))
            if torch is None:
                from numba import cuda

                self.pairs["host"].append((s, d))
                self.pairs["device"].append((cuda.to_device(s), cuda.to_device(d)))
            else:
                ts, td = torch.from_numpy(s), torch.from_numpy(d)
                self.pairs["host"].append((ts.pin_memory(), td.pin_memory()))
                self.pairs["device"].append((ts.cuda(), td.cuda()))
        self.views = {"lf": kv.LayerFirst(*self.host_lf), "pfd": kv.PageFirstDirect(*self.host_pfd, page_size=PAGE),
                      "gpu": kv.LayerFirst(*self.gpu_lf)}

    def _pages(self, rng):
        pages = rng.choice(self.pool // PAGE, self.tokens // PAGE, replace=False)
        return (pages[:, None] * PAGE + np.arange(PAGE)).reshape(-1).astype(np.int64)

    def bytes_per_call(self, case):
        return self.tokens * ITEM * 2 * (LAYERS if case == "all_layer_direct_lf_pf" else 1)

    def call(self, module, case, stream):
        """A function ``f(i)`` making call ``i`` of ``case`` through ``module`` (kvnumba or the reference) with
        SGLang's shapes: fresh ``pool[layer]`` views, the ``i``-th index pair."""
        hk, hv = self.host_pfd
        lk, lv = self.host_lf
        gk, gv = self.gpu_lf
        layers, kw = self.gpu_layers, ({} if module is not kv else {"stream": stream})
        if case == "per_layer_direct_pf_lf":
            fn = module.transfer_kv_per_layer_direct_pf_lf
            return lambda s, d: fn([hk, hv], [gk[LAYER], gv[LAYER]], s, d, LAYER, PAGE, **kw)
        if case == "all_layer_direct_lf_pf":
            fn = module.transfer_kv_all_layer_direct_lf_pf
            return lambda s, d: fn(layers, [hk, hv], s, d, PAGE, **kw)
        if case == "direct":
            fn = module.transfer_kv_direct
            return lambda s, d: fn([lk[LAYER], lv[LAYER]], [gk[LAYER], gv[LAYER]], s, d, PAGE, **kw)
        route, view = case.split()[-2:] if case.startswith("copy") else (None, None)
        src, dst = self.views[view], self.views["gpu"]
        route = {"ce": "copy_engine", "auto": "auto"}[route]
        return lambda s, d: kv.copy(src, dst, s, d, LAYER, route=route, **kw)


CASES = ("per_layer_direct_pf_lf", "all_layer_direct_lf_pf", "direct", "copy ce lf", "copy ce pfd", "copy auto lf",
         "copy auto pfd")


def run_calls(call, pairs, calls, groups, sync):
    """Host us per call: ``groups`` groups of ``calls`` calls back to back, each call with the next index pair,
    ``sync()`` between groups (the GPU); the median group on a GPU, the fastest on the simulator (a CPU shared
    with other work: the fastest group is the one least disturbed). Also the wall us per call until ``sync()``
    returns."""
    host, wall = [], []
    n = len(pairs)
    for g in range(groups + 1):
        sync()
        start = CLOCK()
        for i in range(calls):
            s, d = pairs[(g * calls + i) % n]
            call(s, d)
        mid = CLOCK()
        sync()
        end = CLOCK()
        if g:  # the first group warms up
            host.append((mid - start) / calls / 1e3)
            wall.append((end - start) / calls / 1e3)
    pick = min if SIMULATOR else statistics.median
    return pick(host), pick(wall)


def counts(tokens):
    """(calls, groups) for a size: about the same time per case."""
    return {64: (200, 7), 512: (100, 7), 8192: (10, 5)}.get(tokens, (20, 5))


def profile_case(setup, case, where, stream, sync, reference, cprofile, rows):
    call = setup.call(kv, case, stream)
    pairs = setup.pairs[where]
    calls, groups = counts(setup.tokens)
    if case == "all_layer_direct_lf_pf":
        calls = max(calls // 10, 2)
    host_us, wall_us = run_calls(call, pairs, calls, groups, sync)
    nbytes = setup.bytes_per_call(case)
    row = {"case": case, "indices": where, "tokens": setup.tokens, "host_us": host_us,
           "gbps": None if SIMULATOR else nbytes / wall_us / 1e3}
    timers = Timers()
    timers.install()
    measured = []  # (us per call, {stage: us per call}) per group
    try:
        run_calls(call, pairs, calls, 1, sync)  # warm up the wrappers
        for g in range(groups):
            timers.totals.clear()
            sync()
            start = CLOCK()
            for i in range(calls):
                s, d = pairs[(g * calls + i) % len(pairs)]
                call(s, d)
            total = (CLOCK() - start) / calls / 1e3
            measured.append((total, {label: ns / calls / 1e3 for label, ns in timers.totals.items()}))
        sync()
    finally:
        timers.remove()
    measured.sort(key=lambda m: m[0])
    total, stages = measured[0] if SIMULATOR else measured[len(measured) // 2]  # as run_calls picks
    stages["other"] = total - sum(stages.values())
    row.update(timed_us=total, stages=stages)
    if reference is not None and not case.startswith("copy"):
        ref = setup.call(reference, case, stream)
        ref_host, ref_wall = run_calls(ref, pairs, calls, groups, sync)
        row.update(reference_host_us=ref_host, reference_gbps=nbytes / ref_wall / 1e3)
    rows.append(row)
    print(_row(row), flush=True)
    for label, us in sorted(stages.items(), key=lambda kv_: -kv_[1]):
        print(f"    {label:38} {us:9.2f}")
    if cprofile:
        profile = cProfile.Profile()
        profile.enable()
        for i in range(calls * groups):
            s, d = pairs[i % len(pairs)]
            call(s, d)
        profile.disable()
        sync()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(10)
        text = out.getvalue()
        print("\n".join("    " + line for line in text.splitlines()[text.splitlines().index("") + 1:]
                        if line.strip())[:4000])
    return row


def _row(r):
    ref = r.get("reference_host_us")
    gbps = "" if r["gbps"] is None else f" {r['gbps']:7.1f} GB/s"
    ref_text = "" if ref is None else f"   reference {ref:8.1f} us {r['reference_gbps']:7.1f} GB/s"
    return f"{r['case']:24} {r['indices']:7} {r['tokens']:5} tok  host {r['host_us']:8.1f} us{gbps}{ref_text}"


@contextlib.contextmanager
def harness():
    """``(torch, stream, sync)`` for the block: on a GPU torch, a side stream (current in the block) and
    ``torch.cuda.synchronize``; on the simulator None, a made-up handle and a no-op, with every copy-engine call
    submitting to the stand-in batch call and no stream capturing (both undone when the block ends)."""
    if not SIMULATOR:
        import torch

        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            yield torch, side, torch.cuda.synchronize
        return
    from kvnumba.driver import capture

    saved = batch_copy.runtime, capture.capturing
    stub = StubRuntime()
    batch_copy.runtime = lambda: stub  # every copy-engine call submits to the stand-in (one, as a GPU's runtime)
    capture.capturing = lambda handle: False  # a made-up side stream: the simulator captures none
    try:
        yield None, 0x5EED, lambda: None
    finally:
        batch_copy.runtime, capture.capturing = saved


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--cases", nargs="*", default=list(CASES), help=f"among {', '.join(CASES)}")
    parser.add_argument("--indices", nargs="*", default=["host", "device"], choices=["host", "device"])
    parser.add_argument("--reference", help="module name or path of a .so with SGLang's entry points (GPU only)")
    parser.add_argument("--cprofile", action="store_true", help="a cProfile summary per case (own time)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    reference = None
    with harness() as (torch, stream, sync):
        if torch is not None:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from bench import load_reference

            reference = load_reference(args.reference)
        print(f"{'CPU (simulator, stand-in batch call)' if SIMULATOR else torch.cuda.get_device_name()}; "
              f"kvnumba from {os.path.dirname(kv.__file__)}")
        rows = []
        for tokens in args.tokens:
            setup = Setup(tokens, torch)
            for case in args.cases:
                for where in args.indices:
                    profile_case(setup, case, where, stream, sync, reference, args.cprofile, rows)
            del setup
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"device": "simulator" if SIMULATOR else torch.cuda.get_device_name(), "rows": rows}, f,
                      indent=1)
    return rows


if __name__ == "__main__":
    main()
