"""``plan_copy``: the descriptors a remote copy would post, computed without NIXL or a transfer, for
reports and tests (``scripts/remote_descriptors.py``). Views over ``np.zeros`` arrays cost no memory."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..api.views import CacheView
from . import plan, staging
from .handles import RemoteView
from .sides import Side, of_view


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
    if route not in plan.ROUTES:
        raise ValueError(f"route must be one of {', '.join(plan.ROUTES)}, got {route!r}")
    if remote is None:
        remote = "dst" if isinstance(dst, RemoteView) else "src"
    if remote not in ("src", "dst"):
        raise ValueError(f"remote must be 'src' or 'dst', got {remote!r}")
    src_side, dst_side = _side(src, "src"), _side(dst, "dst")
    heads = plan.check_pair(src_side, dst_side)
    layer_numbers = plan.window(src_side, dst_side, layers)
    src_tokens, dst_tokens = (np.asarray(i, dtype=np.int64) for i in (src_indices, dst_indices))
    if src_tokens.shape != dst_tokens.shape or src_tokens.ndim != 1:
        raise ValueError(f"src_indices and dst_indices must be 1-D of one length, got {src_tokens.shape} and "
                         f"{dst_tokens.shape}")
    plan.check_tokens("src_indices", src_tokens, src_side, "the tokens of src")
    plan.check_tokens("dst_indices", dst_tokens, dst_side, "the tokens of dst")
    (local, local_tokens), (far, far_tokens) = (((dst_side, dst_tokens), (src_side, src_tokens)) if remote == "src"
                                                else ((src_side, src_tokens), (dst_side, dst_tokens)))
    direct = plan.pair_descriptors(local, local_tokens, far, far_tokens, layer_numbers, heads)
    runs = plan.remote_runs(far, far_tokens, layer_numbers) if staging.can_stage(far) else None
    chosen = plan.choose(route, len(direct), None if runs is None else runs.size)
    lengths = direct.length if chosen == "direct" or runs is None else runs
    return CopyPlan(chosen, lengths, len(direct), None if runs is None else int(runs.size))
