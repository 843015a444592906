"""``kv.copy``'s two routes: a kernel, or the GPU's copy engines.

A kernel moves tokens with the SMs: any indices, any layouts, indices read on the GPU; but while a model
computes, the SMs are the model's. The copy engines need no SM and keep their speed under compute, but each
copy has a fixed cost, so they pay only for long *runs*: tokens whose bytes follow each other in both the
source and the destination (a page of a layer-first or page-first-direct pool, a vLLM block).

``route="copy_engine"`` reads the call's indices on the host (GPU indices are copied there first), and one pass
compiled for the pair of layouts (``plan.direct_fill.engine_pass``) checks them, computes both sides' offsets, finds
the runs and writes one copy per run per layer, K/V and head, submitted as one batch
(``kvnumba.driver.batch_copy``). ``route="kernel"`` always launches the kernel. ``route="auto"`` takes the copy
engine when the indices are on the host, the batch call is available on the stream, the copies average at least
``COPY_ENGINE_MIN_BYTES`` and the engine's call costs the host no more than the kernel's whole load (``HOST_COST``);
the kernel otherwise. Only kvnumba's own layouts are evaluated on the host (a layout of your own goes by kernel).
"""
from typing import Any, NamedTuple

import numpy as np

from ..arrays import HOST
from ..driver.batch_copy import PreparedBatch, batch_copy_available
from ..driver.target import SIMULATOR
from . import direct_fill
from .sides import Side

ROUTES = ("auto", "kernel", "copy_engine")
# Auto takes the copy engine for copies of at least this many bytes on average: shorter copies lose to the kernel
# (the engine pays a fixed cost per copy), longer ones keep their speed beside GEMMs where the kernels lose theirs.
# The measurement is in scripts/RESULTS.md ("Loads under compute"); CROSSOVER, which `kvnumba info` prints, sums it.
COPY_ENGINE_MIN_BYTES = 64 * 1024
CROSSOVER = ("measured on an NVIDIA H200, PCIe Gen5, CUDA 13.0, 2026-12-01: runs of 32 KiB moved 30.5 GB/s idle "
             "against the kernel's 46.0, runs of 64 KiB 48.7 against 45.4, and 47.8 against 21.9 under GEMMs")


def engine_available(handle: int) -> bool:
    """Whether ``auto`` may take the copy engine on stream ``handle``: the batch call is used there (not on
    the legacy default stream). On the simulator, whose copies stand in for the engines, always."""
    return SIMULATOR or batch_copy_available(handle)


class RouteLog:
    """Which route the last non-empty ``kv.copy`` took (``"kernel"`` or ``"copy_engine"``), and counts."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.counts = {"kernel": 0, "copy_engine": 0}

    def record(self, route: str) -> None:
        self.last = route
        self.counts[route] += 1


log = RouteLog()


def last_route() -> str | None:
    """The route the last non-empty ``kv.copy`` took: ``"kernel"`` or ``"copy_engine"`` (None before any)."""
    return log.last


def check_route(route: Any) -> str:
    if type(route) is str and route in ROUTES:
        return route
    if not isinstance(route, str):
        raise TypeError(f"route must be one of {', '.join(map(repr, ROUTES))}, got {type(route).__name__}")
    raise ValueError(f"route must be one of {', '.join(map(repr, ROUTES))}, got {route!r}")


def engine_pays(found: "EngineFill", cost: "HostCost | None" = None) -> bool:
    """``auto``'s choice for a call of host indices whose copies are ``found`` (module docstring)."""
    if found.runs == 0 or found.nbytes / found.copies < COPY_ENGINE_MIN_BYTES:
        return False
    return (cost or HOST_COST).engine_pays(found.copies, found.nbytes)


class HostCost(NamedTuple):
    """What ``auto`` weighs besides the copies' size: host microseconds of a copy-engine call against the
    kernel's whole load (a kernel given host indices stages them on the GPU and waits for the load, so its
    call takes the load's time). ``engine_us(copies) = engine_fixed_us + engine_per_copy_us * copies``,
    ``kernel_us(bytes) = kernel_fixed_us + bytes / kernel_bytes_per_us``."""

    engine_fixed_us: float
    engine_per_copy_us: float
    kernel_fixed_us: float
    kernel_bytes_per_us: float

    def engine_pays(self, copies: int, nbytes: int) -> bool:
        return (self.engine_fixed_us + self.engine_per_copy_us * copies
                <= self.kernel_fixed_us + nbytes / self.kernel_bytes_per_us)


# The line scripts/route_costs.py prints on a GPU (least-squares fits of both routes' host time; the kernel's fixed
# part is large because host indices go to the GPU first, synchronously).
HOST_COST = HostCost(engine_fixed_us=42.7, engine_per_copy_us=0.577, kernel_fixed_us=392.9, kernel_bytes_per_us=49500.0)


class EngineFill(NamedTuple):
    """A call's copies, written into ``EnginePlan.batch.out[:, :copies]`` by ``EnginePlan.fill``."""

    copies: int
    runs: int
    nbytes: int


class EnginePlan:
    """A copy's copy-engine form: the two sides' host arithmetic (``plan.sides.Side``), item bytes and heads,
    and the batch arrays its calls fill (``kvnumba.driver.batch_copy.PreparedBatch``)."""

    def __init__(self, src: Side, dst: Side, item_size: int, heads: int) -> None:
        self.src, self.dst, self.item_size, self.heads = src, dst, item_size, heads
        self.chunk = item_size // heads  # bytes one token moves per layer, K/V and head
        # Per side, each (kind, layer)'s layer part and its head stride, computed once.
        self.bases = [side.layer_parts(np.arange(side.layers), item_size, heads) for side in (src, dst)]
        self.strides = [side.head_stride(item_size, heads) for side in (src, dst)]
        self.src_device, self.dst_device = (None if side.device == HOST else side.device for side in (src, dst))
        self.batch = PreparedBatch(self.src_device, self.dst_device)
        self._parts: dict[tuple[int, int], np.ndarray] = {}
        # The compiled pass for this pair of layouts (kvnumba's own: a layout of your own goes by kernel).
        self.one_pass = direct_fill.engine_pass(src.parts.py[1], dst.parts.py[1])
        self._shapes = [np.array([side.layout_dim, side.page_size], np.int64) for side in (src, dst)]
        # Whether auto may take it: chunks shorter than COPY_ENGINE_MIN_BYTES that no two tokens can join into a
        # run (a layer-first side of several heads, say) never pay, so auto goes by kernel without a pass.
        self.may_pay = self.chunk >= COPY_ENGINE_MIN_BYTES or all(
            side.can_step(self.chunk, item_size, heads) for side in (src, dst))

    def parts(self, first_layer: int, window: int) -> np.ndarray:
        """``(2, kinds * window * heads)``: what each copy of a run adds to the run's token offset, source then
        destination, in (K/V, layer, head) order (once per layer window)."""
        found = self._parts.get((first_layer, window))
        if found is None:
            layers, heads = slice(first_layer, first_layer + window), np.arange(self.heads, dtype=np.int64)
            found = np.ascontiguousarray(np.stack([
                (self.bases[side][:, layers][:, :, None] + heads * self.strides[side]).reshape(-1)
                for side in (0, 1)]))
            self._parts[(first_layer, window)] = found
        return found

    def offsets(self, s_idx: np.ndarray, d_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The indices' token offsets in the source and the destination (what ``fill`` takes)."""
        return (self.src.token_offsets(s_idx, self.item_size, self.heads),
                self.dst.token_offsets(d_idx, self.item_size, self.heads))

    def fill(self, s_off: np.ndarray, d_off: np.ndarray, first_layer: int, window: int) -> EngineFill:
        """Write the copies of a call whose token offsets are ``s_off``, ``d_off`` (``offsets``) into ``batch.out``
        (the caller holds ``batch.lock`` until it submits them): one per run, K/V, layer of the window and head,
        runs inner. A resident load by copy engine fills layer after layer from one reading of the offsets."""
        parts = self.parts(first_layer, window)
        out = self.batch.reserve(len(s_off) * parts.shape[1])
        count = direct_fill.fill_engine(s_off, d_off, self.chunk, parts, out)
        return EngineFill(count, count // parts.shape[1], len(s_off) * self.chunk * parts.shape[1])

    def scan(self, s_idx: np.ndarray, d_idx: np.ndarray, limits: tuple[int, int], first_layer: int,
             window: int) -> EngineFill | None:
        """``offsets`` and ``fill`` in one compiled pass that first checks each index against its side's exclusive
        limit in ``limits``: the copies written (the caller holds ``batch.lock``), or None for an index outside
        (nothing written; the caller raises the usual error). Host int64 indices, contiguous."""
        parts = self.parts(first_layer, window)
        out = self.batch.reserve(len(s_idx) * parts.shape[1])
        count = self.one_pass(s_idx, d_idx, limits[0], limits[1], self._shapes[0], self._shapes[1], self.item_size,
                              self.heads, parts, out)
        if count == direct_fill.BAD:
            return None
        return EngineFill(count, count // parts.shape[1], len(s_idx) * self.chunk * parts.shape[1])
