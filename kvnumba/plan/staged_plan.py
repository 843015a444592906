"""Whether a plan's loads take the staged kernel (``kernels.staged``), and that kernel bound for it.

``KVNUMBA_LOAD_PATH`` (``config.load_path``) decides: ``auto`` (default) stages the per-layer loads it
speeds up (pinned host -> GPU on sm_90+, at least ``AUTO_MIN_ITEMS`` items, page-head sources only if a
page holds a bulk piece); ``staged`` stages wherever the layouts allow (any memory, the simulator too:
tests and benchmarks); ``register`` never. The resident loader's staged build follows the same setting
(``plan.resident_plan``).

Either way a plan is staged only if tensor maps can describe its source (``plan.tensor_maps``), its
buffers are 16-byte aligned and its destination is one layer's buffer; calls with one-warp blocks take
the register kernel. What depends on sizes only is a memoised ``Recipe``; binding it to a plan's addresses
encodes that plan's tensor maps.
"""
import functools
from typing import Any, NamedTuple

from .. import config
from ..driver.launch import BoundKernel, launchable
from ..driver.target import SIMULATOR
from ..kernels import staged
from ..kernels.layouts import PAGE_HEAD
from ..kernels.params import StagedArgs
from . import tensor_maps
from ..memo import BoundedMemo
from .cache import remembered

# In auto mode, calls with fewer items take the register kernel: a short load staged pays the ring's set-up
# and one round trip. The crossover was not measured; 512 items is a conservative guess.
AUTO_MIN_ITEMS = 512


class Recipe(NamedTuple):
    """A staged load for one geometry: the kernel, and how to describe a source at its K and V addresses."""

    kernel: Any  # driver.launch.Kernel
    maps: Any  # (k_ptr, v_ptr) -> tensor_maps.SourceMaps, or None where the addresses do not suit the bulk unit
    fewest: int  # calls with fewer items take the register kernel


_recipes = remembered(BoundedMemo(1024))  # geometry -> its Recipe, or None: its loads stay on registers


def ring_in_force():
    """The staged kernel's ring: ``staged.SHAPE`` (tuned on the H200), or ``config.override(staged_shape=...)``'s."""
    return config.tuning("staged_shape") or staged.SHAPE


def auto_declines(memory, device, ring):
    """Whether ``auto`` keeps a load on registers whatever its layouts: unless its source is in pinned host memory
    and its destination on the GPU (``memory``: ``(source on host, destination on host)``), on a GPU of compute
    capability 9.0 or newer whose blocks hold ``ring`` (not sm_120's), off the simulator."""
    src_host, dst_host = memory
    return (SIMULATOR or not src_host or dst_host or tensor_maps.compute_capability(device) < (9, 0)
            or tensor_maps.shared_limit(device) < ring.shared_bytes)


def short_pages(path, src_parts, run_limits, page_size):
    """``auto`` keeps page-head pages shorter than a bulk piece on registers (every item would go through them)."""
    return (path == "auto" and src_parts.head_major
            and page_size < tensor_maps.piece_limits(run_limits, True, page_size)[1])


def unaligned_destination(template):
    """Pieces leave shared memory in 16-byte stores: the destination's buffers must be 16-byte aligned."""
    return any(p % 16 for p in (template.dst_k, template.dst_v) if p)


def _recipe(path, ring, plan, src_parts, dst_parts, mla, src_bytes, src_dim, src_page, memory):
    if (path == "register" or plan.window != 1 or src_bytes is None or not staged.stageable(src_parts)
            or dst_parts not in staged.DESTINATIONS or (path == "auto" and auto_declines(memory, plan.device, ring))):
        return None
    picture = tensor_maps.geometry(src_parts, src_bytes, plan.item_size, src_dim, src_page, plan.head_num)
    run_limits = staged.run_limits(plan.item_size, mla, ring)
    if picture is None or run_limits is None or short_pages(path, src_parts, run_limits, src_page):
        return None  # run_limits None: a stage cannot hold one token's K and V
    kernel = launchable(staged.get_staged_kernel(src_parts, dst_parts, mla, ring), staged.SIGNATURE, ring.shared_bytes)
    maps = functools.partial(tensor_maps.source_maps, src_parts, nbytes=src_bytes, item_size=plan.item_size,
                             layout_dim=src_dim, page_size=src_page, heads=plan.head_num, mla=mla,
                             run_limits=run_limits, stage_bytes=ring.stage_bytes)
    return Recipe(kernel, maps, AUTO_MIN_ITEMS if path == "auto" else 1)


def bind_staged(plan, src_ptrs, src_bytes):
    """``(BoundKernel, SourceMaps, fewest items)`` of the staged kernel for ``plan`` (keep the maps), or None when
    its loads stay on registers. ``src_ptrs``, ``src_bytes`` (None: not staged): the source as its tensor maps
    picture it. What depends on sizes only is memoised (``Recipe``)."""
    src_parts, dst_parts, mla = plan.kernel_key
    src_dim, src_page = plan.src.layout_dim, plan.src.page_size
    path, ring = config.load_path(), ring_in_force()
    key = (path, src_parts, dst_parts, mla, plan.window, src_bytes, plan.item_size, src_dim, src_page,
           plan.head_num, plan.memory, plan.device, ring)
    try:
        found = _recipes[key]
    except KeyError:
        found = _recipes.remember(key, _recipe(path, ring, plan, src_parts, dst_parts, mla, src_bytes, src_dim,
                                               src_page, plan.memory))
    if found is None or unaligned_destination(plan.template):
        return None
    maps = found.maps(*src_ptrs)
    if maps is None:
        return None
    return BoundKernel(found.kernel, plan.device, StagedArgs(*plan.template, *maps.args)), maps, found.fewest
