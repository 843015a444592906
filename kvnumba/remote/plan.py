"""Which byte ranges a remote copy posts: NIXL descriptors planned from the two layouts.

Every item (one token's K or V of one layer; a head of it where a layout splits heads) is a pair of byte
ranges, one per side; pairs contiguous on both sides, in the same buffers, merge into one descriptor (the
**direct** route). The **staged** route moves the remote side's own runs into a staging view here laid out
like it (``kvnumba.remote.staging``), which ``kv.copy`` relayouts; ``route="auto"`` stages when that at
least halves the descriptors. ``plan_copy`` gives a copy's plan without NIXL or a transfer (for reports and
``scripts/remote_descriptors.py``; views over ``np.zeros`` arrays cost no memory).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..plan.copy_plan import check_fit, copy_window
from ..checks import bounds
from ..kernels import layouts
from ..layouts import CacheView
from . import staging
from .handles import RemoteView
from .sides import Side, of_view

ROUTES = ("auto", "direct", "staged")
STAGED_GAIN = 2  # auto stages only when that divides the descriptors by at least this


class Descriptors:
    """Merged descriptor pairs: ``local``/``remote`` addresses, ``length`` bytes, ``local_buffer`` /
    ``remote_buffer`` the index of the buffer (of each side's ``Side.buffers``) each lies in."""

    def __init__(self, local: np.ndarray, remote: np.ndarray, length: np.ndarray, local_buffer: np.ndarray,
                 remote_buffer: np.ndarray) -> None:
        self.local, self.remote, self.length = local, remote, length
        self.local_buffer, self.remote_buffer = local_buffer, remote_buffer

    def __len__(self) -> int:
        return int(self.length.size)

    @property
    def bytes(self) -> int:
        return int(self.length.sum())

    def rows(self, side: str, device: int) -> np.ndarray:
        """NIXL's Nx3 ``(address, length, device id)`` rows of one side (``"local"`` or ``"remote"``)."""
        address = self.local if side == "local" else self.remote
        return np.column_stack((address, self.length, np.full_like(address, device))).astype(np.uint64)


def check_pair(src: Side, dst: Side) -> int:
    """The views fit one copy (the rules of ``kv.copy``, ``kvnumba.plan.copy_plan.check_fit``); returns the copy's
    heads."""
    return check_fit(src, dst, ("src", "dst"))


def window(src: Side, dst: Side, layers: Any) -> np.ndarray:
    """The layer numbers a copy of ``layers`` moves, by ``kv.copy``'s rule (``copy_plan.copy_window``): None
    is every layer, which both sides must then have the same number of; an int, or a range with step 1,
    that both sides have."""
    first, count = copy_window(src, dst, layers, ("src", "dst"))
    return np.arange(first, first + count, dtype=np.int64)


def check_tokens(name: str, tokens: np.ndarray, side: Side, where: str) -> None:
    """Every token of ``tokens`` lies in the side's view (``IndexOutOfRangeError`` naming ``name``)."""
    bounds.check_indices(name, tokens, side.geometry.tokens, f"{where} ({side.origin.class_name}, "
                         f"{side.geometry.tokens} tokens)")


def merge(a: np.ndarray, b: np.ndarray, length: np.ndarray, a_buffer: np.ndarray, b_buffer: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of ranges ``[a, a + length)`` -> ``[b, b + length)``, sorted by ``a``, merged wherever the
    next pair continues both ranges in the same buffers."""
    if a.size == 0:
        return a, b, length, a_buffer, b_buffer
    order = np.lexsort((b, a))
    a, b, length, a_buffer, b_buffer = a[order], b[order], length[order], a_buffer[order], b_buffer[order]
    joins = ((a[1:] == a[:-1] + length[:-1]) & (b[1:] == b[:-1] + length[:-1])
             & (a_buffer[1:] == a_buffer[:-1]) & (b_buffer[1:] == b_buffer[:-1]))
    starts = np.concatenate(([0], np.flatnonzero(~joins) + 1))
    merged = np.add.reduceat(length, starts)
    return a[starts], b[starts], merged, a_buffer[starts], b_buffer[starts]


def pair_descriptors(local: Side, local_tokens: np.ndarray, remote: Side, remote_tokens: np.ndarray,
                     layers: np.ndarray, heads: int) -> Descriptors:
    """Every chunk of the copy as a pair of ranges, merged (the direct route's descriptors, or the
    staged route's between the staging buffer and the remote view)."""
    la, lb = local.items(local_tokens, layers, local.geometry.item_bytes, heads)
    ra, rb = remote.items(remote_tokens, layers, remote.geometry.item_bytes, heads)
    chunk = local.geometry.item_bytes // heads
    length = np.full(la.size, chunk, dtype=np.int64)
    r, loc, n, rbuf, lbuf = merge(ra.ravel(), la.ravel(), length, rb.ravel(), lb.ravel())
    return Descriptors(loc, r, n, lbuf, rbuf)


def remote_runs(remote: Side, remote_tokens: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """The byte lengths of the contiguous runs the remote side's items make (each distinct token
    once): the staged route's descriptors."""
    heads = layouts.head_runs(remote.parts, remote.geometry.heads)
    address, buffer = remote.items(np.unique(remote_tokens), layers, remote.geometry.item_bytes, heads)
    flat = address.ravel()
    length = np.full(flat.size, remote.geometry.item_bytes // heads, dtype=np.int64)
    return merge(flat, flat, length, buffer.ravel(), buffer.ravel())[2]


def staging_tokens(remote: Side, remote_tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """Where each remote token lands in a staging view holding only the touched pages, in page order:
    ``(staging tokens, pages)``."""
    page = remote.geometry.page_size
    pages = np.unique(remote_tokens // page)
    rank = np.searchsorted(pages, remote_tokens // page)
    return rank * page + remote_tokens % page, int(pages.size)


def choose(route: str, direct: int, staged: int | None) -> str:
    """The route to take given the descriptor counts (``staged`` None: no staging for that layout)."""
    if route == "direct" or staged is None:
        return "direct"
    if route == "staged":
        return "staged"
    return "staged" if staged * STAGED_GAIN <= direct else "direct"


class CopyPlan:
    """What ``Agent.copy`` would post: ``route``, ``descriptors`` and their ``bytes`` (total) with
    ``smallest`` / ``largest`` per descriptor; ``direct`` and ``staged`` (None: no staging for the remote
    layout) are the two routes' descriptor counts."""

    def __init__(self, route: str, lengths: np.ndarray, direct: int, staged: int | None) -> None:
        self.route, self.direct, self.staged = route, direct, staged
        self.descriptors = int(lengths.size)
        self.bytes = int(lengths.sum())
        self.smallest = int(lengths.min()) if lengths.size else 0
        self.largest = int(lengths.max()) if lengths.size else 0

    def __repr__(self) -> str:
        return (f"CopyPlan(route={self.route}, descriptors={self.descriptors}, bytes={self.bytes}, "
                f"per descriptor {self.smallest}-{self.largest} B; direct {self.direct}, staged {self.staged})")


def _side(view: Any, name: str) -> Side:
    return view.side if isinstance(view, RemoteView) else of_view(view, name)


def plan_copy(src: CacheView | RemoteView, dst: CacheView | RemoteView, src_indices: Any, dst_indices: Any,
              layers: int | range | None = None, *, remote: str | None = None, route: str = "auto") -> CopyPlan:
    """The plan of ``Agent.copy(src, dst, ...)``. ``remote`` (``"src"`` or ``"dst"``) says which side is
    the other process's (the one whose runs the staged route keeps); by default the ``RemoteView``, else
    ``"src"`` (a READ)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if remote is None:
        remote = "dst" if isinstance(dst, RemoteView) else "src"
    if remote not in ("src", "dst"):
        raise ValueError(f"remote must be 'src' or 'dst', got {remote!r}")
    src_side, dst_side = _side(src, "src"), _side(dst, "dst")
    heads = check_pair(src_side, dst_side)
    layer_numbers = window(src_side, dst_side, layers)
    src_tokens, dst_tokens = (np.asarray(i, dtype=np.int64) for i in (src_indices, dst_indices))
    if src_tokens.shape != dst_tokens.shape or src_tokens.ndim != 1:
        raise ValueError(f"src_indices and dst_indices must be 1-D of one length, got {src_tokens.shape} and "
                         f"{dst_tokens.shape}")
    check_tokens("src_indices", src_tokens, src_side, "the tokens of src")
    check_tokens("dst_indices", dst_tokens, dst_side, "the tokens of dst")
    (local, local_tokens), (far, far_tokens) = (((dst_side, dst_tokens), (src_side, src_tokens)) if remote == "src"
                                                else ((src_side, src_tokens), (dst_side, dst_tokens)))
    direct = pair_descriptors(local, local_tokens, far, far_tokens, layer_numbers, heads)
    runs = remote_runs(far, far_tokens, layer_numbers) if staging.can_stage(far) else None
    chosen = choose(route, len(direct), None if runs is None else runs.size)
    lengths = direct.length if chosen == "direct" or runs is None else runs
    return CopyPlan(chosen, lengths, len(direct), None if runs is None else int(runs.size))
