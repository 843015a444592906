"""A NumPy reference for every entry point: the tests' oracle, and yours.

Written from the layout definitions, not from the kernels: each function computes the byte
offsets of every item it moves and copies them with NumPy fancy indexing. Same names and
arguments as ``kvnumba``'s entry points, with NumPy arrays for buffers and indices, and a list of
per-layer NumPy arrays wherever the GPU version takes a layer table (``*_layers``). Destinations
are written in place. Launch-shape arguments are accepted and ignored.

Byte offsets (``item`` = item_size, ``dim`` = layout_dim, P = page_size, H = head_num):
- layer-first buffer of one layer: token t at ``t * item``
- page-first ``[T, L, item]``: token t, layer l at ``t * dim + l * item``
- page-head ``[T/P, H, P, L, item/H]``: token t, layer l, head h at
  ``(t // P) * P * dim + h * (P * dim // H) + (t % P) * (dim // H) + l * (item // H)``
- copy-engine functions (``*_direct*``): lists of per-layer arrays, rows of dim 0 are tokens;
  page-first-direct ``[num_pages, num_layers, P, ...]``: page p, layer l is one slot of P rows

FP8 (``kv.Fp8View``): ``quantise`` and ``dequantise`` are ``kvnumba.quant_reference``'s (whose docstring
is the format, byte for byte), and ``copy`` with an ``Fp8View`` on either side quantises, dequantises or
copies codes and scales as ``kv.copy`` does (``kvnumba.quant_reference.copy``).
"""
import numpy as np

from . import quant_reference
from .quant_reference import dequantise, quantise

__all__ = [
    "transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf", "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf", "transfer_kv_all_layer_lf_ph", "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf",
    "copy", "quantise", "dequantise", "layer_first_offsets", "page_first_offsets", "page_head_offsets",
]


def _bytes(array, name):
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return array.reshape(-1).view(np.uint8)


def _tokens(indices, name):
    indices = np.asarray(indices)
    if indices.dtype != np.int64 or indices.ndim != 1:
        raise TypeError(f"{name} must be a 1-D int64 array, got {indices.dtype} with shape {indices.shape}")
    return indices


def _copy(src, src_offsets, dst, dst_offsets, nbytes):
    """dst bytes [dst_offsets[i], +nbytes) = src bytes [src_offsets[i], +nbytes), in order."""
    src_bytes, dst_bytes = _bytes(src, "src"), _bytes(dst, "dst")
    span = np.arange(nbytes, dtype=np.int64)
    dst_bytes[dst_offsets[:, None] + span] = src_bytes[src_offsets[:, None] + span]


def layer_first_offsets(tokens, item_size):
    return tokens * item_size


def page_first_offsets(tokens, layer, item_size, layout_dim):
    return tokens * layout_dim + layer * item_size


def page_head_offsets(tokens, layer, head, item_size, layout_dim, page_size, head_num):
    pages, slots = np.divmod(tokens, page_size)
    return (pages * page_size * layout_dim + head * (page_size * layout_dim // head_num)
            + slots * (layout_dim // head_num) + layer * (item_size // head_num))


def _pairs(k, v):
    """The (source, destination) pairs to copy: K's, and V's unless it is None (MLA: one buffer, no V)."""
    return (k,) if v[0] is None else (k, v)


def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size, block_quota=2,
                          num_warps_per_block=32):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    for src, dst in _pairs((src_k, dst_k), (src_v, dst_v)):
        _copy(src, layer_first_offsets(s, item_size), dst, layer_first_offsets(d, item_size), item_size)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, block_quota=2, num_warps_per_block=32):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    for src, dst in _pairs((src_k, dst_k), (src_v, dst_v)):
        _copy(src, page_first_offsets(s, layer_id, item_size, src_layout_dim),
              dst, layer_first_offsets(d, item_size), item_size)


def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, page_size, head_num, block_quota=2, num_warps_per_block=32):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    head_bytes = item_size // head_num
    for src, dst in _pairs((src_k, dst_k), (src_v, dst_v)):
        for head in range(head_num):
            _copy(src, page_head_offsets(s, layer_id, head, item_size, src_layout_dim, page_size, head_num),
                  dst, layer_first_offsets(d, item_size) + head * head_bytes, head_bytes)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size, num_layers, block_quota=2, num_warps_per_block=32):
    for layer in range(num_layers):
        transfer_kv_per_layer(src_k_layers[layer], dst_k_layers[layer], src_v_layers[layer], dst_v_layers[layer],
                              src_indices, dst_indices, item_size)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, block_quota=2, num_warps_per_block=32):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    for layer in range(num_layers):
        for src, dst in _pairs((src_k_layers[layer], dst_k), (src_v_layers[layer], dst_v)):
            _copy(src, layer_first_offsets(s, item_size),
                  dst, page_first_offsets(d, layer, item_size, dst_layout_dim), item_size)


def transfer_kv_all_layer_lf_ph(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, page_size, head_num, block_quota=2,
                                num_warps_per_block=32):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    head_bytes = item_size // head_num
    for layer in range(num_layers):
        for src, dst in _pairs((src_k_layers[layer], dst_k), (src_v_layers[layer], dst_v)):
            for head in range(head_num):
                _copy(src, layer_first_offsets(s, item_size) + head * head_bytes,
                      dst, page_head_offsets(d, layer, head, item_size, dst_layout_dim, page_size, head_num),
                      head_bytes)


# MLA: K's arithmetic, with no V.

def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=2, num_warps_per_block=32):
    transfer_kv_per_layer(src, dst, None, None, src_indices, dst_indices, item_size)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                    block_quota=2, num_warps_per_block=32):
    transfer_kv_per_layer_pf_lf(src, dst, None, None, src_indices, dst_indices, layer_id, item_size, src_layout_dim)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                              block_quota=2, num_warps_per_block=32):
    none = [None] * num_layers
    transfer_kv_all_layer(src_layers, dst_layers, none, none, src_indices, dst_indices, item_size, num_layers)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers, block_quota=2, num_warps_per_block=32):
    transfer_kv_all_layer_lf_pf(src_layers, dst, [None] * num_layers, None, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers)


# Copy-engine entry points: lists of per-layer arrays; rows of dim 0 are tokens on the layer-first
# side; page-first-direct buffers are [num_pages, num_layers, page_size, ...].

def _rows(array):
    """A C-contiguous array as bytes, one row per slot of dim 0 (a view: writes go through)."""
    flat = _bytes(array, "buffer")
    return flat.reshape(np.asarray(array).shape[0], -1)


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    for src, dst in zip(src_layers, dst_layers):
        dst_rows, src_rows = _rows(dst), _rows(src)
        for i in range(len(s)):  # token by token, in order
            dst_rows[d[i]] = src_rows[s[i]]


def _page_slots(page_first):
    """[num_pages, num_layers, page_size, ...] as bytes [num_pages, num_layers, page_size, token bytes]."""
    array = np.asarray(page_first)
    return _bytes(array, "page-first buffer").reshape(array.shape[0], array.shape[1], array.shape[2], -1)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    num_layers = len(dst_ptrs) // len(src_ptrs)  # MLA: one source, L layers; else K and V halves
    for page in range(len(s) // page_size):
        src_page, dst_token = s[page * page_size] // page_size, d[page * page_size]
        for kv, page_first in enumerate(src_ptrs):
            for j in range(num_layers):
                _rows(dst_ptrs[kv * num_layers + j])[dst_token:dst_token + page_size] = \
                    _page_slots(page_first)[src_page, layer_id + j]


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    s, d = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    num_layers = len(src_ptrs) // len(dst_ptrs)
    for page in range(len(s) // page_size):
        src_token, dst_page = s[page * page_size], d[page * page_size] // page_size
        for kv, page_first in enumerate(dst_ptrs):
            for j in range(num_layers):
                _page_slots(page_first)[dst_page, j] = \
                    _rows(src_ptrs[kv * num_layers + j])[src_token:src_token + page_size]


# --- cache views (kv.copy) -------------------------------------------------------------------------

def copy(src_view, dst_view, src_indices, dst_indices, layers=None):
    """``kv.copy`` on views over NumPy arrays, from each view's NumPy picture of its layout
    (``CacheView.logical``), not from the kernels' address arithmetic: for every layer and for K and
    V, destination token ``dst_indices[i]`` (page ``t // P``, slot ``t % P``) gets source token
    ``src_indices[i]``'s item, byte for byte. Destinations are written in place.

    With a ``kv.Fp8View`` on either side, ``kvnumba.quant_reference.copy``: a plain view into an FP8 view
    quantises, an FP8 view into a plain view dequantises, FP8 into FP8 copies codes and scales.
    """
    from .api.fp8_views import Fp8View
    from .plan.copy_plan import copy_window

    src_indices, dst_indices = _tokens(src_indices, "src_indices"), _tokens(dst_indices, "dst_indices")
    if isinstance(src_view, Fp8View) or isinstance(dst_view, Fp8View):
        quant_reference.copy(src_view, dst_view, src_indices, dst_indices, layers)
        return
    first, count = copy_window(src_view, dst_view, layers)  # kv.copy's rule: layers=None needs equal layer counts
    for which in ("k",) if src_view.mla else ("k", "v"):
        for layer in range(first, first + count):
            src = _item_bytes(src_view.layer_items(which, layer))
            dst = _item_bytes(dst_view.layer_items(which, layer))
            values = src[src_indices // src.shape[1], src_indices % src.shape[1]]
            dst[dst_indices // dst.shape[1], dst_indices % dst.shape[1]] = values.reshape(
                (len(dst_indices),) + dst.shape[2:])


def _item_bytes(items):
    """``[pages, P, *item]`` as bytes, still a view of the buffer: ``[pages, P, ..., last * itemsize]``."""
    return np.asarray(items).view(np.uint8)
