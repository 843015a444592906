"""``kv.copy``: move tokens between any two cache views (``kvnumba.api.views``), K and V, over some layers."""
from __future__ import annotations

from typing import SupportsIndex

from ..types import ArrayLike, StreamLike
from .transfer import plain_caller
from .views import CacheView


def copy(src_view: CacheView, dst_view: CacheView, src_indices: ArrayLike, dst_indices: ArrayLike,
         layers: SupportsIndex | range | None = None, *, block_quota: SupportsIndex = 2,
         num_warps_per_block: SupportsIndex = 32, stream: StreamLike | None = None, check: bool = False) -> None:
    """Copy token ``src_indices[i]`` of ``src_view`` to token ``dst_indices[i]`` of ``dst_view``, K and V.

    One kernel of the factory serves any pair of layouts, built-in or user-defined; views that split
    an item into heads are copied head by head. Bounds come from the views: a token index outside a
    view's T tokens is refused (host indices) or skipped and flagged (device indices), as for every
    entry point.

    Parameters
    ----------
    src_view, dst_view : CacheView
        Any two views (``kv.LayerFirst``, ``kv.PageFirst``, ``kv.PageFirstDirect``, ``kv.PageHead``,
        ``kv.VllmFlashAttn``, ``kv.VllmFlashInfer``, ``kv.LayerTable``, or a user's own) with the same
        item bytes and dtype, both MLA or neither; on one GPU (and pinned host memory).
    src_indices, dst_indices : int64 arrays, ``[N]``
        Token slots, on the device or the host.
    layers : None, int or range
        The layers to copy: all (None), one, or a range with step 1 (layer ``l`` of the source goes to
        layer ``l`` of the destination).
    block_quota, num_warps_per_block : int
        Launch shape, keyword only: at most ``block_quota`` blocks of ``num_warps_per_block`` warps.
    stream, check
        As for every entry point (``kvnumba.transfer_kv_per_layer``).

    Raises
    ------
    TypeError, ValueError
        For a bad argument or views that do not fit together (named in the message), or a view whose
        buffer was given new memory in place since it was made (``CacheView.check_unchanged``);
        nothing is written.

    Examples
    --------
    >>> kv.copy(kv.PageFirst(host_k, host_v), kv.VllmFlashAttn(vllm_caches), idx, idx)  # doctest: +SKIP
    """
    # The views' buffers, as the layers copied use them: unchanged since the views were made.
    if isinstance(src_view, CacheView):
        src_view.check_unchanged("src_view", layers)
    if isinstance(dst_view, CacheView):
        dst_view.check_unchanged("dst_view", layers)
    _copy((src_view, dst_view), (layers,), src_indices, dst_indices, None, block_quota, num_warps_per_block,
          stream, check)


_copy = plain_caller("copy")
