"""The seed's three copy-engine entry points: memcpy paths, no kernels.

- ``transfer_kv_direct``: layer-first to layer-first; runs of indices where source and destination
  both advance by one are merged, one ``cudaMemcpyAsync`` per run per layer.
- ``transfer_kv_per_layer_direct_pf_lf`` / ``transfer_kv_all_layer_direct_lf_pf``: between
  layer-first buffers and page-first-direct buffers ``[num_pages, num_layers, page_size, ...]``;
  one copy per (page, layer, K/V), all submitted as one ``cudaMemcpyBatchAsync`` where the
  driver, binding and stream allow it, else page by page (see ``kvnumba.driver.batch_copy``).

Indices may live on the host or the device; like the seed, they are brought to the host first
(a synchronous device-to-host copy for device indices). Address arithmetic is vectorised with
NumPy; ``last_path()`` says which path the last batched call took.
"""
import numpy as np

from ..checks import bounds

from ..checks import guard

from ..checks import validate
from ..driver.batch_copy import CopyError, batch_copy_available, copy_many, log, runtime
from ..driver.streams import stream_handle

__all__ = [
    "CopyError",
    "batch_copy_available",
    "last_path",
    "path_counts",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
]


def last_path():
    """How the last non-empty call copied (None before any): ``"batch"`` (one cudaMemcpyBatchAsync),
    ``"page"`` (page by page), or ``"runs"`` (``transfer_kv_direct``)."""
    return log.last


def path_counts():
    """``{"batch": n, "page": m, "runs": k}``: non-empty calls per path since import."""
    return dict(log.counts)


def _host_indices(info):
    """The indices as a host NumPy int64 array (torch ``.cpu()``, CuPy ``.get()``, Numba ``copy_to_host``)."""
    return bounds.host_indices(info)


def _uses_torch(*groups):
    return any(info.is_torch for group in groups for info in group)


def _device_ptr(info):
    return info.ptr if info.on_device else None


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size, *, stream=None, check=False):
    """Copy tokens between per-layer buffers with ``cudaMemcpyAsync``, merging runs of indices.

    ``dst_layers[j][dst_indices[i]] = src_layers[j][src_indices[i]]`` for every layer j and index i.
    Rows of dim 0 are tokens; a run of indices where source and destination both advance by one is
    one copy of ``run_length * row_bytes`` bytes per layer (``row_bytes = nbytes / shape[0]``).

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
        CUDA stream (keyword only); default: torch's current stream for torch tensors, else the
        default stream.
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

    Example
    -------
    >>> kvnumba.transfer_kv_direct(host_layers, gpu_layers, src_idx, dst_idx, page_size=64)  # doctest: +SKIP
    """
    guard.raise_pending()
    src = validate.buffer_list("src_layers", src_layers, minimum=0)
    dst = validate.buffer_list("dst_layers", dst_layers, minimum=0)
    if len(src) != len(dst):
        raise ValueError(f"src_layers and dst_layers must have the same number of layers, "
                         f"got {len(src)} and {len(dst)}")
    for j, (s, d) in enumerate(zip(src, dst)):
        if validate.row_bytes(s) != validate.row_bytes(d):
            raise ValueError(f"src_layers[{j}] and dst_layers[{j}] must have the same bytes per row, "
                             f"got {validate.row_bytes(s)} and {validate.row_bytes(d)}")
        validate.same_dtype([(f"src_layers[{j}]", s), (f"dst_layers[{j}]", d)])
    src_info, dst_info = validate.indices(src_indices, dst_indices)
    count = src_info.shape[0]
    validate.page_size(page_size, count)
    handle = stream_handle(stream, _uses_torch(src, dst, (src_info, dst_info)))
    if count == 0 or not src:
        return
    s_idx, d_idx = _host_indices(src_info), _host_indices(dst_info)
    bounds.check_indices("src_indices", s_idx, min(i.shape[0] for i in src), "the rows of src_layers")
    bounds.check_indices("dst_indices", d_idx, min(i.shape[0] for i in dst), "the rows of dst_layers")

    # Runs: a new run starts wherever either side does not advance by exactly one.
    breaks = np.flatnonzero((np.diff(s_idx) != 1) | (np.diff(d_idx) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [count])))
    rows = np.array([validate.row_bytes(i) for i in src], dtype=np.int64)
    src_base = np.array([i.ptr for i in src], dtype=np.int64)
    dst_base = np.array([i.ptr for i in dst], dtype=np.int64)
    # (run, layer), runs outer as in the seed.
    srcs = src_base[None, :] + s_idx[starts, None] * rows[None, :]
    dsts = dst_base[None, :] + d_idx[starts, None] * rows[None, :]
    sizes = lengths[:, None] * rows[None, :]
    rt = runtime()
    for index, (d, s, n) in enumerate(zip(dsts.ravel().tolist(), srcs.ravel().tolist(), sizes.ravel().tolist())):
        try:
            rt.memcpy(d, s, n, handle)
        except CopyError as error:
            raise CopyError(f"run copy {index} of {dsts.size}: {error}", error.error, index) from None
    log.record("runs")
    if guard.checks_on(check):
        guard.synchronize(handle)


def _layer_first(name, obj, is_mla):
    infos = validate.buffer_list(name, obj, minimum=1 if is_mla else 2)
    if not is_mla and len(infos) % 2:
        raise ValueError(f"{name} must hold K layers then V layers (an even count), got {len(infos)}")
    row = validate.row_bytes(infos[0])
    for i, info in enumerate(infos[1:], 1):
        if validate.row_bytes(info) != row:
            raise ValueError(f"{name}[{i}] has {validate.row_bytes(info)} bytes per token, {name}[0] has {row}")
    return infos, row


def _page_first(name, obj):
    infos = validate.buffer_list(name, obj)
    if len(infos) not in (1, 2):
        raise ValueError(f"{name} must hold 2 page-first buffers (K, V) or 1 (MLA), got {len(infos)}")
    for i, info in enumerate(infos):
        if len(info.shape) < 3:
            raise ValueError(f"{name}[{i}] must be [num_pages, num_layers, page_size, ...], got shape {info.shape}")
        if 0 in info.shape[:3]:
            raise ValueError(f"{name}[{i}] must have at least one page, layer and slot, got shape {info.shape}")
    if len(infos) == 2 and (infos[0].shape != infos[1].shape):
        raise ValueError(f"{name}[0] and {name}[1] must have the same shape, got {infos[0].shape} and {infos[1].shape}")
    return infos


def _page_first_direct(lf_name, lf_obj, pf_name, pf_obj, lf_idx_name, pf_idx_name, src_indices, dst_indices,
                       start_layer, page_size, stream, lf_to_pf, check):
    """The seed's ``transfer_kv_page_first_direct_impl``: validate, build addresses, copy."""
    guard.raise_pending()
    pf = _page_first(pf_name, pf_obj)
    is_mla = len(pf) == 1
    lf, row = _layer_first(lf_name, lf_obj, is_mla)
    num_layers = len(lf) if is_mla else len(lf) // 2
    validate.same_dtype([(f"{pf_name}[{i}]", info) for i, info in enumerate(pf)]
                        + [(f"{lf_name}[{i}]", info) for i, info in enumerate(lf)])
    src_info, dst_info = validate.indices(src_indices, dst_indices)
    count = src_info.shape[0]
    page_size = validate.page_size(page_size, count)
    pages_total, layers_total, slots = pf[0].shape[:3]
    if slots != page_size:
        raise ValueError(f"{pf_name}[0] must be [num_pages, num_layers, page_size={page_size}, ...], "
                         f"got shape {pf[0].shape}")
    layer_bytes = pf[0].nbytes // (pages_total * layers_total)  # one (page, layer) slot
    if layer_bytes != page_size * row:
        raise ValueError(f"{pf_name}[0] holds {layer_bytes // page_size} bytes per token, {lf_name} {row}: "
                         "the per-token bytes must match")
    if start_layer is not None:
        start_layer = validate.integer("layer_id", start_layer, minimum=0)
    first_layer = start_layer or 0
    if first_layer + num_layers > layers_total:
        what = f"layer_id={first_layer} + " if start_layer is not None else ""
        raise ValueError(f"{what}{num_layers} layers in {lf_name} exceed the {layers_total} layers of {pf_name}")
    uses_torch = _uses_torch(lf, pf, (src_info, dst_info))
    handle = stream_handle(stream, uses_torch)
    if count == 0:
        return

    lf_info, pf_info = (src_info, dst_info) if lf_to_pf else (dst_info, src_info)
    first = np.arange(0, count, page_size)
    tokens = _host_indices(lf_info)[first]  # first token of each page on the layer-first side
    pages_raw = _host_indices(pf_info)[first]
    bounds.check_indices(lf_idx_name, tokens, max(min(i.shape[0] for i in lf) - page_size + 1, 0),
                         f"the first token of a page of {page_size} tokens in {lf_name}", positions=first)
    bounds.check_indices(pf_idx_name, pages_raw, pages_total * page_size, f"the {pages_total} pages of {pf_name}",
                         positions=first)
    pages = pages_raw // page_size

    copy_bytes = page_size * row
    layers = np.arange(first_layer, first_layer + num_layers, dtype=np.int64)
    kinds = len(pf)  # K and V, or MLA's one
    lf_base = np.array([info.ptr for info in lf], dtype=np.int64).reshape(kinds, num_layers)
    pf_base = np.array([info.ptr for info in pf], dtype=np.int64)
    # Addresses shaped (page, layer, K/V): the seed's order, pages outer.
    lf_addr = lf_base.T[None, :, :] + (tokens * row)[:, None, None]
    pf_addr = (pf_base[None, None, :] + (pages * layers_total * layer_bytes)[:, None, None]
               + (layers * layer_bytes)[None, :, None])
    lf_addr, pf_addr = lf_addr.ravel(), pf_addr.ravel()
    sizes = np.full(lf_addr.size, copy_bytes, dtype=np.int64)
    if lf_to_pf:
        srcs, dsts, src_side, dst_side = lf_addr, pf_addr, lf[0], pf[0]
    else:
        srcs, dsts, src_side, dst_side = pf_addr, lf_addr, pf[0], lf[0]
    copy_many(dsts, srcs, sizes, handle, src_device_ptr=_device_ptr(src_side), dst_device_ptr=_device_ptr(dst_side))
    if guard.checks_on(check):
        guard.synchronize(handle)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size, *,
                                       stream=None, check=False):
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
    stream : optional
        CUDA stream (keyword only); default: torch's current stream for torch tensors, else the
        default stream (where the batch call is never used).
    check : bool
        Keyword only. Wait for the copies (synchronise the stream) before returning; also on with
        ``KVNUMBA_CHECK=1``. Indices are always checked on the host here.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written.
    CopyError
        If the batch call fails (naming the failing copy when the runtime reports it) or a page
        copy fails.

    Notes
    -----
    Host time is mostly the runtime's own: ~0.9 us per copy inside ``cudaMemcpyBatchAsync`` on the
    H200 (8192 copies: 8.8 ms per call, 7 ms of it in the call; see ``kvnumba.driver.batch_copy``); the
    page-by-page fallback costs a few microseconds per copy.

    Example
    -------
    >>> kvnumba.transfer_kv_per_layer_direct_pf_lf([k_host, v_host], [k_gpu, v_gpu], src_idx, dst_idx,
    ...                                            layer_id=3, page_size=64, stream=side)  # doctest: +SKIP
    """
    _page_first_direct("dst_ptrs", dst_ptrs, "src_ptrs", src_ptrs, "dst_indices", "src_indices", src_indices,
                       dst_indices, layer_id, page_size, stream, lf_to_pf=False, check=check)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size, *, stream=None,
                                       check=False):
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
    stream, check : optional
        As in ``transfer_kv_per_layer_direct_pf_lf``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (named in the message); nothing is written.
    CopyError
        If the batch call or a page copy fails.

    Notes
    -----
    Host time is mostly the runtime's own: ~0.9 us per copy inside ``cudaMemcpyBatchAsync`` on the
    H200 (8192 copies: 8.8 ms per call, 7 ms of it in the call; see ``kvnumba.driver.batch_copy``); the
    page-by-page fallback costs a few microseconds per copy.

    Example
    -------
    >>> kvnumba.transfer_kv_all_layer_direct_lf_pf(k_layers + v_layers, [k_host, v_host], src_idx, dst_idx,
    ...                                            page_size=64, stream=side)  # doctest: +SKIP
    """
    _page_first_direct("src_ptrs", src_ptrs, "dst_ptrs", dst_ptrs, "src_indices", "dst_indices", src_indices,
                       dst_indices, None, page_size, stream, lf_to_pf=True, check=check)
