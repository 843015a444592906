"""``kv.copy``: move tokens between any two cache views (``kvnumba.layouts``), K and V, over some layers; with a
``kv.Fp8View`` (``kvnumba.api.fp8_views``) or ``kv.Nvfp4View`` (``kvnumba.api.nvfp4_views``) on a side, quantise,
dequantise or copy quantised caches (their plans: ``kvnumba.plan.fp8_plan``, ``kvnumba.plan.nvfp4_plan``). Every copy takes the one path of the plain entry points (``plain_caller``)."""
from __future__ import annotations

from typing import Literal, SupportsIndex

from ..types import ArrayLike, StreamLike
from .transfer import plain_caller
from .fp8_views import Fp8View
from .nvfp4_views import Nvfp4View
from ..layouts import CacheView


def copy(src_view: CacheView, dst_view: CacheView, src_indices: ArrayLike, dst_indices: ArrayLike,
         layers: SupportsIndex | range | None = None, *, block_quota: SupportsIndex = 2,
         num_warps_per_block: SupportsIndex = 32, route: Literal["auto", "kernel", "copy_engine"] = "auto", stream: StreamLike | None = None,
         check: bool = False) -> None:
    """Copy token ``src_indices[i]`` of ``src_view`` to token ``dst_indices[i]`` of ``dst_view``, K and V.

    One kernel of the factory serves any pair of layouts, built-in or user-defined; views that split
    an item into heads are copied head by head. Bounds come from the views: a token index outside a
    view's T tokens is refused (host indices) or skipped and flagged (device indices), as for every
    entry point.

    Parameters
    ----------
    src_view, dst_view : CacheView
        Any two views (kvnumba's, ``kvnumba.layouts``: ``kv.LayerFirst``, ``kv.PageFirst``, ...; or a user's
        own) with the same item bytes and dtype, both MLA or neither; on one GPU (and pinned host memory).
    src_indices, dst_indices : int64 arrays, ``[N]``
        Token slots, on the device or the host.
    layers : None, int or range
        The layers to copy: all (None), one, or a range with step 1 (layer ``l`` of the source goes to
        layer ``l`` of the destination).
    block_quota, num_warps_per_block : int
        Launch shape, keyword only: at most ``block_quota`` blocks of ``num_warps_per_block`` warps. One-warp
        blocks run a build of at most 32 registers, which fits on an SM beside a model's GEMM: with
        ``block_quota`` at the GPU's SM count, loads keep their speed while the model computes.
    route : {"auto", "kernel", "copy_engine"}
        Keyword only. ``"kernel"``: the kernel. ``"copy_engine"``: one copy per run of tokens that follow
        each other in both views, per layer, K/V and head, submitted as one ``cudaMemcpyBatchAsync``: no SM
        used (indices in GPU memory are copied to the host first, synchronously). ``"auto"``: the copy
        engine when the indices are on the host (NumPy, CPU tensors), the stream is not the legacy default
        stream and the copies average 64 KiB or more (pages of a layer-first pool, vLLM blocks), else the
        kernel. ``kv.last_route()`` says which route ran (``kvnumba.plan.routes``).
    stream, check
        As for every entry point (``kvnumba.transfer_kv_per_layer``).

    Raises
    ------
    TypeError, ValueError
        For a bad argument or views that do not fit together (named in the message), or a view whose
        buffer was given new memory in place since it was made (``CacheView.check_unchanged``);
        nothing is written. ``route="copy_engine"`` for views it cannot serve (a layout of your own).
    CaptureError
        While the stream is being captured into a CUDA graph, for what a graph cannot hold (host
        indices, ``check=True``, the copy-engine route, a first call with new views).

    Examples
    --------
    >>> kv.copy(kv.PageFirst(host_k, host_v), kv.VllmFlashAttn(vllm_caches), idx, idx)  # doctest: +SKIP
    """
    # The views' buffers, as the layers copied use them: unchanged since the views were made.
    if isinstance(src_view, (CacheView, Fp8View, Nvfp4View)):
        src_view.check_unchanged("src_view", layers)
    if isinstance(dst_view, (CacheView, Fp8View, Nvfp4View)):
        dst_view.check_unchanged("dst_view", layers)
    _copy((src_view, dst_view), (layers,), src_indices, dst_indices, None, block_quota, num_warps_per_block,
          stream, check, route)


_copy = plain_caller("copy")
