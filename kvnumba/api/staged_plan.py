"""Whether a plan's loads take the staged kernel (``kernels.staged``), and that kernel bound for it.

``KVNUMBA_LOAD_PATH`` (``kvnumba.config.load_path``) decides:

- ``auto`` (default): staged for the per-layer loads it speeds up: a pinned-host source read into
  GPU memory, on a GPU of compute capability 9.0 or newer (Hopper's bulk-copy unit), for calls of
  at least ``AUTO_MIN_ITEMS`` items, and for page-head sources only if a page holds a bulk piece;
- ``staged``: staged wherever the layouts allow (any memory, the simulator too: for tests and
  benchmarks);
- ``register``: never.

Either way a plan is staged only if its source layout (layer-first, page-first or page-head) and its
sizes can be described by tensor maps (``driver.tensor_maps``) and its destination is one layer's
buffer; otherwise, and for calls with fewer than two warps per block, the register kernel runs.
"""
from .. import config
from ..driver import tensor_maps
from ..driver.launch import BoundKernel, launchable
from ..driver.target import SIMULATOR
from ..kernels import staged
from ..kernels.layouts import PAGE_HEAD

# In auto mode, calls with fewer items take the register kernel: on the H200 a 64-item load ran at
# 0.84-0.86x of the seed staged (the ring's set-up and one round trip), against ~0.95x on registers.
# The crossover was not measured; 512 items (8 pages of 64) is a conservative guess.
AUTO_MIN_ITEMS = 512


def bind_staged(plan, src_parts, dst_parts, mla, src_ptrs, src_geometry, template, memory):
    """``(BoundKernel, SourceMaps, fewest items)`` of the staged kernel for ``plan`` (keep the maps), or
    None when its loads stay on registers.

    ``memory``: ``(source in host memory, destination in host memory)``; ``template``: the register
    kernel's 19 parameter values (the staged kernel's start with them)."""
    path = config.load_path()
    if (path == "register" or plan.window != 1 or src_parts not in staged.SOURCES
            or dst_parts not in staged.DESTINATIONS):
        return None
    if path == "auto":
        src_host, dst_host = memory
        if SIMULATOR or not src_host or dst_host or tensor_maps.compute_capability(plan.device) < (9, 0):
            return None
    if any(p % 16 for p in template[8:11:2] if p):  # destinations: 16-byte stores from shared memory
        return None
    src_dim, src_page = src_geometry
    ring = staged.SHAPE
    maps = tensor_maps.source_maps(src_parts, src_ptrs[0], src_ptrs[1], plan.src.nbytes, plan.item_size, src_dim,
                                   src_page, plan.head_num, mla, staged.run_limits(plan.item_size, mla, ring),
                                   ring.stage_bytes)
    if maps is None:
        return None
    min_run = maps.args[3]
    if path == "auto" and src_parts is PAGE_HEAD and src_page < min_run:
        return None  # pages shorter than a bulk piece: every item would go through registers, more slowly
    kernel = launchable(staged.get_staged_kernel(src_parts, dst_parts, mla, ring), staged.SIGNATURE, ring.shared_bytes)
    fewest = AUTO_MIN_ITEMS if path == "auto" else 1
    return BoundKernel(kernel, plan.device, (*template, *maps.args)), maps, fewest
