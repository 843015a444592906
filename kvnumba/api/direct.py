"""The seed's three copy-engine entry points (memcpy paths, no kernels): each hands its arguments to
its plain caller, the path ``kvnumba.prepare`` uses (``kvnumba.plan.direct_plan`` does the work).

- ``transfer_kv_direct``: layer-first to layer-first, runs of indices merged into one copy each, submitted
  as one ``cudaMemcpyBatchAsync`` where the stream allows it.
- ``transfer_kv_per_layer_direct_pf_lf`` / ``transfer_kv_all_layer_direct_lf_pf``: between layer-first
  buffers and page-first-direct buffers, one ``cudaMemcpyBatchAsync`` (``kvnumba.driver.batch_copy``).

``last_path()`` says which path the last batched call took.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex

from ..driver.batch_copy import batch_copy_available, log  # noqa: F401 - kv.batch_copy_available
from ..types import ArrayLike, StreamLike
from .transfer import plain_caller


def last_path() -> str | None:
    """How the last non-empty copy-engine call (or ``kv.copy`` by copy engine) submitted its copies (None before
    any): ``"batch"`` (one cudaMemcpyBatchAsync) or ``"page"`` (one cudaMemcpyAsync per copy)."""
    return log.last


def path_counts() -> dict[str, int]:
    """``{"batch": n, "page": m}``: non-empty calls per path since import."""
    return dict(log.counts)


def transfer_kv_direct(src_layers: Sequence[ArrayLike], dst_layers: Sequence[ArrayLike], src_indices: ArrayLike,
                       dst_indices: ArrayLike, page_size: SupportsIndex, *, stream: StreamLike | None = None,
                       check: bool = False) -> None:
    """Copy tokens between per-layer buffers with the copy engines, merging runs of indices.

    ``dst_layers[j][dst_indices[i]] = src_layers[j][src_indices[i]]`` for every layer j and index i.
    Rows of dim 0 are tokens; a run of indices where source and destination both advance by one is
    one copy of ``run_length * row_bytes`` bytes per layer (``row_bytes = nbytes / shape[0]``). The
    copies go as one ``cudaMemcpyBatchAsync`` where it is available (not on the legacy default stream:
    see ``kvnumba.driver.batch_copy``), else one ``cudaMemcpyAsync`` each.

    Parameters
    ----------
    src_layers, dst_layers : lists of arrays
        One buffer per layer (K layers then V layers, or any list), each ``[T, ...]`` with the same
        row bytes as its partner. Device or pinned host memory, in any direction.
    src_indices, dst_indices : int64 arrays, ``[N]``
        Token rows; host or device (device indices are copied to the host first).
    page_size : int
        Positive and dividing N (the seed's check; runs are merged regardless of pages).
    stream : optional
        As in ``transfer_kv_per_layer`` (keyword only).
    check : bool
        Keyword only. Wait for the copies (synchronise the stream) before returning; also on with
        ``KVNUMBA_CHECK=1``. Indices are always checked on the host here.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written. Indices outside their
        buffers raise ``kvnumba.errors.IndexOutOfRangeError`` (a ``ValueError``).
    CopyError
        If a ``cudaMemcpyAsync`` fails.

    Examples
    --------
    >>> kvnumba.transfer_kv_direct(host_layers, gpu_layers, src_idx, dst_idx, page_size=64)  # doctest: +SKIP
    """
    _transfer_kv_direct((src_layers, dst_layers), (page_size,), src_indices, dst_indices, stream, check)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[ArrayLike], dst_ptrs: Sequence[ArrayLike],
                                       src_indices: ArrayLike, dst_indices: ArrayLike, layer_id: SupportsIndex,
                                       page_size: SupportsIndex, *, stream: StreamLike | None = None,
                                       check: bool = False) -> None:
    """Load layers from page-first-direct buffers into layer-first buffers, page by page.

    For page i (``P = page_size``), ``s = src_indices[i*P] // P``, ``d = dst_indices[i*P]``, and each
    layer j of ``dst_ptrs``: ``dst_ptrs[j][d:d+P] = src_ptrs[0][s, layer_id + j]`` (and V from
    ``src_ptrs[1]`` into ``dst_ptrs[j + L]``). One copy per (page, layer, K/V), submitted as one
    ``cudaMemcpyBatchAsync`` when available (see ``kvnumba.driver.batch_copy``), else page by page.

    Parameters
    ----------
    src_ptrs : list of arrays
        Page-first-direct ``[num_pages, num_layers, page_size, ...]``: ``[K, V]``, or ``[KV]`` for MLA.
    dst_ptrs : list of arrays
        Layer-first ``[T, ...]``: L K layers then L V layers (2L arrays), or L arrays for MLA;
        usually one layer (``L = 1``).
    src_indices, dst_indices : int64 arrays, ``[N]``
        Host or device; only each page's first index is read.
    layer_id : int
        Layer of ``src_ptrs`` that ``dst_ptrs[0]`` receives; ``layer_id + L <= num_layers``.
    page_size : int
        Positive, dividing N, equal to dim 2 of ``src_ptrs``.
    stream, check
        As in ``transfer_kv_direct``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written.
    CopyError
        If the batch call fails (naming the failing copy when the runtime reports it) or a page
        copy fails.

    Examples
    --------
    >>> kvnumba.transfer_kv_per_layer_direct_pf_lf([k_host, v_host], [k_gpu, v_gpu], src_idx, dst_idx,
    ...                                            layer_id=3, page_size=64, stream=side)  # doctest: +SKIP
    """
    _transfer_kv_per_layer_direct_pf_lf((src_ptrs, dst_ptrs), (layer_id, page_size), src_indices, dst_indices, stream,
                                        check)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[ArrayLike], dst_ptrs: Sequence[ArrayLike],
                                       src_indices: ArrayLike, dst_indices: ArrayLike, page_size: SupportsIndex, *,
                                       stream: StreamLike | None = None, check: bool = False) -> None:
    """Store all layers from layer-first buffers into page-first-direct buffers, page by page.

    For page i (``P = page_size``), ``s = src_indices[i*P]``, ``d = dst_indices[i*P] // P``, and every
    layer j: ``dst_ptrs[0][d, j] = src_ptrs[j][s:s+P]`` (and ``dst_ptrs[1][d, j] = src_ptrs[j + L][s:s+P]``).
    One copy per (page, layer, K/V), submitted as one ``cudaMemcpyBatchAsync`` when available, else
    page by page.

    Parameters
    ----------
    src_ptrs : list of arrays
        Layer-first ``[T, ...]``: L K layers then L V layers, or L arrays for MLA.
    dst_ptrs : list of arrays
        Page-first-direct ``[num_pages, num_layers, page_size, ...]``: ``[K, V]``, or ``[KV]`` for
        MLA (``is_mla = len(dst_ptrs) == 1``); ``L <= num_layers``.
    src_indices, dst_indices : int64 arrays, ``[N]``
        Host or device; only each page's first index is read.
    page_size : int
        Positive, dividing N, equal to dim 2 of ``dst_ptrs``.
    stream, check
        As in ``transfer_kv_direct``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written.
    CopyError
        If the batch call or a page copy fails.

    Examples
    --------
    >>> kvnumba.transfer_kv_all_layer_direct_lf_pf(k_layers + v_layers, [k_host, v_host], src_idx, dst_idx,
    ...                                            page_size=64, stream=side)  # doctest: +SKIP
    """
    _transfer_kv_all_layer_direct_lf_pf((src_ptrs, dst_ptrs), (page_size,), src_indices, dst_indices, stream, check)


# The per-call function behind each entry point (``kvnumba.api.transfer.plain_caller``).
_transfer_kv_direct = plain_caller("transfer_kv_direct")
_transfer_kv_per_layer_direct_pf_lf = plain_caller("transfer_kv_per_layer_direct_pf_lf")
_transfer_kv_all_layer_direct_lf_pf = plain_caller("transfer_kv_all_layer_direct_lf_pf")
