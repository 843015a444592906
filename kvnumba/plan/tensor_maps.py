"""Tensor maps of a load's source buffers, for the staged kernel's bulk copies (``kernels.staged``).

A tensor map tells the bulk-copy unit a buffer's layout (sizes and byte strides of up to five dimensions)
and the box one copy moves. Each source layout declares its picture in five dimensions, the innermost the
8-byte words of one row of at most 2 KB (a box is at most 256 elements wide; ``LayoutParts.map_geometry``):

- layer-first and page-first: ``[row words, rows per item, layers, tokens, 1]``; a box is ``2**r``
  consecutive tokens of one layer;
- page-head: ``[head words, layers, heads, tokens of a page, pages]``; a box is every head of ``2**r``
  consecutive tokens of one page and layer; SGLang's page-unified pool is pictured so too, its head groups
  as the heads (``kvnumba.layouts.page_unified``).

One map per box length the kernel uses, for K then V. The maps live in pinned host memory (``MapStore``),
which the bulk-copy unit reads as fast as device memory, so a new plan's maps cost no device allocation or
copy. On the simulator they are kvnumba's own 16-word form that ``kernels.tma.tensor_load`` reads.
``source_maps`` returns None for what cannot be described (the register kernel then loads).
"""
import ctypes
import threading
import weakref

import numpy as np

from .. import config
from ..kernels.layouts import LAYER_FIRST, MAX_BOX
from ..driver.devices import attribute
from ..driver.target import SIMULATOR
from ..memo import BoundedMemo

L2_PROMOTION = "L2_256B"  # CUtensorMapL2promotion: how much L2 fetches per miss (config's l2_promotion: others)
MAX_STRIDE = 1 << 40
MAP_BYTES = 128  # one CUtensorMap (the simulator's form is 16 int64 words: the same size)


class SourceMaps:
    """The maps of one source (K and V) and the staged kernel's last three parameters, ``args``: ``(address,
    max_run_log2, min_run)``, where ``address + r * MAP_BYTES`` is K's map of box length ``2**r`` and V's follow
    ``(max_run_log2 + 1) * MAP_BYTES`` later (``address`` may point before the block: only the lengths in use
    are stored). The block goes back to its store when this object is gone."""

    def __init__(self, block, args, store):
        self.block = block
        self.args = args
        weakref.finalize(self, store.retire, block)


class MapStore:
    """Blocks of ``BLOCK_MAPS`` maps in pinned host memory (the GPU reads them in place).

    A retired block is reused only after every device has been synchronised (a kernel launched before its
    plan went away may still read it): when the free blocks run out and at least ``RECYCLE_AT`` are retired,
    one ``synchronize_all`` frees them; otherwise a new slab is allocated."""

    BLOCK_MAPS = 16  # 2 * (max_run_log2 + 1) <= 12 for every ring kvnumba builds
    SLAB_BLOCKS = 256  # 512 KiB of pinned memory a slab
    RECYCLE_AT = 64

    def __init__(self):
        # Reentrant: ``retire`` runs from a ``SourceMaps`` finalizer, which the garbage collector may call on
        # this thread while ``take`` holds the lock (a slab's allocation can start a collection).
        self._lock = threading.RLock()
        self._slabs = []  # keeps the memory alive
        self._free = []  # block addresses
        self._retired = []

    def take(self):
        with self._lock:
            if not self._free:
                self._refill()
            return self._free.pop()

    def retire(self, block):
        with self._lock:
            self._retired.append(block)

    def _refill(self):
        if len(self._retired) >= self.RECYCLE_AT:
            retired, self._retired = self._retired, []  # blocks retired from here on wait for the next round
            if not SIMULATOR:  # simulated launches are synchronous
                from ..driver.devices import synchronize_all

                synchronize_all()
            self._free = retired
            return
        nbytes = self.SLAB_BLOCKS * self.BLOCK_MAPS * MAP_BYTES
        if SIMULATOR:
            slab = np.zeros(nbytes // 8 + 16, np.int64)
        else:
            from numba import cuda

            slab = cuda.pinned_array(nbytes // 8 + 16, np.int64)  # page-aligned
        self._slabs.append(slab)
        start = (slab.ctypes.data + 127) & ~127
        block_bytes = self.BLOCK_MAPS * MAP_BYTES
        self._free.extend(start + i * block_bytes for i in reversed(range(self.SLAB_BLOCKS)))


STORE = MapStore()  # where maps go (config's map_store: another, e.g. a small one for tests)


def layer_part(layout, ptrs, nbytes, layer, layout_dim, tokens, item_size):
    """``(ptrs, nbytes)`` of the part of a source that a staged kernel's maps picture for a load of layer
    ``layer``: of a layer-first buffer, that layer's ``tokens`` items (a layer is no coordinate of its map);
    of any other layout, its buffers whole. An address of 0 (no V) stays 0."""
    if layout is not LAYER_FIRST:
        return ptrs, nbytes
    return [p + layer * layout_dim if p else 0 for p in ptrs], tokens * item_size


def geometry(layout, nbytes, item_size, layout_dim, page_size, heads):
    """``(sizes, strides, runs, head_major)``: the five-dimension picture of one source buffer that its layout
    declares (``LayoutParts.map_geometry``), or None if the bulk-copy unit cannot read it so."""
    if layout.map_geometry is None or item_size % 16:
        return None
    picture = layout.map_geometry(nbytes, item_size, layout_dim, page_size, heads)
    if picture is None or picture[0][0] > MAX_BOX or picture[2] > MAX_BOX:  # a box spans a run's words, every run
        return None
    return (*picture, layout.head_major)


def source_maps(layout, k_ptr, v_ptr, nbytes, item_size, layout_dim, page_size, heads, mla, run_limits,
                stage_bytes):
    """``SourceMaps`` for a staged load from ``layout`` buffers at ``k_ptr``/``v_ptr`` (``nbytes`` each, at
    least), with pieces within ``run_limits`` (``(max_log2, min_run)``) in stages of ``stage_bytes``, or None
    when the layout, sizes or addresses do not suit the bulk-copy unit."""
    picture = geometry(layout, nbytes, item_size, layout_dim, page_size, heads)
    buffers = (k_ptr,) if mla else (k_ptr, v_ptr)
    if picture is None or any(p % 16 for p in buffers) or item_size * len(buffers) > stage_bytes:
        return None
    sizes, strides, _, head_major = picture
    if any(s >= MAX_STRIDE for s in strides):
        return None
    max_run_log2, min_run = piece_limits(run_limits, head_major, page_size)
    min_log2 = min_run.bit_length() - 1
    store = config.tuning("map_store") or STORE
    block = store.take()
    address = block - min_log2 * MAP_BYTES  # the kernel adds r * MAP_BYTES (and V's offset)
    write = _write_simulated if SIMULATOR else _write_encoded
    promotion = config.tuning("l2_promotion") or L2_PROMOTION
    for b, base in enumerate(buffers):
        for r in range(min_log2, max_run_log2 + 1):
            box = (sizes[0], 1, sizes[2], 1 << r, 1) if head_major else (sizes[0], sizes[1], 1, 1 << r, 1)
            write(address + (b * (max_run_log2 + 1) + r) * MAP_BYTES, base, sizes, strides, box, promotion)
    return SourceMaps(block, (address, max_run_log2, min_run), store)


def piece_limits(run_limits, head_major, page_size):
    """``(max_run_log2, min_run)`` of the pieces a load takes: ``run_limits`` (the kernel's), cut so that a
    head-major (page-head) piece never crosses a page."""
    max_run_log2, min_run = run_limits
    if head_major:
        while (1 << max_run_log2) > page_size:
            max_run_log2 -= 1
        min_run = min(min_run, 1 << max_run_log2)
    return max_run_log2, min_run


def _write_simulated(at, base, sizes, strides, box, promotion):  # the simulator has no L2 promotion
    words = (ctypes.c_int64 * 16).from_address(at)
    words[:15] = [base, *sizes, *strides, *box]
    words[15] = 0


_encode_args = BoundedMemo(4096)  # (sizes, strides, box, promotion) -> the driver call's prepared arguments


def _write_encoded(at, base, sizes, strides, box, promotion):
    from ..driver.bindings import check, cu

    key = (sizes, strides, box, promotion)
    args = _encode_args.get(key)
    if args is None:
        args = _encode_args.remember(key, (
            [cu.cuuint64_t(n) for n in sizes], [cu.cuuint64_t(n) for n in strides], [cu.cuuint32_t(n) for n in box],
            [cu.cuuint32_t(1)] * 5, cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
            getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}"),
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    tensor_map = check(cu.cuTensorMapEncodeTiled(cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT64, 5, base,
                                                 *args), "cuTensorMapEncodeTiled")
    ctypes.memmove(at, tensor_map.getPtr(), MAP_BYTES)


def compute_capability(device):
    return attribute(device, "COMPUTE_CAPABILITY_MAJOR"), attribute(device, "COMPUTE_CAPABILITY_MINOR")


def shared_limit(device):
    """The most dynamic shared memory one block of GPU ``device`` may ask for, in bytes (99 KiB on sm_120)."""
    return attribute(device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
