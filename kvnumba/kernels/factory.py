"""The kernel factory: one memoised CUDA kernel per (source layout, destination layout, MLA), and the codec
kernels' part of it (``memoised``, ``codec_ops``).

One body serves every pair of layouts (``kernels.layouts.LayoutParts``, a user's own included). It closes
over the two layouts' address functions and the MLA flag, which Numba compiles as constants, so each
kernel is as specialised as the seed's C++ template instances. Kernels take plain integers only: array
arguments cost microseconds of host time per launch.

Work split, as in the seed: warp ``w`` copies items ``[w * items_per_warp, (w + 1) * items_per_warp)``,
every layer of the call, K and V, head by head when one side is page-head; its lanes stride over 8- or
16-byte words (``warp_copy``).

A quantised copy's kernels (``kernels.scaled_copy``, the register kernel for every mode, and its fast
variants ``quantise_wide``, ``dequantise_pipelined``, ``dequantise_staged``) are built the same way with the
codec as a parameter: each builder closes over the layouts and the codec's device functions
(``codec_ops``), and ``memoised`` keeps what it built, keyed by the codec object with the rest.
"""
import importlib

from numba import cuda

from .. import config
from .jit import WARP_SIZE, kernel
from .layouts import PARTS, Layout, LayoutParts
from .item_copy import make_items_copy
from .params import SIGNATURE, KernelArgs, check_parameters
from .ptx import ptx_of
from .warp_copy import CopyShape

# The inner loop's shape per kernel, chosen by measurement (scripts/RESULTS.md, "Tuning"). Where every
# shape is bound by zero-copy reads over PCIe, the seed's 8-byte one-word loop is as fast as any; K and V
# paired and 16-byte words pay off for page-head (short head chunks) and MLA items.
_SEED_LIKE = CopyShape(words=1, wide=False, paired=False)
_WIDE = CopyShape(words=1, wide=True, paired=True)
COPY_SHAPES = {  # by layout names (LayoutParts.name)
    ("lf", "lf", False): _SEED_LIKE,
    ("pf", "lf", False): _SEED_LIKE,
    ("ph", "lf", False): CopyShape(words=2, wide=False, paired=True),
    ("lf_tbl", "lf_tbl", False): _SEED_LIKE,
    ("lf_tbl", "pf", False): _WIDE,
    ("lf_tbl", "ph", False): _SEED_LIKE,
    # kv.copy's per-layer load into one layer of a list of layer buffers: the same kernel as pf -> lf
    ("pf", "lf_tbl@1", False): _SEED_LIKE,
}
DEFAULT_COPY_SHAPE = _WIDE  # MLA kernels and pairs the seed does not have


def copy_shape_for(src, dst, mla):
    """The inner loop's shape for a kernel (``src``/``dst``: ``LayoutParts``): the tuned table's, or the one
    shape that tuning experiments and tests set for every kernel (``config.override(copy_shape=...)``)."""
    forced = config.tuning("copy_shape")
    if forced is not None:
        return forced
    return COPY_SHAPES.get((src.name, dst.name, bool(mla)), DEFAULT_COPY_SHAPE)

# 1024 threads per block (the seed's 32 warps) must fit in one SM's 64K registers.
MAX_REGISTERS = 64
# A one-warp block is built to fit beside a model's GEMM, whose blocks leave about one warp of 32 registers
# free per SM: a block that fits runs while the GEMM runs, one that does not waits for a gap between GEMMs
# (scripts/RESULTS.md, loads under compute).
NARROW_REGISTERS = 32


def _build_kernel(src, dst, mla, copy_shape, narrow=False):
    copy_items = make_items_copy(src, dst, mla, copy_shape)

    def transfer_kv(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                    dst_token_limit, src_k, dst_k, src_v, dst_v, num_layers, item_size, src_layout_dim,
                    dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag):
        lane = cuda.threadIdx.x & (WARP_SIZE - 1)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        first_item = warp * items_per_warp
        count = min(items_per_warp, num_items - first_item)  # negative for warps past the last item
        copy_items(lane, first_item, 0, count, 1, src_indices, dst_indices, first_layer, num_layers, src_token_limit,
                   dst_token_limit, src_k, dst_k, src_v, dst_v, item_size, src_layout_dim, dst_layout_dim,
                   src_page_size, dst_page_size, head_num, error_flag)

    check_parameters(transfer_kv, KernelArgs)  # the parameter block's order (kvnumba.kernels.params)
    transfer_kv.__name__ = f"transfer_kv_{src.name}_{dst.name}{'_mla' if mla else ''}"
    transfer_kv.__qualname__ = transfer_kv.__name__
    # Compiled lazily, on first launch (or by compile_ptx). The register cap lets a block hold the
    # seed's default 32 warps (1024 threads x 64 registers = the 64K registers of an SM); a narrow
    # build, for one-warp blocks, fits beside a GEMM's blocks.
    if narrow:
        transfer_kv.__name__ = transfer_kv.__qualname__ = transfer_kv.__name__ + "_narrow"
    return kernel(transfer_kv, max_registers=NARROW_REGISTERS if narrow else MAX_REGISTERS)


_kernels: dict[tuple, object] = {}


def memoised(build, *key):
    """``build(*key)``, built on first request and kept: the kernels of every builder here, by builder and key."""
    entry = (build, *key)
    built = _kernels.get(entry)
    if built is None:
        built = _kernels[entry] = build(*key)
    return built


def codec_ops(codec, dtype):
    """The device functions that a codec kernel inlines for ``codec`` and plain ``dtype``: the ``ops`` of the
    module its ``kernels`` names (``kvnumba.quant.codec.Codec``; FP8's: ``kernels.fp8.ops``)."""
    return importlib.import_module(codec.kernels).ops(codec, dtype)


def get_kernel(src_layout, dst_layout, mla, narrow=False):
    """The kernel for one layout pair, built on first request and memoised. A layout is a
    ``LayoutParts`` or one of the seed's names (``Layout`` or its value, e.g. ``"pf"``). ``narrow``: the
    build for one-warp blocks, capped at ``NARROW_REGISTERS`` so that it runs beside a GEMM."""
    src, dst = _parts(src_layout), _parts(dst_layout)
    return memoised(_build_kernel, src, dst, bool(mla), copy_shape_for(src, dst, mla), bool(narrow))


def _parts(layout):
    return layout if isinstance(layout, LayoutParts) else PARTS[Layout(layout)]


def kernel_ptx(src_layout, dst_layout, mla, cc=(9, 0)):
    """PTX of one kernel for compute capability ``cc``; needs NVVM, not a GPU (not the simulator)."""
    return ptx_of(get_kernel(src_layout, dst_layout, mla), SIGNATURE, cc)
