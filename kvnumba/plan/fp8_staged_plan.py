"""Whether an FP8 dequantising load (``kv.copy(fp8_view, plain_view, ...)``, ``plan.fp8_plan``) takes the staged
kernel (``kernels.dequantise_staged``), and that kernel bound for it.

The setting is bfloat16 loads' (``plan.staged_plan``; ``KVNUMBA_LOAD_PATH``): ``staged`` wherever the geometry
allows (the simulator too), ``register`` never, and ``auto`` one-layer loads from pinned host memory into GPU
memory on sm_90+ (``auto_stages``), for calls of at least ``staged_plan.AUTO_MIN_ITEMS`` items, heads of 8 * 2**k
too (the staged kernel's 16-warp blocks do not stall on the link as the pipelined kernel's per-thread copies
do). The geometry allows it for a source of ``dequantise_staged.SOURCES``, heads of a multiple of 16 codes, a
stage that holds a token's codes and scales (``dequantise_staged.run_limits``), and codes buffers the bulk-copy
unit can read (``plan.tensor_maps.source_maps``). Anything else, and calls of one warp a block or fewer items,
run the register FP8 kernel. The scales come through tensor maps of their own where the bulk unit can bring
them (``_scale_maps``; ``config.override(scale_boxes=False)``: never). ``kernel_plan.watching`` tells tests what a
plan chose (its ``staged``).
"""
from typing import Any, NamedTuple

from .. import config
from ..arrays import HOST, array_info
from ..driver.launch import BoundKernel, launchable
from ..driver.target import SIMULATOR
from ..kernels import dequantise_staged, staged
from . import staged_plan, tensor_maps


class StagedFp8(NamedTuple):
    """A plan's staged kernel: bound, its tensor maps (kept alive with it) and the fewest items it takes."""

    kernel: Any  # driver.launch.BoundKernel
    maps: Any  # plan.tensor_maps.SourceMaps
    fewest: int
    scale_maps: Any = None  # the scales' SourceMaps, or None: the loader's lanes copy them

    def kernel_for(self, count, warps, register):
        """``(kernel, warps)``: the bound kernel a call of ``count`` items in blocks of ``warps`` warps launches
        (else ``register``), and its blocks' warps (the staged kernel's: at most ``dequantise_staged.WARPS``)."""
        if warps > 1 and count >= self.fewest:
            return self.kernel, min(warps, dequantise_staged.WARPS)
        return register, warps


def auto_stages(src_device, dst_device, device):
    """Whether ``auto`` stages a one-layer FP8 load that the geometry allows: from pinned host memory
    (``src_device``: ``arrays.HOST``) into GPU memory, on a GPU (``device``) of compute capability 9.0 or more,
    not on the simulator."""
    return (not SIMULATOR and src_device == HOST and dst_device != HOST
            and tensor_maps.compute_capability(device) >= (9, 0))


def bind_staged(plan, src, dst):
    """``StagedFp8`` for ``plan`` (an ``fp8_plan.Fp8Plan`` from view ``src`` to view ``dst``), or None: its calls
    take the register kernel."""
    path = config.load_path()
    if (path == "register" or plan.mode != "dequantise" or plan.window != 1
            or not dequantise_staged.fits(src.head_dim)):
        return None
    parts = plan.src.parts
    if parts not in dequantise_staged.SOURCES:
        return None
    layer, codes = plan.first_layer, src.codes
    buffers = _layer_buffers(codes, "codes", layer, src.mla)
    if path == "auto" and not auto_stages(buffers[0].device, array_info(next(iter(dst.buffers("k"))), "dst").device,
                                          plan.device):
        return None
    ring = config.tuning("staged_shape") or dequantise_staged.SHAPE  # config.override(staged_shape=...): another ring
    if path == "auto" and tensor_maps.shared_limit(plan.device) < ring.shared_bytes:  # too big a block (sm_120)
        return None
    item = codes.geometry.item_bytes
    run_limits = dequantise_staged.run_limits(item, src.heads, src.mla, ring)
    if run_limits is None:  # a stage cannot hold one token's codes and scales
        return None
    maps = _layer_maps(codes, buffers, parts, layer, src, run_limits, ring)
    if maps is None:
        return None
    scale_maps = _scale_maps(src, parts, layer, run_limits, item, ring)
    kernel = launchable(dequantise_staged.get_kernel(parts, plan.dst.parts, src.mla, plan.codec, plan.dtype,
                                                      ring),
                        dequantise_staged.SIGNATURE, ring.shared_bytes)
    scales_at = scale_maps.args[0] if scale_maps else 0  # the kernel's scale_maps: 0 for none
    args = dequantise_staged.StagedScaledArgs._make((*plan.template, *maps.args, scales_at))
    bound = BoundKernel(kernel, plan.device, args)
    return StagedFp8(bound, maps, staged_plan.AUTO_MIN_ITEMS if path == "auto" else 1, scale_maps)


def _scale_maps(src, parts, layer, run_limits, codes_item, ring):
    """Tensor maps of the scales of ``src`` (an ``Fp8View``), for the bulk unit to bring a piece's scales a box
    a kind, or None where it cannot: a row of a box is 16 bytes or more (a token's scales of one layer: 4 bytes
    a head, so heads of a multiple of 4, which a page-head layout does not keep together), and each box lands
    128-byte aligned in the stage (the smallest piece's codes and scales are multiples of 128 bytes)."""
    if config.tuning("scale_boxes") is False or parts is dequantise_staged.PAGE_HEAD:
        return None
    heads, scales = src.heads, src.scales
    piece = 1 << (run_limits[1].bit_length() - 1)  # the fewest tokens a bulk piece holds (a power of two)
    if (piece * heads * 4) % staged.TMA_ALIGN or (piece * codes_item) % staged.TMA_ALIGN:
        return None
    return _layer_maps(scales, _layer_buffers(scales, "scales", layer, src.mla), parts, layer, src, run_limits, ring)


def _layer_buffers(cache, name, layer, mla):
    """``array_info`` of the arrays of layer ``layer`` of ``cache`` (an ``Fp8View``'s ``codes`` or ``scales``,
    ``name``): K's, then V's unless ``mla`` (a per-layer view's: this layer's arrays)."""
    return [array_info(cache.buffers(which)[layer if cache.per_layer else 0], f"src_view.{name}.{which}")
            for which in (("k",) if mla else ("k", "v"))]


def _layer_maps(cache, buffers, parts, layer, src, run_limits, ring):
    """``tensor_maps.source_maps`` of ``buffers`` (``_layer_buffers`` of ``cache``, a part of ``src``) for the
    ring's pieces, or None where the bulk unit cannot read them; a layer-first buffer ([L, T, ...]) is pictured
    from this layer's part."""
    g = cache.geometry
    ptrs, nbytes = tensor_maps.layer_part(parts, [b.ptr for b in buffers], min(b.nbytes for b in buffers), layer,
                                          g.layout_dim, g.tokens, g.item_bytes)
    return tensor_maps.source_maps(dequantise_staged.map_layout(parts), ptrs[0], ptrs[-1], nbytes, g.item_bytes,
                                   g.layout_dim, g.page_size, src.heads, src.mla, run_limits, ring.stage_bytes)
