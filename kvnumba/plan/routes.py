"""``kv.copy``'s two routes: a kernel, or the GPU's copy engines.

A kernel moves tokens with the SMs: any indices, any layouts, indices read on the GPU, but it needs SMs,
and while a model computes the SMs are the model's (a GEMM holds every SM's registers and shared memory;
a transfer block runs in the gaps between GEMMs). The copy engines need no SM and keep their speed under
compute, but each copy has a fixed cost (~0.6 us of host time to submit, about as much on the engine), so
they pay only for long *runs*: tokens whose bytes follow each other in both the source and the destination,
e.g. a page of a layer-first or page-first-direct pool, or a vLLM block.

``route="copy_engine"`` finds the runs of the call's indices on the host (NumPy, vectorised), and submits
one copy per run per layer, K/V and head as one ``cudaMemcpyBatchAsync`` (``kvnumba.driver.batch_copy``;
page by page where the batch call is unavailable). Indices in GPU memory are brought to the host first
(a synchronous copy, as SGLang's copy-engine entry points do). ``route="kernel"`` always launches the
kernel. ``route="auto"`` (the default) takes the copy engine when the indices are on the host, the batch
call is available on the stream (not the legacy default stream) and the copies average at least
``COPY_ENGINE_MIN_BYTES``; the kernel otherwise (indices on the GPU never cost a synchronisation).

Only kvnumba's own layouts have their address arithmetic evaluated on the host (a layout of your own
goes by kernel). A subclass of one of kvnumba's views takes either route: the copy engine's addresses are
the same arithmetic the kernel runs, over the same checked offsets and geometry (``checks.extents``).
``last_route()`` says which route the last ``kv.copy`` took.
"""
from typing import Any, NamedTuple

import numpy as np

from ..arrays import HOST
from ..driver.batch_copy import batch_copy_available
from ..driver.target import SIMULATOR
from .sides import Side

ROUTES = ("auto", "kernel", "copy_engine")
# Auto takes the copy engine for copies of at least this many bytes on average. Measured on the H200
# (scripts/RESULTS.md, "Loads under compute"): runs of 128 KiB moved 54.5 GB/s idle and 54.2 under
# back-to-back GEMMs (the staged kernel: 50 and 21); runs of 8 KiB moved 8.6 GB/s (fixed cost per copy).
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
    """``route`` validated: one of ``ROUTES``, else ``ValueError`` (``TypeError`` for a non-string)."""
    if type(route) is str and route in ROUTES:
        return route
    if not isinstance(route, str):
        raise TypeError(f"route must be one of {', '.join(map(repr, ROUTES))}, got {type(route).__name__}")
    raise ValueError(f"route must be one of {', '.join(map(repr, ROUTES))}, got {route!r}")


def runs(a: np.ndarray, b: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the runs of two equal-length int64 arrays: an element continues a run where
    both ``a`` and ``b`` advance by exactly ``step`` from its predecessor (slices rather than ``np.diff``: a few
    microseconds less a call, which is the whole cost of a small load)."""
    breaks = np.flatnonzero((a[1:] != a[:-1] + step) | (b[1:] != b[:-1] + step))
    starts = np.empty(len(breaks) + 1, np.int64)
    starts[0] = 0
    np.add(breaks, 1, out=starts[1:])
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = len(a) - starts[-1]
    return starts, lengths


class Runs(NamedTuple):
    """A call's runs (``EnginePlan.runs``): where each starts among the items, how long it is, and every
    item's token offset on each side."""

    starts: np.ndarray
    lengths: np.ndarray
    src_offsets: np.ndarray
    dst_offsets: np.ndarray


class EngineCopies(NamedTuple):
    dsts: np.ndarray
    srcs: np.ndarray
    sizes: np.ndarray
    total: int  # bytes


class EnginePlan:
    """A copy's copy-engine form: the two sides' host arithmetic (``plan.sides.Side``), item bytes and heads."""

    def __init__(self, src: Side, dst: Side, item_size: int, heads: int) -> None:
        self.src, self.dst, self.item_size, self.heads = src, dst, item_size, heads
        self.chunk = item_size // heads  # bytes one token moves per layer, K/V and head
        # Per side, each (kind, layer)'s layer part and its head stride, computed once.
        self.bases = [side.layer_parts(np.arange(side.layers), item_size, heads) for side in (src, dst)]
        self.strides = [side.head_stride(item_size, heads) for side in (src, dst)]
        self.src_device, self.dst_device = (None if side.device == HOST else side.device for side in (src, dst))

    def runs(self, s_idx: np.ndarray, d_idx: np.ndarray) -> Runs:
        """The runs in the indices: an item continues a run where both its source and destination bytes
        follow its predecessor's."""
        s_off = self.src.token_offsets(s_idx, self.item_size, self.heads)
        d_off = self.dst.token_offsets(d_idx, self.item_size, self.heads)
        return Runs(*runs(s_off, d_off, self.chunk), s_off, d_off)

    def mean_copy(self, found: Runs) -> float:
        """Bytes per copy the call would make with these runs (what ``auto`` decides by)."""
        return len(found.src_offsets) * self.chunk / len(found.starts)

    def copies(self, found: Runs, first_layer: int, window: int) -> EngineCopies:
        """One copy per run, per K/V, layer of ``[first_layer, first_layer + window)`` and head."""
        starts, lengths = found.starts, found.lengths
        heads = np.arange(self.heads, dtype=np.int64)
        layers = slice(first_layer, first_layer + window)

        def addresses(side: int, offsets: np.ndarray) -> np.ndarray:
            base = self.bases[side][:, layers][:, :, None, None] + (heads * self.strides[side])[None, None, :, None]
            return (base + offsets[starts][None, None, None, :]).reshape(-1)

        srcs, dsts = addresses(0, found.src_offsets), addresses(1, found.dst_offsets)
        sizes = np.broadcast_to(lengths * self.chunk, (len(srcs) // len(starts), len(starts))).reshape(-1)
        total = int(lengths.sum()) * self.chunk * (len(srcs) // len(starts))
        return EngineCopies(dsts, srcs, np.ascontiguousarray(sizes), total)
