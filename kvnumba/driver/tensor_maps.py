"""Tensor maps of a load's source buffers, for the staged kernel's bulk copies (``kernels.staged``).

A tensor map tells the bulk-copy unit how a buffer is laid out (sizes and byte strides of up to five
dimensions) and what box one copy moves. kvnumba describes each source layout as five dimensions,
the innermost the 8-byte words of one row of at most 2 KB (a box may not be wider than 256 elements):

- layer-first and page-first (token-major): ``[row words, rows per item, layers, tokens, 1]``; a box
  is every row of ``2**r`` consecutive tokens of one layer, stored token by token;
- page-head (head-major): ``[head words, layers, tokens of a page, heads, pages]``; a box is every
  head of ``2**r`` consecutive tokens of one page and layer, stored head by head.

One map per box length ``2**r`` (``r <= max_run_log2``), for K then V: the box is part of the map.
On the GPU they are ``cuTensorMapEncodeTiled`` maps in device memory; on the simulator, kvnumba's own
16-word form that ``kernels.tma.tensor_load`` reads (base, five sizes, four byte strides, five box
sizes). ``source_maps`` returns None when a layout or size cannot be described (the register kernel
then does the load).
"""
import numpy as np

from ..kernels import staged
from ..kernels.layouts import LAYER_FIRST, PAGE_HEAD
from .target import SIMULATOR

MAX_BOX = 256  # elements per box dimension
L2_PROMOTION = "L2_256B"  # CUtensorMapL2promotion: how much L2 fetches per miss (tuning scripts set others)
MAX_STRIDE = 1 << 40


class SourceMaps:
    """The maps of one source (K and V), where the kernel reads them, and the kernel's extra arguments."""

    def __init__(self, storage, address, map_heads, max_run_log2, min_run):
        self.storage = storage  # keeps the maps' memory alive
        self.args = (address, map_heads, max_run_log2, min_run)  # the staged kernel's last four parameters


def geometry(layout, nbytes, item_size, layout_dim, page_size, heads):
    """``(sizes, strides, rows per item or heads, head_major)`` of the five-dimension picture of one
    source buffer, or None if the bulk-copy unit cannot read it so."""
    if item_size % 16:
        return None
    if layout is PAGE_HEAD:
        chunk = item_size // heads
        if chunk % 16 or chunk // 8 > MAX_BOX or heads > MAX_BOX or layout_dim % (16 * heads):
            return None
        page_bytes = page_size * layout_dim
        pages = nbytes // page_bytes
        if pages == 0 or nbytes % page_bytes:
            return None
        sizes = (chunk // 8, layout_dim // item_size, page_size, heads, pages)
        strides = (chunk, layout_dim // heads, page_bytes // heads, page_bytes)
        return sizes, strides, heads, True
    rows = next((r for r in range(1, item_size // 16 + 1)
                 if item_size % r == 0 and (item_size // r) % 16 == 0 and item_size // r // 8 <= MAX_BOX), None)
    if rows is None or rows > MAX_BOX:
        return None
    row = item_size // rows
    if layout is LAYER_FIRST:
        layers, token_bytes = 1, item_size
    else:
        if layout_dim % 16 or layout_dim < item_size:
            return None
        layers, token_bytes = layout_dim // item_size, layout_dim
    tokens = nbytes // token_bytes
    if tokens == 0 or nbytes % token_bytes:
        return None
    sizes = (row // 8, rows, layers, tokens, 1)
    strides = (row, item_size, token_bytes, token_bytes * tokens)
    return sizes, strides, rows, False


def _box(sizes, head_major, run):
    if head_major:
        return (sizes[0], 1, run, sizes[3], 1)
    return (sizes[0], sizes[1], 1, run, 1)


def source_maps(layout, k_ptr, v_ptr, nbytes, item_size, layout_dim, page_size, heads, mla, device, ring):
    """``SourceMaps`` for a staged load from ``layout`` buffers at ``k_ptr``/``v_ptr`` (``nbytes`` each,
    at least) through ``ring`` (``kernels.staged.StagedShape``), or None when the layout, sizes or
    addresses do not suit the bulk-copy unit."""
    picture = geometry(layout, nbytes, item_size, layout_dim, page_size, heads)
    buffers = (k_ptr,) if mla else (k_ptr, v_ptr)
    if picture is None or any(p % 16 for p in buffers) or item_size * len(buffers) > ring.stage_bytes:
        return None
    sizes, strides, map_heads, head_major = picture
    if any(s >= MAX_STRIDE for s in strides):
        return None
    max_run_log2, min_run = staged.run_limits(item_size, mla, ring)
    if head_major:  # a piece never crosses a page
        while (1 << max_run_log2) > page_size:
            max_run_log2 -= 1
        min_run = min(min_run, 1 << max_run_log2)
    boxes = [_box(sizes, head_major, 1 << r) for r in range(max_run_log2 + 1)]
    if SIMULATOR:
        words = np.zeros((len(buffers), len(boxes), 16), dtype=np.int64)
        for b, base in enumerate(buffers):
            for r, box in enumerate(boxes):
                words[b, r, :15] = (base, *sizes, *strides, *box)
        return SourceMaps(words, words.ctypes.data, map_heads, max_run_log2, min_run)
    encoded = np.stack([[_encode(base, sizes, strides, box) for box in boxes] for base in buffers])
    from numba import cuda

    from .devices import on_device

    with on_device(device):
        storage = cuda.to_device(encoded)
    return SourceMaps(storage, storage.device_ctypes_pointer.value, map_heads, max_run_log2, min_run)


def _encode(base, sizes, strides, box):
    from .bindings import check, cu

    tensor_map = check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT64, 5, base, [cu.cuuint64_t(n) for n in sizes],
        [cu.cuuint64_t(n) for n in strides], [cu.cuuint32_t(n) for n in box], [cu.cuuint32_t(1)] * 5,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{L2_PROMOTION}"),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return np.array(tensor_map.opaque, dtype=np.uint64)


def compute_capability(device):
    """``(major, minor)`` of GPU ``device``."""
    from .bindings import check, cu

    attribute = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
                  "cuDeviceGetAttribute")
    minor = check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
                  "cuDeviceGetAttribute")
    return int(major), int(minor)
