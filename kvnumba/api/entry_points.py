"""The ten kernel entry points of SGLang's ``sgl_kernel.kvcacheio``: thin wrappers over ``kvnumba.prepare``'s path.

Names, argument names, order and defaults are the seed's; ``stream=`` and ``check=`` are kvnumba's
keyword-only additions. Sizes (``item_size``, ``*_layout_dim``) are in bytes, and every buffer is read as
raw bytes, so any dtype works. ``transfer_kv_per_layer`` documents what they all share (launch shape,
``stream``, ``check``, errors); each of the others gives its buffers' shapes.
"""
from __future__ import annotations

from typing import SupportsIndex

from ..types import ArrayLike, StreamLike
from .transfer import plain_caller


def transfer_kv_per_layer(src_k: ArrayLike, dst_k: ArrayLike, src_v: ArrayLike, dst_v: ArrayLike,
                          src_indices: ArrayLike, dst_indices: ArrayLike, item_size: SupportsIndex,
                          block_quota: SupportsIndex = 2, num_warps_per_block: SupportsIndex = 32, *,
                          stream: StreamLike | None = None, check: bool = False) -> None:
    """Copy one layer's K and V items between two layer-first buffers.

    ``dst_k[dst_indices[i]] = src_k[src_indices[i]]`` (and the same for V), item by item.

    Parameters
    ----------
    src_k, dst_k, src_v, dst_v : arrays
        Layer-first buffers of one layer, ``[T, item]`` (any shape with ``item_size`` bytes per
        token slot). Device or pinned host memory, in any direction.
    src_indices, dst_indices : int64 arrays, ``[N]``
        Token slots to read and write, on the device (host arrays are copied first, synchronously).
    item_size : int
        Bytes per token slot (``head_num * head_dim * dtype bytes``), a multiple of 8.
    block_quota, num_warps_per_block : int
        Launch shape: at most ``block_quota`` blocks of ``num_warps_per_block`` warps.
    stream : optional
        CUDA stream (keyword only); default: torch's current stream for torch tensors, else the
        default stream.
    check : bool
        Keyword only. Synchronise the stream after the launch and raise if the kernel skipped items
        with out-of-range indices in GPU memory (also on with ``KVNUMBA_CHECK=1``; see
        ``kvnumba.checks.guard``). Costs the synchronisation. Off: such errors raise at the next kvnumba
        call or at ``kvnumba.check_errors()``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written. Host-resident indices
        outside their buffers raise ``kvnumba.errors.IndexOutOfRangeError``, pageable host buffers
        ``kvnumba.errors.PageableMemoryError`` (both ``ValueError``). For indices in GPU memory the
        kernel skips out-of-range items and copies the others; ``IndexOutOfRangeError`` follows
        as described under ``check``.

    Examples
    --------
    >>> kvnumba.transfer_kv_per_layer(k_host, k_gpu, v_host, v_gpu, src_idx, dst_idx, 2048)  # doctest: +SKIP
    """
    _transfer_kv_per_layer(
        (src_k, dst_k, src_v, dst_v), (item_size,), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_per_layer_pf_lf(src_k: ArrayLike, dst_k: ArrayLike, src_v: ArrayLike, dst_v: ArrayLike,
                                src_indices: ArrayLike, dst_indices: ArrayLike, layer_id: SupportsIndex,
                                item_size: SupportsIndex, src_layout_dim: SupportsIndex, block_quota: SupportsIndex = 2,
                                num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                                check: bool = False) -> None:
    """Load one layer from page-first buffers into layer-first buffers (HiCache's per-layer load).

    ``dst_k[dst_indices[i]] = src_k[src_indices[i], layer_id]`` (and V).

    Parameters
    ----------
    src_k, src_v : arrays
        Page-first ``[T, L, item]``: token t, layer l at byte ``t * src_layout_dim + l * item_size``.
    dst_k, dst_v : arrays
        Layer-first buffers of layer ``layer_id``, ``[T, item]``.
    layer_id : int
        The layer to load, ``0 <= layer_id``.
    src_layout_dim : int
        Bytes per source token slot across all layers (``L * item_size`` for a dense buffer).
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``; so are its errors (``TypeError``/``ValueError``, nothing written).
    """
    _transfer_kv_per_layer_pf_lf(
        (src_k, dst_k, src_v, dst_v), (item_size, src_layout_dim), src_indices, dst_indices, layer_id,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_per_layer_ph_lf(src_k: ArrayLike, dst_k: ArrayLike, src_v: ArrayLike, dst_v: ArrayLike,
                                src_indices: ArrayLike, dst_indices: ArrayLike, layer_id: SupportsIndex,
                                item_size: SupportsIndex, src_layout_dim: SupportsIndex, page_size: SupportsIndex,
                                head_num: SupportsIndex, block_quota: SupportsIndex = 2,
                                num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                                check: bool = False) -> None:
    """Load one layer from page-head buffers into layer-first buffers, head by head.

    ``dst_k[dst_indices[i], h] = src_k[p, h, s, layer_id]`` for every head h, where
    ``p, s = divmod(src_indices[i], page_size)`` (and V).

    Parameters
    ----------
    src_k, src_v : arrays
        Page-head ``[T / page_size, head_num, page_size, L, item / head_num]``.
    dst_k, dst_v : arrays
        Layer-first buffers of layer ``layer_id``, ``[T, item]`` (``[T, head_num, head_dim]``).
    item_size : int
        Bytes per item; ``item_size / head_num`` must be a multiple of 8.
    page_size, head_num : int
        Tokens per page and heads per item, both >= 1.
    src_indices, dst_indices, layer_id, src_layout_dim, block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer_pf_lf``; so are its errors (``TypeError``/``ValueError``, nothing written).
    """
    _transfer_kv_per_layer_ph_lf(
        (src_k, dst_k, src_v, dst_v), (item_size, src_layout_dim, page_size, head_num), src_indices, dst_indices, layer_id,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_all_layer(src_k_layers: ArrayLike, dst_k_layers: ArrayLike, src_v_layers: ArrayLike,
                          dst_v_layers: ArrayLike, src_indices: ArrayLike, dst_indices: ArrayLike,
                          item_size: SupportsIndex, num_layers: SupportsIndex, block_quota: SupportsIndex = 2,
                          num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                          check: bool = False) -> None:
    """Copy every layer's K and V items between two sets of layer-first buffers, via layer tables.

    ``dst_k_layer[l][dst_indices[i]] = src_k_layer[l][src_indices[i]]`` for all l (and V).

    Parameters
    ----------
    src_k_layers, dst_k_layers, src_v_layers, dst_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables: base addresses of ``num_layers`` layer-first buffers ``[T, item]``
        (``kvnumba.layer_table``), resident where the kernel can read them.
    num_layers : int
        Length of every table.
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``; so are its errors (``TypeError``/``ValueError``, nothing written).
    """
    _transfer_kv_all_layer(
        (src_k_layers, dst_k_layers, src_v_layers, dst_v_layers), (item_size, num_layers), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_all_layer_lf_pf(src_k_layers: ArrayLike, dst_k: ArrayLike, src_v_layers: ArrayLike, dst_v: ArrayLike,
                                src_indices: ArrayLike, dst_indices: ArrayLike, item_size: SupportsIndex,
                                dst_layout_dim: SupportsIndex, num_layers: SupportsIndex,
                                block_quota: SupportsIndex = 2, num_warps_per_block: SupportsIndex = 32, *,
                                stream: StreamLike | None = None, check: bool = False) -> None:
    """Back up every layer from layer-first buffers into page-first buffers (HiCache's backup).

    ``dst_k[dst_indices[i], l] = src_k_layer[l][src_indices[i]]`` for all l (and V).

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables of layer-first buffers ``[T, item]``.
    dst_k, dst_v : arrays
        Page-first ``[T, L, item]``: token t, layer l at byte ``t * dst_layout_dim + l * item_size``.
    dst_layout_dim : int
        ``L * item_size`` for a dense buffer.
    src_indices, dst_indices, item_size, num_layers, block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_all_layer``; so are its errors (``TypeError``/``ValueError``, nothing written).
    """
    _transfer_kv_all_layer_lf_pf(
        (src_k_layers, dst_k, src_v_layers, dst_v), (item_size, dst_layout_dim, num_layers), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_all_layer_lf_ph(src_k_layers: ArrayLike, dst_k: ArrayLike, src_v_layers: ArrayLike, dst_v: ArrayLike,
                                src_indices: ArrayLike, dst_indices: ArrayLike, item_size: SupportsIndex,
                                dst_layout_dim: SupportsIndex, num_layers: SupportsIndex, page_size: SupportsIndex,
                                head_num: SupportsIndex, block_quota: SupportsIndex = 2,
                                num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                                check: bool = False) -> None:
    """Back up every layer from layer-first buffers into page-head buffers, head by head.

    ``dst_k[p, h, s, l] = src_k_layer[l][src_indices[i], h]`` with
    ``p, s = divmod(dst_indices[i], page_size)``, for all l and h (and V).

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables of layer-first buffers ``[T, item]``.
    dst_k, dst_v : arrays
        Page-head ``[T / page_size, head_num, page_size, L, item / head_num]``.
    item_size, page_size, head_num : int
        As in ``transfer_kv_per_layer_ph_lf``.
    src_indices, dst_indices, dst_layout_dim, num_layers, block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_all_layer_lf_pf``; so are its errors (``TypeError``/``ValueError``, nothing written).
    """
    _transfer_kv_all_layer_lf_ph(
        (src_k_layers, dst_k, src_v_layers, dst_v), (item_size, dst_layout_dim, num_layers, page_size, head_num), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_per_layer_mla(src: ArrayLike, dst: ArrayLike, src_indices: ArrayLike, dst_indices: ArrayLike,
                              item_size: SupportsIndex, block_quota: SupportsIndex = 2,
                              num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                              check: bool = False) -> None:
    """MLA: copy one layer's items between two layer-first buffers (one buffer, no V).

    ``dst[dst_indices[i]] = src[src_indices[i]]``; shapes, launch shape, ``stream``, ``check`` and errors as
    ``transfer_kv_per_layer``'s (K's).
    """
    _transfer_kv_per_layer_mla(
        (src, dst), (item_size,), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_per_layer_mla_pf_lf(src: ArrayLike, dst: ArrayLike, src_indices: ArrayLike, dst_indices: ArrayLike,
                                    layer_id: SupportsIndex, item_size: SupportsIndex, src_layout_dim: SupportsIndex,
                                    block_quota: SupportsIndex = 2, num_warps_per_block: SupportsIndex = 32, *,
                                    stream: StreamLike | None = None, check: bool = False) -> None:
    """MLA: load one layer from a page-first buffer ``[T, L, item]`` into a layer-first ``[T, item]``.

    ``dst[dst_indices[i]] = src[src_indices[i], layer_id]``; arguments as
    ``transfer_kv_per_layer_pf_lf``. Errors, ``stream`` and ``check`` as in ``transfer_kv_per_layer``.
    """
    _transfer_kv_per_layer_mla_pf_lf(
        (src, dst), (item_size, src_layout_dim), src_indices, dst_indices, layer_id,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_all_layer_mla(src_layers: ArrayLike, dst_layers: ArrayLike, src_indices: ArrayLike,
                              dst_indices: ArrayLike, item_size: SupportsIndex, num_layers: SupportsIndex,
                              block_quota: SupportsIndex = 2, num_warps_per_block: SupportsIndex = 32, *,
                              stream: StreamLike | None = None, check: bool = False) -> None:
    """MLA: copy every layer between two sets of layer-first buffers given as layer tables.

    ``dst_layer[l][dst_indices[i]] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer``. Errors, ``stream`` and ``check`` as in ``transfer_kv_per_layer``.
    """
    _transfer_kv_all_layer_mla(
        (src_layers, dst_layers), (item_size, num_layers), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


def transfer_kv_all_layer_mla_lf_pf(src_layers: ArrayLike, dst: ArrayLike, src_indices: ArrayLike,
                                    dst_indices: ArrayLike, item_size: SupportsIndex, dst_layout_dim: SupportsIndex,
                                    num_layers: SupportsIndex, block_quota: SupportsIndex = 2,
                                    num_warps_per_block: SupportsIndex = 32, *, stream: StreamLike | None = None,
                                    check: bool = False) -> None:
    """MLA: back up every layer from layer-first buffers (a layer table) into a page-first ``[T, L, item]``.

    ``dst[dst_indices[i], l] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer_lf_pf``. Errors, ``stream`` and ``check`` as in ``transfer_kv_per_layer``.
    """
    _transfer_kv_all_layer_mla_lf_pf(
        (src_layers, dst), (item_size, dst_layout_dim, num_layers), src_indices, dst_indices, None,
        block_quota, num_warps_per_block, stream, check)


# The per-call function behind each entry point (``kvnumba.api.transfer.plain_caller``).
_transfer_kv_per_layer = plain_caller("transfer_kv_per_layer")
_transfer_kv_per_layer_pf_lf = plain_caller("transfer_kv_per_layer_pf_lf")
_transfer_kv_per_layer_ph_lf = plain_caller("transfer_kv_per_layer_ph_lf")
_transfer_kv_all_layer = plain_caller("transfer_kv_all_layer")
_transfer_kv_all_layer_lf_pf = plain_caller("transfer_kv_all_layer_lf_pf")
_transfer_kv_all_layer_lf_ph = plain_caller("transfer_kv_all_layer_lf_ph")
_transfer_kv_per_layer_mla = plain_caller("transfer_kv_per_layer_mla")
_transfer_kv_per_layer_mla_pf_lf = plain_caller("transfer_kv_per_layer_mla_pf_lf")
_transfer_kv_all_layer_mla = plain_caller("transfer_kv_all_layer_mla")
_transfer_kv_all_layer_mla_lf_pf = plain_caller("transfer_kv_all_layer_mla_lf_pf")
