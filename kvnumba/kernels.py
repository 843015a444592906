"""The kernel factory: one memoised CUDA kernel per (source layout, destination layout, MLA).

One body serves every pair. The factory closes over the two address functions (``layouts``) and
the MLA flag; Numba treats closure variables as compile-time constants, so each kernel is as
specialised as the seed's C++ template instances. Kernels take plain integers only (addresses,
counts, sizes): array arguments cost microseconds of host time per launch.

Work split, as in the seed: warp ``w`` copies items ``[w * items_per_warp, (w + 1) * items_per_warp)``
(an item is one token index), every layer in ``[first_layer, first_layer + num_layers)``, K then V,
head by head when one side is page-head. Within an item, lane ``i`` of the warp moves words
``i, i + 32, ...``: 16-byte words when both addresses and the size are 16-byte aligned, else the
seed's 8-byte words, four words per lane loaded before any is stored so more bytes are in flight
(a zero-copy read from pinned host memory takes microseconds).
"""
from typing import NamedTuple

from numba import cuda

from ._target import SIMULATOR, WARP_SIZE, device_function, kernel
from .layouts import ADDRESS_FUNCTIONS, Layout
from .memory import load_i64, load_u64, load_u128, store_u64, store_u128

# Words each lane loads before storing them; the loop handles the ragged tail with guards.
WORDS_IN_FLIGHT = 4

# 1024 threads per block (the seed's 32 warps) must fit in one SM's 64K registers.
MAX_REGISTERS = 64

# Every kernel has this signature: 15 int64 scalars (see KernelArgs).
SIGNATURE = "void(" + ", ".join(["int64"] * 15) + ")"


class KernelArgs(NamedTuple):
    """The kernel's parameters, in order. Addresses are plain integers; sizes are in bytes."""

    src_k: int  # buffer base, or the address of a uint64 layer table for Layout.LAYER_TABLE
    dst_k: int
    src_v: int  # 0 for MLA
    dst_v: int
    src_indices: int  # address of num_items int64 token indices, readable by the kernel
    dst_indices: int
    first_layer: int
    num_layers: int
    num_items: int
    items_per_warp: int
    item_size: int
    src_layout_dim: int
    dst_layout_dim: int
    page_size: int  # page-head only; 1 otherwise
    head_num: int  # page-head only; 1 otherwise


def _strided_copy(load, store, shift):
    """Build a warp-cooperative copy of ``nbytes`` with words of ``1 << shift`` bytes."""
    stride = WARP_SIZE
    round_words = WARP_SIZE * WORDS_IN_FLIGHT

    @device_function
    def copy(lane, src, dst, nbytes):
        words = nbytes >> shift
        for w0 in range(lane, words, round_words):
            w1 = w0 + stride
            w2 = w1 + stride
            w3 = w2 + stride
            a = load(src + (w0 << shift))
            b = a
            c = a
            d = a
            if w1 < words:
                b = load(src + (w1 << shift))
            if w2 < words:
                c = load(src + (w2 << shift))
            if w3 < words:
                d = load(src + (w3 << shift))
            store(dst + (w0 << shift), a)
            if w1 < words:
                store(dst + (w1 << shift), b)
            if w2 < words:
                store(dst + (w2 << shift), c)
            if w3 < words:
                store(dst + (w3 << shift), d)

    return copy


_copy_16 = _strided_copy(load_u128, store_u128, 4)
_copy_8 = _strided_copy(load_u64, store_u64, 3)


@device_function
def copy_item(lane, src, dst, nbytes):
    """The whole warp copies ``nbytes`` (a multiple of 8) from ``src`` to ``dst``."""
    if (src | dst | nbytes) & 15 == 0:
        _copy_16(lane, src, dst, nbytes)
    else:
        _copy_8(lane, src, dst, nbytes)


def _build_kernel(src_layout, dst_layout, mla):
    src_address = ADDRESS_FUNCTIONS[src_layout]
    dst_address = ADDRESS_FUNCTIONS[dst_layout]
    headed = Layout.PAGE_HEAD in (src_layout, dst_layout)

    def transfer_kv(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, first_layer, num_layers,
                    num_items, items_per_warp, item_size, src_layout_dim, dst_layout_dim, page_size,
                    head_num):
        thread = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = thread % WARP_SIZE
        warp = thread // WARP_SIZE
        heads = head_num if headed else 1
        chunk = item_size // heads
        first_item = warp * items_per_warp
        end_item = min(first_item + items_per_warp, num_items)
        for item in range(first_item, end_item):
            src_token = load_i64(src_indices + item * 8)
            dst_token = load_i64(dst_indices + item * 8)
            for layer in range(first_layer, first_layer + num_layers):
                for head in range(heads):
                    copy_item(
                        lane,
                        src_address(src_k, layer, src_layout_dim, src_token, item_size, head, heads, page_size),
                        dst_address(dst_k, layer, dst_layout_dim, dst_token, item_size, head, heads, page_size),
                        chunk,
                    )
                    if not mla:
                        copy_item(
                            lane,
                            src_address(src_v, layer, src_layout_dim, src_token, item_size, head, heads, page_size),
                            dst_address(dst_v, layer, dst_layout_dim, dst_token, item_size, head, heads, page_size),
                            chunk,
                        )

    transfer_kv.__name__ = f"transfer_kv_{src_layout.value}_{dst_layout.value}{'_mla' if mla else ''}"
    transfer_kv.__qualname__ = transfer_kv.__name__
    # Compiled lazily, on first launch (or by compile_ptx). The register cap lets a block hold the
    # seed's default 32 warps (1024 threads x 64 registers = the 64K registers of an SM).
    return kernel(transfer_kv, max_registers=MAX_REGISTERS)


# The seed's kernel instances: (source layout, destination layout, MLA) -> the entry point using it.
SEED_KERNELS = {
    (Layout.LAYER_FIRST, Layout.LAYER_FIRST, False): "transfer_kv_per_layer",
    (Layout.PAGE_FIRST, Layout.LAYER_FIRST, False): "transfer_kv_per_layer_pf_lf",
    (Layout.PAGE_HEAD, Layout.LAYER_FIRST, False): "transfer_kv_per_layer_ph_lf",
    (Layout.LAYER_TABLE, Layout.LAYER_TABLE, False): "transfer_kv_all_layer",
    (Layout.LAYER_TABLE, Layout.PAGE_FIRST, False): "transfer_kv_all_layer_lf_pf",
    (Layout.LAYER_TABLE, Layout.PAGE_HEAD, False): "transfer_kv_all_layer_lf_ph",
    (Layout.LAYER_FIRST, Layout.LAYER_FIRST, True): "transfer_kv_per_layer_mla",
    (Layout.PAGE_FIRST, Layout.LAYER_FIRST, True): "transfer_kv_per_layer_mla_pf_lf",
    (Layout.LAYER_TABLE, Layout.LAYER_TABLE, True): "transfer_kv_all_layer_mla",
    (Layout.LAYER_TABLE, Layout.PAGE_FIRST, True): "transfer_kv_all_layer_mla_lf_pf",
}

_kernels = {}


def get_kernel(src_layout, dst_layout, mla):
    """The kernel for one layout pair, built on first request and memoised."""
    key = (Layout(src_layout), Layout(dst_layout), bool(mla))
    built = _kernels.get(key)
    if built is None:
        built = _kernels[key] = _build_kernel(*key)
    return built


def launch_shape(num_items, block_quota, num_warps_per_block):
    """The seed's launch geometry: ``(items_per_warp, blocks, threads_per_block)``.

    ``block_quota`` caps the blocks (and so the SMs) a transfer takes while the model computes.
    """
    items_per_warp = -(-num_items // (block_quota * num_warps_per_block))  # ceiling division, exact
    blocks = -(-num_items // (items_per_warp * num_warps_per_block))
    return items_per_warp, blocks, num_warps_per_block * WARP_SIZE


def kernel_ptx(src_layout, dst_layout, mla, cc=(9, 0)):
    """PTX of one kernel for compute capability ``cc``; needs NVVM, not a GPU (not the simulator)."""
    if SIMULATOR:
        raise RuntimeError("kernel_ptx needs the real CUDA target: unset NUMBA_ENABLE_CUDASIM")
    ptx, _ = cuda.compile_ptx(get_kernel(src_layout, dst_layout, mla).py_func, SIGNATURE, cc=cc)
    return ptx
