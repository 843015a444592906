"""``kv.load_resident``: every layer of a load in one launch on a few SMs, each layer signalled as it lands, and
the handle another stream waits on (``ResidentLoad.wait``). HiCache's ``load_to_device_per_layer`` pattern
(its ``layer_done_counter``), with the waiting done by the GPU.

A load is ``kv.copy``'s: the same views, the same plan (``kvnumba.plan.build``, from ``kv.copy``'s plan cache),
the same checks and errors, nothing written on an error, and the same routes (``kvnumba.plan.routes``). Only the
launch differs: the resident loader (``kvnumba.kernels.resident``) instead of the register or staged kernel, or by
copy engine one batch per layer, each followed on the stream by the layer's count.
"""
from __future__ import annotations

from typing import Any, SupportsIndex

from ..arrays import is_torch
from ..checks.devices import call_stream
from ..layouts import CacheView
from ..checks import guard, validate
from ..driver import capture
from ..driver.devices import on_device
from ..plan import routes
from ..plan.layer_signal import LayerSignal
from ..plan.fp8_plan import Fp8Plan
from ..plan.kernel_plan import KernelPlan
from ..plan.per_call import by_copy_engine
from ..plan.resident_plan import checked_call, launch_resident
from ..types import ArrayLike, StreamLike
from .fp8_views import Fp8View
from .transfer import plain

__all__ = ["LayerSignal", "ResidentLoad", "load_resident"]


class ResidentLoad:
    """One resident load in flight: which layers it moves, on which stream, and where they are signalled. It
    keeps the load's signal (and index arrays copied from the host) alive until ``synchronize``."""

    def __init__(self, layers: range, signal: LayerSignal, handle: int, keep: Any = (), staged: bool = False,
                 route: str = "kernel", stream: Any = None) -> None:
        self.layers = layers  # the view layers the load copies, in the order they land
        self.signal = signal
        self.stream = handle  # the raw handle of the stream the load runs on
        self._stream = stream  # the stream object passed, kept alive: its handle may not be destroyed under us
        self.route = route  # "kernel" (the resident loader) or "copy_engine" (a batch per layer)
        self.staged = staged  # the loader's staged build ran (bulk copies through shared memory), not its register one
        self._keep = keep

    def wait(self, layer: SupportsIndex, stream: StreamLike | None = None) -> None:
        """Make ``stream`` (default: torch's current stream where torch is in use, else the default stream) wait
        until ``layer`` (a layer of the views, in ``self.layers``) has landed: a stream memory operation
        (``cuStreamWaitValue32``, after a wait for the load's start), enqueued without blocking the host, and
        capturable in a CUDA graph with the load (there a one-warp kernel that polls the count,
        ``kvnumba.plan.layer_signal``). On the simulator, where the load has finished already, it
        checks the count on the host.

        Raises
        ------
        TypeError, ValueError
            ``layer`` not an int of ``self.layers``; ``stream`` not a stream.
        """
        layer = validate.integer("layer", layer, minimum=self.layers.start, maximum=self.layers.stop - 1)
        self.signal.wait(capture.current_handle(stream), layer - self.layers.start + 1)

    def synchronize(self) -> None:
        """Wait on the host for the load's stream, then raise ``IndexOutOfRangeError`` if a kernel skipped items
        with out-of-range indices in GPU memory (as ``kv.check_errors``)."""
        with on_device(self.signal.device):
            guard.synchronize(self.stream)
        self._keep = ()
        guard.raise_pending()

    def landed(self) -> int:
        """How many of the load's layers have landed, read now (on a GPU a synchronous one-word copy)."""
        return self.signal.landed()

    @property
    def moved_by(self) -> str:
        """What moved the load: ``"staged"`` (the resident loader's staged build), ``"register"`` (its register
        build, and a quantised view's kernel) or ``"copy_engine"``."""
        return self.route if self.route != "kernel" else "staged" if self.staged else "register"

    def __repr__(self) -> str:
        return f"<ResidentLoad layers={self.layers} stream={self.stream:#x} {self.moved_by}>"


def load_resident(src_view: CacheView, dst_view: CacheView, src_indices: ArrayLike, dst_indices: ArrayLike,
                  layers: SupportsIndex | range | None = None, *, block_quota: SupportsIndex = 2,
                  num_warps_per_block: SupportsIndex = 32, signal: LayerSignal | None = None,
                  stream: StreamLike | None = None, check: bool = False, route: str = "kernel") -> ResidentLoad:
    """Copy tokens between two cache views as ``kv.copy`` does, every layer in one launch of at most
    ``block_quota`` blocks that stay for the whole load, layer after layer; return a ``ResidentLoad`` whose
    ``wait(layer, stream)`` holds another stream until that layer has landed.

    Parameters
    ----------
    src_view, dst_view, src_indices, dst_indices, layers, num_warps_per_block, stream, check
        As for ``kv.copy`` (the kernel route). Any pair of views: page-first, page-head, layer-first,
        MLA, page-unified, vLLM's, a layout of your own; NVFP4 views (``kv.Nvfp4View``), dequantised (or
        quantised) in the same one launch by the loader's NVFP4 build; and FP8 views (``kv.Fp8View``), by
        ``kv.copy``'s FP8 kernels launched layer by layer, each launch followed by its layer's count.
    block_quota : int
        Keyword only: the blocks (SMs) the load holds from start to end; 2 by default. Page-first and page-head
        sources in pinned memory take the loader's staged build on sm_90 and newer (runs of tokens by the
        bulk-copy unit, as the staged kernel moves them: ``KVNUMBA_LOAD_PATH``), the others its register build;
        ``ResidentLoad.staged`` says which ran.
    signal : LayerSignal, optional
        Keyword only: where the layers are signalled, ``kv.LayerSignal(max_layers, device)``, reused load after
        load (one load at a time: start the next once the last one's waits have passed). Default: a new one
        per load (it allocates: pass one made beforehand under CUDA graph capture).
    route : str
        Keyword only: ``"kernel"`` (default: the resident loader, whose call returns at once), ``"copy_engine"``
        (one batch of copies per layer, in layer order, each layer's count written on the stream after its
        copies: no SM taken, and long runs keep the link's speed beside GEMMs, but the host submits every copy,
        and a large load holds the call for about the load's time) or ``"auto"``, as ``kv.copy``'s: the copy
        engine for indices in host memory whose runs are long (a layer-first pool's pages, SGLang's page-unified
        pool of one head group), the resident loader otherwise. ``ResidentLoad.route`` says which ran.

    Returns
    -------
    ResidentLoad
        ``.wait(layer, stream)``, ``.synchronize()``, ``.landed()``, ``.layers``.

    Raises
    ------
    TypeError, ValueError
        As ``kv.copy``, naming the argument; nothing is written. A ``signal`` too small for the layers or on
        another device; ``route="copy_engine"`` with an FP8 or NVFP4 view.
    CaptureError
        As ``kv.copy``, and for a load without ``signal`` while the stream is being captured.

    Examples
    --------
    >>> done = kv.load_resident(kv.PageFirst(host_k, host_v), kv.LayerFirst(gpu_k, gpu_v), idx, idx)  # doctest: +SKIP
    >>> for layer in range(num_layers):
    ...     done.wait(layer, model_stream)                                                            # doctest: +SKIP
    ...     attention(layer)                                                                          # doctest: +SKIP
    """
    if isinstance(src_view, (CacheView, Fp8View)):
        src_view.check_unchanged("src_view", layers)
    if isinstance(dst_view, (CacheView, Fp8View)):
        dst_view.check_unchanged("dst_view", layers)
    if not isinstance(check, bool):
        raise TypeError(f"check must be True or False, got {type(check).__name__}")
    strict = check or guard.ALWAYS_CHECK
    copies = plain("copy")
    plan = copies._plan_for_geometry((src_view, dst_view, layers), strict, stream)
    route = routes.check_route(route)
    if not isinstance(plan, (KernelPlan, Fp8Plan)):  # kv.copy's plans are kernel or codec plans
        raise TypeError(f"kv.load_resident cannot load through a {type(plan).__name__}")
    layers = range(plan.first_layer, plan.first_layer + plan.window)  # the view layers the load copies
    if isinstance(plan, Fp8Plan) and route == "copy_engine":  # FP8 and NVFP4 plans: the codec works in the kernel
        raise ValueError("route='copy_engine' cannot quantise or dequantise: load FP8 and NVFP4 views with "
                         "route='kernel' (or 'auto')")
    if isinstance(plan, Fp8Plan) and plan.resident_build is None:  # FP8: its per-layer kernels, layer by layer
        layer_plans = [copies._plan_for_geometry((src_view, dst_view, layer), strict, stream) for layer in layers]
        return _codec_load(plan, layers, layer_plans, src_indices, dst_indices, block_quota, num_warps_per_block,
                           signal, stream, check or guard.ALWAYS_CHECK)
    call = checked_call(plan, src_indices, dst_indices, block_quota, num_warps_per_block, stream, check)
    signal = _signal_for(plan, signal, call.handle)
    if route != "kernel" and call.items and by_copy_engine(plan, route, call, src_indices, dst_indices, signal):
        load = ResidentLoad(layers, signal, call.handle, route="copy_engine", stream=stream)
    else:
        keep, staged = launch_resident(plan, call, signal)
        load = ResidentLoad(layers, signal, call.handle, keep, staged, stream=stream)
    if call.check:
        load.synchronize()
    return load


def _codec_load(plan: Any, layers: range, layer_plans: list, src_indices: ArrayLike, dst_indices: ArrayLike,
                block_quota: Any, warps: Any, signal: LayerSignal | None, stream: StreamLike | None,
                check: bool) -> ResidentLoad:
    """A resident load with an FP8 view on a side: ``kv.copy``'s FP8 kernels (the staged or pipelined dequantising
    load where it applies), one launch a layer on the stream, each followed by the layer's count.
    Layer 0's call checks the indices before anything is written; with host indices each launch waits for its
    index copies (GPU indices keep the host free)."""
    handle = call_stream(stream, plan.device, plan.uses_torch or is_torch(src_indices) or is_torch(dst_indices))
    signal = _signal_for(plan, signal, handle)
    signal.reset(handle)
    for landed, layer_plan in enumerate(layer_plans, 1):
        layer_plan.fast(src_indices, dst_indices, None, block_quota, warps, stream=handle, route="kernel")
        signal.publish(handle, landed)
    load = ResidentLoad(layers, signal, handle, stream=stream)
    if check:
        load.synchronize()
    return load


def _signal_for(plan: Any, signal: LayerSignal | None, handle: int) -> LayerSignal:
    """The load's signal: ``signal`` checked against the plan, or a new one (refused under capture)."""
    if signal is None:
        capture.refuse(handle, "load_resident without signal= (it allocates one)",
                       "make a kv.LayerSignal before the capture and pass it as signal=")
        return LayerSignal(plan.window, plan.device)
    if not isinstance(signal, LayerSignal):
        raise TypeError(f"signal must be a kv.LayerSignal, got {type(signal).__name__}")
    if signal.max_layers < plan.window:
        raise ValueError(f"signal holds loads of at most {signal.max_layers} layers, but this load copies "
                         f"{plan.window}; make it with kv.LayerSignal({plan.window}, device={plan.device})")
    if signal.device != plan.device:
        raise ValueError(f"signal is on cuda:{signal.device} but the views are on cuda:{plan.device}")
    return signal
