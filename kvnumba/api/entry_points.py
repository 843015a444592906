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
import functools

import numpy as np

from ..checks import bounds

from ..checks import guard

from ..checks import pinned

from ..checks import validate
from ..arrays import array_info
from ..driver.target import SIMULATOR
from ..errors import IndexOutOfRangeError
from ..kernels.factory import NO_LIMIT, get_kernel, launch_shape
from ..driver.launch import launch
from ..kernels.layouts import Layout
from ..driver.streams import stream_handle

LF, TBL, PF, PH = Layout.LAYER_FIRST, Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD


def _kernel_indices(index_info):
    """An index array's address where the kernel can read it, and whether we made a device copy."""
    if index_info.on_device:
        return index_info.ptr, None
    from numba import cuda

    host = index_info.obj.numpy() if index_info.is_torch else np.ascontiguousarray(index_info.obj)
    copy = cuda.to_device(host)
    return copy.device_ctypes_pointer.value, copy


def _transfer(src_layout, dst_layout, mla, buffers, indices, *, first_layer, num_layers, item_size,
              src_layout_dim=0, dst_layout_dim=0, page_size=1, head_num=1, launch_config, stream,
              src_token_limit=NO_LIMIT, dst_token_limit=NO_LIMIT, error_flag=0):
    """Launch one transfer, unchecked (entry points go through ``_run``). ``buffers`` is
    (src_k, dst_k, src_v, dst_v) as ArrayInfo (V None for MLA). Returns the stream handle used."""
    src_indices, dst_indices = indices
    num_items = src_indices.shape[0]
    block_quota, warps = launch_config
    src_k, dst_k, src_v, dst_v = buffers
    handle = stream_handle(stream, src_k.is_torch or dst_k.is_torch or src_indices.is_torch)
    if num_items == 0:
        return handle
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
    return handle


_LAYOUT_NAMES = {LF: "layer-first", TBL: "layer-table", PF: "page-first", PH: "page-head"}


@functools.cache
def _names(src_layout, dst_layout, mla):
    """Argument names of (src_k, dst_k, src_v, dst_v) for messages (V None for MLA)."""
    s = "_layers" if src_layout is TBL else ""
    d = "_layers" if dst_layout is TBL else ""
    if mla:
        return (f"src{s}", f"dst{d}", None, None)
    return (f"src_k{s}", f"dst_k{d}", f"src_v{s}", f"dst_v{d}")


def _side_limit(layout, k, v, k_name, v_name, layout_dim, check, item_size, first_layer, num_layers, page_size,
                heads):
    """Token limit of one side (K and V: the smaller) and the bytes it was computed from."""
    if layout is TBL:
        nbytes = None
        for name, info in ((k_name, k), (v_name, v)):
            if info is None:
                continue
            extents = getattr(info.obj, "layer_nbytes", None)  # recorded by kvnumba.layer_table
            if extents is None and check:
                extents = guard.raw_table_extents(name, info, first_layer + num_layers)
            if extents is None:  # a raw table, unchecked: nothing known about its layers
                return NO_LIMIT, None
            size = min(extents[first_layer:first_layer + num_layers])
            nbytes = size if nbytes is None or size < nbytes else nbytes
    else:
        nbytes = k.nbytes if v is None or k.nbytes <= v.nbytes else v.nbytes
    return bounds.token_limit(layout, nbytes, item_size, layout_dim, first_layer, num_layers, page_size, heads), nbytes


def _what(layout, k_name, v_name, nbytes, item_size, layout_dim, first_layer, num_layers):
    """Words for an index error: which buffers, and what bounds them."""
    names = k_name if v_name is None else f"{k_name}/{v_name}"
    if nbytes is None:
        return f"{names} (raw layer tables: layer sizes unknown)"
    if layout is TBL:
        return f"{names} (layer-first layers of {nbytes} bytes, item_size={item_size})"
    extra = ""
    if layout in (PF, PH):
        extra = f", layout_dim={layout_dim}" + (f", layer {first_layer}" if num_layers == 1 else "")
    return f"{names} ({_LAYOUT_NAMES[layout]}, {nbytes} bytes, item_size={item_size}{extra})"


def _run(src_layout, dst_layout, mla, buffers, indices, *, first_layer, num_layers, item_size, src_layout_dim=0,
         dst_layout_dim=0, page_size=1, head_num=1, launch_config, stream, check):
    """The checks every kernel entry point shares, then the launch, then (``check``) the flag.

    All argument checks run before the launch: on any error nothing is written. This runs on every
    call, so the common case is kept to plain attribute tests; messages are built only on error.
    """
    check = check or guard.ALWAYS_CHECK
    names = _names(src_layout, dst_layout, mla)
    src_k, dst_k, src_v, dst_v = buffers
    for name, info in zip(names, buffers):
        if info is None:
            continue
        if info.ptr & 7:
            validate.aligned(name, info)
        if not info.on_device:
            pinned.require(name, info)
    for name, info in ((names[1], dst_k), (names[3], dst_v)):
        if info is not None and isinstance(info.obj, np.ndarray) and not info.obj.flags.writeable:
            validate.writable(name, info)
    heads = head_num if (src_layout is PH or dst_layout is PH) else 1
    src_limit, src_bytes = _side_limit(src_layout, src_k, src_v, names[0], names[2], src_layout_dim, check,
                                       item_size, first_layer, num_layers, page_size, heads)
    dst_limit, dst_bytes = _side_limit(dst_layout, dst_k, dst_v, names[1], names[3], dst_layout_dim, check,
                                       item_size, first_layer, num_layers, page_size, heads)
    src_info, dst_info = indices
    count = src_info.shape[0]
    whats = (lambda: _what(src_layout, names[0], names[2], src_bytes, item_size, src_layout_dim, first_layer,
                           num_layers),
             lambda: _what(dst_layout, names[1], names[3], dst_bytes, item_size, dst_layout_dim, first_layer,
                           num_layers))
    if count and bounds.HOST_INDEX_CHECK:
        for name, info, limit, what in zip(("src_indices", "dst_indices"), indices, (src_limit, dst_limit), whats):
            if SIMULATOR or not info.on_device:
                bounds.check_indices(name, bounds.host_indices(info), limit, what)
    handle = _transfer(src_layout, dst_layout, mla, buffers, indices, first_layer=first_layer, num_layers=num_layers,
                       item_size=item_size, src_layout_dim=src_layout_dim, dst_layout_dim=dst_layout_dim,
                       page_size=page_size, head_num=head_num, launch_config=launch_config, stream=stream,
                       src_token_limit=src_limit, dst_token_limit=dst_limit,
                       error_flag=guard._address or guard.flag_address())
    if check and count:
        guard.synchronize(handle)
        if guard.flag_set():
            guard.clear()
            raise _skipped_error(indices, (src_limit, dst_limit), [what() for what in whats])


def _skipped_error(indices, limits, whats):
    """The error for ``check=True`` after the kernel skipped items: the first offending index (read back)."""
    for name, info, limit, what in zip(("src_indices", "dst_indices"), indices, limits, whats):
        values = bounds.host_indices(info)
        where = bounds.first_outside(values, 0, limit)
        if where is not None:
            bound = "any token >= 0" if limit >= NO_LIMIT else f"[0, {limit})"
            return IndexOutOfRangeError(
                f"{name}[{where}] = {int(values[where])} is out of range for {what}: valid tokens are {bound}; "
                "the kernel skipped the out-of-range items and copied the others")
    return IndexOutOfRangeError("the kernel skipped items with out-of-range token indices (flagged by another "
                                "call in flight?); the other items were copied")


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
                          num_warps_per_block=32, *, stream=None, check=False):
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

    Example
    -------
    >>> kvnumba.transfer_kv_per_layer(k_host, k_gpu, v_host, v_gpu, src_idx, dst_idx, 2048)  # doctest: +SKIP
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _run(LF, LF, False, buffers, indices, first_layer=0, num_layers=1, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, block_quota=2, num_warps_per_block=32, *, stream=None, check=False):
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
    block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0, maximum=validate.MAX_SIZE)
    item_size = validate.item_size(item_size)
    src_layout_dim = validate.layout_dim("src_layout_dim", src_layout_dim, item_size, layer_id + 1,
                                         layer_id=layer_id)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _run(PF, LF, False, buffers, indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, page_size, head_num, block_quota=2, num_warps_per_block=32, *,
                                stream=None, check=False):
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
    block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0, maximum=validate.MAX_SIZE)
    page_size = validate.integer("page_size", page_size, minimum=1, maximum=validate.MAX_SIZE)
    head_num = validate.integer("head_num", head_num, minimum=1, maximum=validate.MAX_SIZE)
    item_size = validate.item_size(item_size, head_num)
    src_layout_dim = validate.layout_dim("src_layout_dim", src_layout_dim, item_size, layer_id + 1, head_num,
                                         layer_id=layer_id)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k, dst_k, src_v, dst_v)
    _run(PH, LF, False, buffers, indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, page_size=page_size, head_num=head_num,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size, num_layers, block_quota=2, num_warps_per_block=32, *, stream=None, check=False):
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
    block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1, maximum=validate.MAX_SIZE)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, True, True, num_layers)
    _run(TBL, TBL, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, block_quota=2, num_warps_per_block=32, *, stream=None,
                                check=False):
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
    block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1, maximum=validate.MAX_SIZE)
    dst_layout_dim = validate.layout_dim("dst_layout_dim", dst_layout_dim, item_size, num_layers)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k, src_v_layers, dst_v, True, False, num_layers)
    _run(TBL, PF, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_all_layer_lf_ph(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, page_size, head_num, block_quota=2,
                                num_warps_per_block=32, *, stream=None, check=False):
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
    block_quota, num_warps_per_block, stream, check
        As in ``transfer_kv_per_layer``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument; nothing is written.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    page_size = validate.integer("page_size", page_size, minimum=1, maximum=validate.MAX_SIZE)
    head_num = validate.integer("head_num", head_num, minimum=1, maximum=validate.MAX_SIZE)
    item_size = validate.item_size(item_size, head_num)
    num_layers = validate.integer("num_layers", num_layers, minimum=1, maximum=validate.MAX_SIZE)
    dst_layout_dim = validate.layout_dim("dst_layout_dim", dst_layout_dim, item_size, num_layers, head_num)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _kv(src_k_layers, dst_k, src_v_layers, dst_v, True, False, num_layers)
    _run(TBL, PH, False, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, page_size=page_size, head_num=head_num,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=2, num_warps_per_block=32,
                              *, stream=None, check=False):
    """MLA: copy one layer's items between two layer-first buffers (one buffer, no V).

    ``dst[dst_indices[i]] = src[src_indices[i]]``; shapes as ``transfer_kv_per_layer``'s K.
    Raises ``TypeError``/``ValueError`` for a bad argument; nothing is written.
    ``check=True`` (keyword only) as in ``transfer_kv_per_layer``.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    indices = validate.indices(src_indices, dst_indices)
    _run(LF, LF, True, _mla(src, dst), indices, first_layer=0, num_layers=1, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                    block_quota=2, num_warps_per_block=32, *, stream=None, check=False):
    """MLA: load one layer from a page-first buffer ``[T, L, item]`` into a layer-first ``[T, item]``.

    ``dst[dst_indices[i]] = src[src_indices[i], layer_id]``; arguments as
    ``transfer_kv_per_layer_pf_lf``. Raises ``TypeError``/``ValueError``; nothing is written then.
    ``check=True`` (keyword only) as in ``transfer_kv_per_layer``.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    layer_id = validate.integer("layer_id", layer_id, minimum=0, maximum=validate.MAX_SIZE)
    item_size = validate.item_size(item_size)
    src_layout_dim = validate.layout_dim("src_layout_dim", src_layout_dim, item_size, layer_id + 1,
                                         layer_id=layer_id)
    indices = validate.indices(src_indices, dst_indices)
    _run(PF, LF, True, _mla(src, dst), indices, first_layer=layer_id, num_layers=1, item_size=item_size,
              src_layout_dim=src_layout_dim, launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                              block_quota=2, num_warps_per_block=32, *, stream=None, check=False):
    """MLA: copy every layer between two sets of layer-first buffers given as layer tables.

    ``dst_layer[l][dst_indices[i]] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer``. Raises ``TypeError``/``ValueError``; nothing is written then.
    ``check=True`` (keyword only) as in ``transfer_kv_per_layer``.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1, maximum=validate.MAX_SIZE)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _mla(src_layers, dst_layers, True, True, num_layers)
    _run(TBL, TBL, True, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              launch_config=(block_quota, warps), stream=stream, check=check)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers, block_quota=2, num_warps_per_block=32, *, stream=None, check=False):
    """MLA: back up every layer from layer-first buffers (a layer table) into a page-first ``[T, L, item]``.

    ``dst[dst_indices[i], l] = src_layer[l][src_indices[i]]``; arguments as
    ``transfer_kv_all_layer_lf_pf``. Raises ``TypeError``/``ValueError``; nothing is written then.
    ``check=True`` (keyword only) as in ``transfer_kv_per_layer``.
    """
    guard.raise_pending()
    block_quota, warps = validate.launch_config(block_quota, num_warps_per_block)
    item_size = validate.item_size(item_size)
    num_layers = validate.integer("num_layers", num_layers, minimum=1, maximum=validate.MAX_SIZE)
    dst_layout_dim = validate.layout_dim("dst_layout_dim", dst_layout_dim, item_size, num_layers)
    indices = validate.indices(src_indices, dst_indices)
    buffers = _mla(src_layers, dst, True, False, num_layers)
    _run(TBL, PF, True, buffers, indices, first_layer=0, num_layers=num_layers, item_size=item_size,
              dst_layout_dim=dst_layout_dim, launch_config=(block_quota, warps), stream=stream, check=check)
