"""The ten kernel entry points of SGLang's ``sgl_kernel.kvcacheio``: validate, pick the stream, launch.

Names, argument names, order and defaults are the seed's; ``stream=`` is kvnumba's keyword-only
addition. Sizes (``item_size``, ``*_layout_dim``) are in bytes. Every buffer is read as raw bytes,
so any dtype works (fp16, bf16, fp8, fp32, int8, ...).

Layouts (per K or V buffer; MLA has one buffer and no V), for T token slots, L layers:
- layer-first ``lf``: one buffer per layer, ``[T, item]``; token t at ``t * item_size``.
- layer table: the ``*_layers`` arguments, a uint64 table of L layer-first base addresses
  (``kvnumba.layer_table``).
- page-first ``pf``: one buffer ``[T, L, item]``; token t, layer l at ``t * layout_dim + l * item_size``
  (``layout_dim = L * item_size`` for a dense buffer).
- page-head ``ph``: one buffer ``[T / page_size, head_num, page_size, L, item / head_num]``, copied head
  by head (``layout_dim = L * item_size``).
"""
from . import validate
from .arrays import array_info
from ._target import SIMULATOR
from .kernels import NO_LIMIT, get_kernel, launch_shape
from .launch import launch
from .layouts import Layout
from .streams import stream_handle

LF, TBL, PF, PH = Layout.LAYER_FIRST, Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD


def _kernel_indices(index_info):
    """An index array's address where the kernel can read it, and whether we made a device copy."""
    if index_info.on_device:
        return index_info.ptr, None
    import numpy as np
    from numba import cuda

    host = index_info.obj.numpy() if index_info.is_torch else np.ascontiguousarray(index_info.obj)
    copy = cuda.to_device(host)
    return copy.device_ctypes_pointer.value, copy


def _transfer(src_layout, dst_layout, mla, buffers, indices, *, first_layer, num_layers, item_size,
              src_layout_dim=0, dst_layout_dim=0, page_size=1, head_num=1, launch_config, stream,
              src_token_limit=NO_LIMIT, dst_token_limit=NO_LIMIT, error_flag=0):
    """Launch one transfer. ``buffers`` is (src_k, dst_k, src_v, dst_v) as ArrayInfo (V None for MLA)."""
    src_indices, dst_indices = indices
    num_items = src_indices.shape[0]
    block_quota, warps = launch_config
    src_k, dst_k, src_v, dst_v = buffers
    handle = stream_handle(stream, src_k.is_torch or dst_k.is_torch or src_indices.is_torch)
    if num_items == 0:
        return
    src_ptr, src_copy = _kernel_indices(src_indices)
    dst_ptr, dst_copy = _kernel_indices(dst_indices)
    items_per_warp, blocks, threads = launch_shape(num_items, block_quota, warps)
    # A plain tuple in KernelArgs order (building the NamedTuple costs more than the launch).
    args = (src_k.ptr, dst_k.ptr, src_v.ptr if src_v else 0, dst_v.ptr if dst_v else 0, src_ptr, dst_ptr,
            first_layer, num_layers, num_items, items_per_warp, item_size, src_layout_dim, dst_layout_dim,
            page_size, head_num, src_token_limit, dst_token_limit, error_flag)
    launch(get_kernel(src_layout, dst_layout, mla), blocks, threads, handle, args)
    if (src_copy is not None or dst_copy is not None) and not SIMULATOR:
        # Host-resident indices were copied to temporary device arrays: wait before freeing them.
        from numba import cuda

        cuda.external_stream(handle).synchronize() if handle else cuda.default_stream().synchronize()


def _kv(src_k, dst_k, src_v, dst_v, table_src=False, table_dst=False, num_layers=None):
    """Describe K/V operands; ``table_*`` marks which side is a layer table."""
    if table_src:
        src_k = validate.layer_table("src_k_layers", src_k, num_layers)
        src_v = validate.layer_table("src_v_layers", src_v, num_layers)
    else:
        src_k, src_v = array_info(src_k, "src_k"), array_info(src_v, "src_v")
    if table_dst:
        dst_k = validate.layer_table("dst_k_layers", dst_k, num_layers)
        dst_v = validate.layer_table("dst_v_layers", dst_v, num_layers)
    else:
        dst_k, dst_v = array_info(dst_k, "dst_k"), array_info(dst_v, "dst_v")
    return src_k, dst_k, src_v, dst_v


def _mla(src, dst, table_src=None, table_dst=None, num_layers=None):
    src = validate.layer_table("src_layers", src, num_layers) if table_src else array_info(src, "src")
    dst = validate.layer_table("dst_layers", dst, num_layers) if table_dst else array_info(dst, "dst")
    return (src, dst, None, None)


def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size, block_quota=2,
                          num_warps_per_block=32, *, stream=None):
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

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written.

    Example
    -------
    >>> kvnumba.transfer_kv_per_layer(k_host, k_gpu, v_host, v_gpu, src_idx, dst_idx, 2048)  # doctest: +SKIP
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _transfer(LF, LF, False, buffers, indices, first_layer=0, num_layers=1, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, block_quota=2, num_warps_per_block=32, *, stream=None):
    """Load one layer from page-first buffers into layer-first buffers (HiCache's per-layer load).

    ``dst_k[dst_indices[i]] = src_k[src_indices[i], layer_id]`` (and V).

    Parameters
    ----------
    src_k, src_v : arrays
        Page-first ``[T, L, item]``: token t, layer l at byte ``t * src_layout_dim + l * item_size``.
    dst_k, dst_v : arrays
        Layer-first buffers of layer ``layer_id``, ``[T, item]``.
    src_indices, dst_indices : int64 arrays, ``[N]``
    layer_id : int
        The layer to load, ``0 <= layer_id``.
    item_size : int
        Bytes per item, a multiple of 8.
    src_layout_dim : int
        Bytes per source token slot across all layers (``L * item_size`` for a dense buffer).
    block_quota, num_warps_per_block, stream
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0)
    item_size = validate.item_size(item_size)
    src_layout_dim = validate.integer("src_layout_dim", src_layout_dim, minimum=0)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _transfer(PF, LF, False, buffers, indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, launch_config=(block_quota, warps), stream=stream)


def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, page_size, head_num, block_quota=2, num_warps_per_block=32, *,
                                stream=None):
    """Load one layer from page-head buffers into layer-first buffers, head by head.

    ``dst_k[dst_indices[i], h] = src_k[p, h, s, layer_id]`` for every head h, where
    ``p, s = divmod(src_indices[i], page_size)`` (and V).

    Parameters
    ----------
    src_k, src_v : arrays
        Page-head ``[T / page_size, head_num, page_size, L, item / head_num]``.
    dst_k, dst_v : arrays
        Layer-first buffers of layer ``layer_id``, ``[T, item]`` (``[T, head_num, head_dim]``).
    src_indices, dst_indices : int64 arrays, ``[N]``
    layer_id : int
    item_size : int
        Bytes per item; ``item_size / head_num`` must be a multiple of 8.
    src_layout_dim : int
        ``L * item_size`` for a dense page-head buffer.
    page_size, head_num : int
        Tokens per page and heads per item, both >= 1.
    block_quota, num_warps_per_block, stream
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0)
    page_size = validate.integer("page_size", page_size, minimum=1)
    head_num = validate.integer("head_num", head_num, minimum=1)
    item_size = validate.item_size(item_size, head_num)
    src_layout_dim = validate.integer("src_layout_dim", src_layout_dim, minimum=0)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _transfer(PH, LF, False, buffers, indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, page_size=page_size, head_num=head_num,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size, num_layers, block_quota=2, num_warps_per_block=32, *, stream=None):
    """Copy every layer's K and V items between two sets of layer-first buffers, via layer tables.

    ``dst_k_layer[l][dst_indices[i]] = src_k_layer[l][src_indices[i]]`` for all l (and V).

    Parameters
    ----------
    src_k_layers, dst_k_layers, src_v_layers, dst_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables: base addresses of ``num_layers`` layer-first buffers ``[T, item]``
        (``kvnumba.layer_table``), resident where the kernel can read them.
    src_indices, dst_indices : int64 arrays, ``[N]``
    item_size : int
    num_layers : int
        Length of every table.
    block_quota, num_warps_per_block, stream
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, True, True, num_layers)
    _transfer(TBL, TBL, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, block_quota=2, num_warps_per_block=32, *, stream=None):
    """Back up every layer from layer-first buffers into page-first buffers (HiCache's backup).

    ``dst_k[dst_indices[i], l] = src_k_layer[l][src_indices[i]]`` for all l (and V).

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables of layer-first buffers ``[T, item]``.
    dst_k, dst_v : arrays
        Page-first ``[T, L, item]``: token t, layer l at byte ``t * dst_layout_dim + l * item_size``.
    src_indices, dst_indices : int64 arrays, ``[N]``
    item_size : int
    dst_layout_dim : int
        ``L * item_size`` for a dense buffer.
    num_layers : int
    block_quota, num_warps_per_block, stream
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    dst_layout_dim = validate.integer("dst_layout_dim", dst_layout_dim, minimum=0)
    num_layers = validate.integer("num_layers", num_layers, minimum=1)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k, src_v_layers, dst_v, True, False, num_layers)
    _transfer(TBL, PF, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, launch_config=(block_quota, warps), stream=stream)


def transfer_kv_all_layer_lf_ph(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, page_size, head_num, block_quota=2,
                                num_warps_per_block=32, *, stream=None):
    """Back up every layer from layer-first buffers into page-head buffers, head by head.

    ``dst_k[p, h, s, l] = src_k_layer[l][src_indices[i], h]`` with
    ``p, s = divmod(dst_indices[i], page_size)``, for all l and h (and V).

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 arrays, ``[num_layers]``
        Layer tables of layer-first buffers ``[T, item]``.
    dst_k, dst_v : arrays
        Page-head ``[T / page_size, head_num, page_size, L, item / head_num]``.
    src_indices, dst_indices : int64 arrays, ``[N]``
    item_size : int
        ``item_size / head_num`` must be a multiple of 8.
    dst_layout_dim : int
        ``L * item_size`` for a dense buffer.
    num_layers, page_size, head_num : int
    block_quota, num_warps_per_block, stream
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    page_size = validate.integer("page_size", page_size, minimum=1)
    head_num = validate.integer("head_num", head_num, minimum=1)
    item_size = validate.item_size(item_size, head_num)
    dst_layout_dim = validate.integer("dst_layout_dim", dst_layout_dim, minimum=0)
    num_layers = validate.integer("num_layers", num_layers, minimum=1)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k, src_v_layers, dst_v, True, False, num_layers)
    _transfer(TBL, PH, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, page_size=page_size, head_num=head_num,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=2, num_warps_per_block=32,
                              *, stream=None):
    """MLA: copy one layer's items between two layer-first buffers (one buffer, no V).

    ``dst[dst_indices[i]] = src[src_indices[i]]``; shapes as ``transfer_kv_per_layer``'s K.
    Raises ``TypeError``/``ValueError`` for a bad argument; nothing is written.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    indices = validate.indices(src_indices, dst_indices)
    _transfer(LF, LF, True, _mla(src, dst), indices, first_layer=0, num_layers=1, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                    block_quota=2, num_warps_per_block=32, *, stream=None):
    """MLA: load one layer from a page-first buffer ``[T, L, item]`` into a layer-first ``[T, item]``.

    ``dst[dst_indices[i]] = src[src_indices[i], layer_id]``; arguments as
    ``transfer_kv_per_layer_pf_lf``. Raises ``TypeError``/``ValueError``; nothing is written then.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0)
    item_size = validate.item_size(item_size)
    src_layout_dim = validate.integer("src_layout_dim", src_layout_dim, minimum=0)
    indices = validate.indices(src_indices, dst_indices)
    _transfer(PF, LF, True, _mla(src, dst), indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, launch_config=(block_quota, warps), stream=stream)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                              block_quota=2, num_warps_per_block=32, *, stream=None):
    """MLA: copy every layer between two sets of layer-first buffers given as layer tables.

    ``dst_layer[l][dst_indices[i]] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer``. Raises ``TypeError``/``ValueError``; nothing is written then.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _mla(src_layers, dst_layers, True, True, num_layers)
    _transfer(TBL, TBL, True, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers, block_quota=2, num_warps_per_block=32, *, stream=None):
    """MLA: back up every layer from layer-first buffers (a layer table) into a page-first ``[T, L, item]``.

    ``dst[dst_indices[i], l] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer_lf_pf``. Raises ``TypeError``/``ValueError``; nothing is written then.
    """
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    dst_layout_dim = validate.integer("dst_layout_dim", dst_layout_dim, minimum=0)
    num_layers = validate.integer("num_layers", num_layers, minimum=1)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _mla(src_layers, dst, True, False, num_layers)
    _transfer(TBL, PF, True, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, launch_config=(block_quota, warps), stream=stream)
