"""The kernel factory: one memoised CUDA kernel per (source layout, destination layout, MLA), and the codec
kernels' part of it (``memoised``, ``codec_ops``).

One body serves every pair of layouts (``kernels.layouts.LayoutParts``, a user's own included). It closes
over the two layouts' address functions and the MLA flag, which Numba compiles as constants, so each
kernel is as specialised as the seed's C++ template instances. Kernels take plain integers only: array
arguments cost microseconds of host time per launch. Work split, as in the seed: warp ``w`` copies items
``[w * items_per_warp, (w + 1) * items_per_warp)``, every layer of the call (``item_copy``).

The quantised copy's kernels (``kernels.scaled_copy`` and its fast variants) are built the same way, closing
over the codec's device functions (``codec_ops``); ``memoised`` keeps every builder's kernels.
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

# The inner loop's shape per kernel, chosen by measurement (scripts/RESULTS.md, "Tuning"): where zero-copy
# reads over PCIe bound every shape, the seed's 8-byte loop is as fast as any.
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

MAX_REGISTERS = 64  # 1024 threads per block (the seed's 32 warps) must fit in one SM's 64K registers
# A one-warp block fits beside a model's GEMM, whose blocks leave about one warp of 32 registers free per SM:
# it runs while the GEMM runs, instead of waiting for a gap between GEMMs.
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

    check_parameters(transfer_kv, KernelArgs)
    name = f"transfer_kv_{src.name}_{dst.name}{'_mla' if mla else ''}{'_narrow' if narrow else ''}"
    transfer_kv.__name__ = transfer_kv.__qualname__ = name
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
