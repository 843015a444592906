"""A kernel entry point's plan: everything about a call that does not change from call to call,
validated once; and ``run``, the per-call path every kernel transfer takes.

A plan is built from an entry point's geometry arguments (its buffers, tables and sizes; see
``kvnumba.plan.spec``), or for ``kv.copy`` from two cache views (``copy_plan``). Building it checks them
all (types, sizes, alignment, pinned host memory, writable destinations, one device, destinations clear
of the tables), reads what is known about table layers (``kvnumba.checks.tables``), chooses the kernel
(and the staged one, ``staged_plan``), loads it on the buffers' device and fills a parameter block
(``kvnumba.kernels.params.KernelArgs``) with every value that stays the same. ``run`` then checks the
indices, the layer and the launch shape, writes the few values that change, and launches
(``kvnumba.driver.launch``); ``fast``, the plan's fast call (``fast_path``), does the same for the
common case in fewer Python operations. ``build_plan`` rebinds a plan of a known geometry to new
buffers instead of building it again.
"""
import contextlib
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import config
from ..arrays import HOST, array_info
from ..checks import bounds, guard, pinned, validate
from ..checks.devices import one_device
from ..checks.overlap import check_disjoint, hull
from ..checks.tables import table_layers
from ..driver import batch_copy, capture
from ..driver.devices import on_device
from ..driver.launch import MAX_QUOTA, MAX_WARPS, BoundKernel, launch_shape, launchable
from ..driver.streams import stream_handle
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError, IndexOutOfRangeError
from ..kernels.factory import get_kernel
from ..kernels.params import NO_LIMIT, SIGNATURE, KernelArgs, pack_call
from ..kernels.layouts import PARTS, Layout
from .copy_plan import read_copy
from . import routes
from .fast_path import make_fast_call
from .spec import buffer_names
from .staged_plan import bind_staged

LF, TBL, PF, PH = Layout.LAYER_FIRST, Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD
_LAYOUT_NAMES = {LF: "layer-first", TBL: "layer-table", PF: "page-first", PH: "page-head"}


class Side:
    """One side (source or destination) of a transfer: its layout and what bounds its tokens."""

    __slots__ = ("layout", "k_name", "v_name", "nbytes", "extents", "layout_dim")

    def __init__(self, layout, k_name, v_name, nbytes, extents, layout_dim):
        self.layout, self.k_name, self.v_name = layout, k_name, v_name
        self.nbytes = nbytes  # the smaller of K and V (non-table sides)
        self.extents = extents  # per layer, the smaller of K and V (table sides); None entries: unknown
        self.layout_dim = layout_dim

    def limit(self, plan, first_layer, num_layers):
        """Exclusive token limit for layers ``[first_layer, first_layer + num_layers)``, and the bytes
        it was computed from (None for a raw table whose layers are unknown)."""
        if self.layout is TBL:
            window = self.extents[first_layer:first_layer + num_layers]
            if any(extent is None for extent in window):
                return NO_LIMIT, None
            nbytes = min(window)
        else:
            nbytes = self.nbytes
        limit = bounds.token_limit(self.layout, nbytes, plan.item_size, self.layout_dim, first_layer, num_layers,
                                   plan.page_size, plan.heads)
        return limit, nbytes

    def describe(self, plan, nbytes, first_layer, num_layers):
        """Words for an index error: which buffers, and what bounds them."""
        names = self.k_name if self.v_name is None else f"{self.k_name}/{self.v_name}"
        if nbytes is None:
            return f"{names} (raw layer tables: layer sizes unknown)"
        if self.layout is TBL:
            return f"{names} (layer-first layers of {nbytes} bytes, item_size={plan.item_size})"
        extra = ""
        if self.layout in (PF, PH):
            extra = f", layout_dim={self.layout_dim}" + (f", layer {first_layer}" if num_layers == 1 else "")
        return f"{names} ({_LAYOUT_NAMES[self.layout]}, {nbytes} bytes, item_size={plan.item_size}{extra})"


class LayerWindow:
    """Token limits of one layer window (per-layer calls: one per layer_id, memoised)."""

    __slots__ = ("first_layer", "src_limit", "dst_limit", "src_bytes", "dst_bytes", "params")

    def __init__(self, plan, first_layer):
        self.first_layer = first_layer
        self.src_limit, self.src_bytes = plan.src.limit(plan, first_layer, plan.window)
        self.dst_limit, self.dst_bytes = plan.dst.limit(plan, first_layer, plan.window)
        self.params = (first_layer, self.src_limit, self.dst_limit)  # the kernel parameters a window sets

    def what(self, plan, side):
        if side == "src":
            return plan.src.describe(plan, self.src_bytes, self.first_layer, plan.window)
        return plan.dst.describe(plan, self.dst_bytes, self.first_layer, plan.window)


class KernelPlan:
    """The validated, launch-ready part of one kernel transfer (see the module docstring)."""

    fast: Callable[..., Any]  # the per-call path for the common case (fast_call()), made with the plan

    rebound = False  # made by rebind (the checks of an earlier plan of its geometry reused)
    engine = None  # kv.copy's copy-engine form (plan.routes.EnginePlan); None: kernels only
    no_engine = "SGLang's kernel entry points always launch a kernel"  # why there is no copy-engine form

    def __init__(self, spec, geometry, strict):
        self.spec = spec
        self.first_layer = 0  # the first layer a call moves (per-layer plans: chosen by each call)
        if spec.name == "copy":
            sides = self._configure_copy(geometry, strict)
        else:
            sides = self._configure_seed(spec, geometry, strict)
        self._finish(*sides)

    def _configure_seed(self, spec, geometry, strict):
        """A seed entry point's arguments: validated, and the two sides they describe."""
        names = buffer_names(spec)
        src_layout, dst_layout = spec.src_layout, spec.dst_layout
        sizes = _sizes(spec, geometry)
        (self.head_num, self.page_size, self.heads, self.item_size, self.num_layers, self.window, src_dim,
         dst_dim) = sizes

        # Buffers: described, aligned, reachable by the GPU; destinations writable.
        infos, layers = {}, {}
        for name, layout in zip(names, (src_layout, dst_layout, src_layout, dst_layout)):
            if name is None:
                continue
            obj = geometry[name]
            if layout is TBL:
                info = validate.layer_table(name, obj, self.num_layers)
                layers[name] = table_layers(name, info, self.num_layers, strict)
            else:
                info = array_info(obj, name)
                if info.ptr & 7:
                    validate.aligned(name, info)
            if info.device == HOST:
                pinned.require(name, info)
            infos[name] = info
        for name in (names[1], names[3]):
            if name is None:
                continue
            if dst_layout is TBL:  # the table is only read; the layers it points to are written
                for i, ok in enumerate(layers[name].writable):
                    if ok is False:
                        raise ValueError(f"{name}[{i}] is a read-only layer; a destination must be writable")
            elif not infos[name].writable:
                validate.writable(name, infos[name])
        self.raw_tables = any(t.raw for t in layers.values())
        self.tables = bool(layers)  # with checks on, every call reads its tables again (a new plan)
        placed = [(name, info.device) for name, info in infos.items()]
        if layers:
            placed += [(f"{name}[{i}]", d) for name in layers for i, d in enumerate(layers[name].devices)
                       if d is not None]
        self.device = one_device(placed)
        self.uses_torch = any(info.is_torch for info in infos.values())

        self.src = self._side(src_layout, names[0], names[2], infos, layers, src_dim)
        self.dst = self._side(dst_layout, names[1], names[3], infos, layers, dst_dim)
        self.destinations = self._destinations(names, dst_layout, infos, layers)
        self.guides = [(name, info.ptr, info.ptr + info.nbytes) for name, info in infos.items() if name in layers]
        # The geometry build_plan finds this plan by, to rebind it to other buffers (no tables: None).
        sizes_key = _sizes_key(spec, geometry)
        self.shape_key = None if layers or sizes_key is None else _shape_key(sizes_key, infos.values())
        ptrs = [infos[n].ptr if n else 0 for n in names]
        self.memory = (infos[names[0]].device == HOST, infos[names[1]].device == HOST)
        return (PARTS[src_layout], PARTS[dst_layout], spec.mla, (ptrs[0], ptrs[2]), (ptrs[1], ptrs[3]),
                (src_dim, self.page_size), (dst_dim, self.page_size))

    def _configure_copy(self, geometry, strict):
        """``kv.copy``'s arguments (two cache views, ``layers``): validated (``copy_plan``), and the two
        sides they describe."""
        copy = read_copy(geometry, strict)
        self.first_layer, self.window, self.num_layers, self.item_size = (copy.first_layer, copy.window,
                                                                          copy.num_layers, copy.item_size)
        self.head_num = self.heads = copy.heads
        self.page_size = 1
        self.raw_tables, self.device, self.uses_torch = copy.raw_tables, copy.device, copy.uses_torch
        self.engine, self.no_engine = copy.engine, copy.no_engine
        self.tables = copy.tables
        self.src, self.dst = copy.src, copy.dst
        self.destinations, self.guides = copy.destinations, copy.guides
        return copy.kernel_sides

    def _finish(self, src_parts, dst_parts, mla, src_ptrs, dst_ptrs, src_geometry, dst_geometry):
        """What every plan does once its sides are known: refuse destinations over the tables, choose
        and load the kernel, fill the parameter values that never change."""
        check_disjoint(self.destinations, self.guides)
        self.dst_low, self.dst_high = hull(self.destinations)
        self.windows = {}
        self.packed = {}  # layer -> (first_layer, src_limit, dst_limit): the parameters a layer changes
        first = None
        if not self.spec.per_layer:  # one window, at key 0
            first = self.windows[0] = LayerWindow(self, self.first_layer)
            self.packed[0] = first.params
        (src_dim, src_page), (dst_dim, dst_page) = src_geometry, dst_geometry
        template = KernelArgs(
            src_indices=0, dst_indices=0, num_items=0, items_per_warp=0, first_layer=self.first_layer,
            src_token_limit=first.src_limit if first else NO_LIMIT,
            dst_token_limit=first.dst_limit if first else NO_LIMIT,
            src_k=src_ptrs[0], dst_k=dst_ptrs[0], src_v=src_ptrs[1], dst_v=dst_ptrs[1],
            num_layers=self.num_layers if first is None else self.window, item_size=self.item_size,
            src_layout_dim=src_dim, dst_layout_dim=dst_dim, src_page_size=src_page, dst_page_size=dst_page,
            head_num=self.head_num, error_flag=guard.flag_address())
        self.flag = guard.flag_view()
        self.template = template
        checks = config.tuning("host_index_checks")
        self.host_index_checks = checks is None or bool(checks)  # config's host_index_checks (tests of the guard)
        self.register = launchable(get_kernel(src_parts, dst_parts, mla), SIGNATURE)
        self.staged_args = (src_parts, dst_parts, mla, src_geometry)
        if self.spec.name == "copy":  # kv.copy's loads stay on registers, but a bad setting is refused here too
            config.load_path()
        self._bind(src_ptrs)

    def _bind(self, src_ptrs):
        """The kernels with this plan's parameter values: the register kernel, and for per-layer loads
        from pinned host memory the staged (bulk-copy) kernel, where it applies."""
        self.kernel = self.register_kernel = BoundKernel(self.register, self.device, self.template)
        self.narrow_kernel = None  # one-warp blocks' build, bound on first use (kernel_for)
        staged = None
        if self.spec.name != "copy":
            src_parts, dst_parts, mla, src_geometry = self.staged_args
            staged = bind_staged(self, src_parts, dst_parts, mla, src_ptrs, src_geometry, self.template,
                                 self.memory)
        self.staged_from = NO_LIMIT  # calls with at least this many items (and two warps) take self.kernel
        self.source_maps = None
        if staged is not None:
            self.kernel, self.source_maps, self.staged_from = staged
        self.fast = make_fast_call(self)
        for watch in _watchers:
            watch(self)

    def kernel_for(self, count, warps):
        """The bound kernel a call of ``count`` items in blocks of ``warps`` warps launches: the staged kernel
        for calls of two warps or more and at least ``staged_from`` items, else the register kernel; for
        one-warp blocks its narrow build (``kernels.factory.NARROW_REGISTERS``: such a block runs beside a
        GEMM's blocks), compiled and bound on first use. ``fast_path`` inlines this choice."""
        if warps > 1:
            return self.kernel if count >= self.staged_from else self.register_kernel
        narrow = self.narrow_kernel
        if narrow is None:
            src_parts, dst_parts, mla, _ = self.staged_args
            kernel = launchable(get_kernel(src_parts, dst_parts, mla, narrow=True), SIGNATURE)
            narrow = self.narrow_kernel = BoundKernel(kernel, self.device, self.template)
        return narrow

    def fast_call(self, snapshot=None):
        """``call(src_indices, dst_indices, layer_id, block_quota=2, num_warps_per_block=32, *, stream=None,
        check=False)``: ``run`` for the common case in as few Python operations as it can (``fast_path``);
        ``snapshot``: a prepared transfer's bound buffers, checked first on every call. ``self.fast`` is
        the plan's own, without a snapshot."""
        return make_fast_call(self, snapshot)

    def rebind(self, infos, names):
        """A plan of this one's geometry for other buffers (``infos``: their ``ArrayInfo`` by argument
        name, the same sizes, devices, kinds of memory and alignment as this plan's): every check that
        depends on geometry holds for it; what depends on addresses is done again. No layer tables."""
        plan = object.__new__(KernelPlan)
        plan.__dict__.update(self.__dict__)  # sizes, sides and token limits (shared: they are the same)
        plan.rebound = True
        for name in names:
            if name is not None and infos[name].device == HOST:
                pinned.require(name, infos[name])
        ptrs = [infos[n].ptr if n else 0 for n in names]
        plan.destinations = [(n, infos[n].ptr, infos[n].ptr + infos[n].nbytes) for n in (names[1], names[3]) if n]
        plan.dst_low, plan.dst_high = hull(plan.destinations)
        plan.template = self.template._replace(src_k=ptrs[0], dst_k=ptrs[1], src_v=ptrs[2], dst_v=ptrs[3])
        plan._bind((ptrs[0], ptrs[2]))
        return plan

    # --- building ------------------------------------------------------------------------------

    def _side(self, layout, k_name, v_name, infos, layers, layout_dim):
        if layout is TBL:
            k = layers[k_name].extents
            if v_name is None:
                extents = k
            else:
                v = layers[v_name].extents
                extents = tuple(None if a is None or b is None else min(a, b) for a, b in zip(k, v))
            return Side(layout, k_name, v_name, None, extents, layout_dim)
        nbytes = infos[k_name].nbytes if v_name is None else min(infos[k_name].nbytes, infos[v_name].nbytes)
        return Side(layout, k_name, v_name, nbytes, None, layout_dim)

    @staticmethod
    def _destinations(names, dst_layout, infos, layers):
        ranges = []
        for name in (names[1], names[3]):
            if name is None:
                continue
            if dst_layout is TBL:
                table = layers[name]
                for i, (address, extent) in enumerate(zip(table.addresses, table.extents)):
                    if address is not None and extent is not None:
                        ranges.append((f"{name}[{i}]", address, address + extent))
            else:
                info = infos[name]
                ranges.append((name, info.ptr, info.ptr + info.nbytes))
        return ranges

    def window_for(self, layer_id):
        """Token limits for the call's layers, starting at ``layer_id`` (validated; memoised)."""
        if self.spec.per_layer:
            layer_id = validate.integer("layer_id", layer_id, minimum=0, maximum=validate.MAX_SIZE)
        window = self.windows.get(layer_id)
        if window is None:
            if self.spec.per_layer:
                dim_name = "src_layout_dim" if self.spec.src_layout in (PF, PH) else "dst_layout_dim"
                side = self.src if dim_name == "src_layout_dim" else self.dst
                validate.layout_dim(dim_name, side.layout_dim, self.item_size, layer_id + 1, self.heads,
                                    layer_id=layer_id)
            window = LayerWindow(self, layer_id)
            if len(self.windows) < 4096:
                self.windows[layer_id] = window
                self.packed[layer_id] = window.params
        return window

    # --- the per-call path ----------------------------------------------------------------------

    def run(self, src_indices, dst_indices, layer_id=None, block_quota=2, num_warps_per_block=32, stream=None,
            check=False, route="kernel"):
        """One transfer: check the indices, layer and launch shape, then launch (``check``: wait and
        raise if the kernel skipped items), or for ``kv.copy`` by copy engine (``route``: see
        ``plan.routes``). Nothing is written when a check fails."""
        if route != "kernel":
            route = routes.check_route(route)
        warps = num_warps_per_block
        window: LayerWindow | None
        if self.flag[0]:
            guard.raise_pending()
        if not self.spec.per_layer:
            window = self.windows[0]
        else:  # a bool or NumPy integer must not hit an int's entry: window_for validates it
            window = self.windows.get(layer_id) if type(layer_id) is int else None
        if window is None:
            window = self.window_for(layer_id)
        if type(block_quota) is not int or type(warps) is not int or not (
                0 < block_quota <= MAX_QUOTA and 0 < warps <= MAX_WARPS):
            block_quota, warps = validate.launch_config(block_quota, warps)
        check = check or guard.ALWAYS_CHECK
        src = _index(src_indices, "src_indices", self.device)
        dst = _index(dst_indices, "dst_indices", self.device)
        count = src[1]
        if count != dst[1]:
            validate.same_length(array_info(src_indices, "src_indices"), array_info(dst_indices, "dst_indices"))
        self._clear_of_destinations(src, dst)
        host_side = src[3] or dst[3]
        if host_side and count and self.host_index_checks:
            self._check_host_indices(src, dst, window)
        uses_torch = self.uses_torch or src[4] or dst[4]
        handle = stream_handle(stream, self.device if uses_torch else None)
        if count == 0:
            return handle
        if host_side and not SIMULATOR:
            capture.refuse(handle, "a call with indices in host memory",
                           "pass GPU index arrays (a replay reads their contents then)")
        if check:
            capture.refuse(handle, "check=True (it waits for the stream)",
                           "call kv.check_errors() after the replay instead")
        if route != "kernel" and self._by_copy_engine(route, src, dst, src_indices, dst_indices, window, handle,
                                                      check):
            return handle
        items_per_warp, grid, threads = launch_shape(count, block_quota, warps)
        # A staged block needs two warps; small loads are faster on registers (kvnumba.plan.staged_plan).
        kernel = self.kernel_for(count, warps)
        if self.spec.name == "copy":
            routes.log.record("kernel")
        if host_side and not SIMULATOR:
            return self._run_host_indices(kernel, src, dst, count, items_per_warp, grid, threads, window, handle,
                                          check)
        blocks = kernel.blocks
        pack_call(blocks.view, 0, src[0], dst[0], count, items_per_warp, *window.params)
        kernel.launch(grid, threads, handle, blocks.address)
        if check:
            self._wait_and_check(handle, src_indices, dst_indices, window)
        return handle

    def _by_copy_engine(self, route, src, dst, src_indices, dst_indices, window, handle, check):
        """``kv.copy`` by copy engine (``plan.routes``): True if the call went that way (``route="auto"``
        decides by where the indices are, the stream and the runs they make), False for the kernel."""
        engine = self.engine
        if engine is None:
            if route == "copy_engine":
                raise ValueError(f"route='copy_engine' cannot copy these views: {self.no_engine}; use route='kernel'")
            return False
        if route == "auto" and (not (src[3] and dst[3]) or not routes.engine_available(handle)):
            return False  # indices on the GPU (no synchronisation for a route), or no batch call on this stream
        capture.refuse(handle, "route='copy_engine'", "use route='kernel' with GPU index arrays")
        with on_device(self.device):
            s_idx = src[2]() if src[3] else bounds.host_indices(array_info(src_indices, "src_indices"))
            d_idx = dst[2]() if dst[3] else bounds.host_indices(array_info(dst_indices, "dst_indices"))
            s_idx, d_idx = (np.ascontiguousarray(i, dtype=np.int64) for i in (s_idx, d_idx))
            for index, values, name, limit, side in ((src, s_idx, "src_indices", window.src_limit, "src"),
                                                     (dst, d_idx, "dst_indices", window.dst_limit, "dst")):
                if not (index[3] and self.host_index_checks):  # not checked by run already: no kernel guard here
                    bounds.check_indices(name, values, limit, lambda side=side: window.what(self, side))
            found = engine.runs(s_idx, d_idx)
            if route == "auto" and engine.mean_copy(found) < routes.COPY_ENGINE_MIN_BYTES:
                return False
            copies = engine.copies(found, window.first_layer, self.window)
            batch_copy.copy_many(copies.dsts, copies.srcs, copies.sizes, handle, src_device=engine.src.device,
                                 dst_device=engine.dst.device)
            routes.log.record("copy_engine")
            if check:
                guard.synchronize(handle)
        return True

    def _clear_of_destinations(self, src, dst):
        """Index arrays must not overlap a destination (the kernel would overwrite them mid-transfer)."""
        for index, name in ((src, "src_indices"), (dst, "dst_indices")):
            start, end = index[0], index[0] + 8 * index[1]
            if start < self.dst_high and end > self.dst_low:
                check_disjoint(self.destinations, [(name, start, end)])

    def _check_host_indices(self, src, dst, window):
        for index, name, limit, side in ((src, "src_indices", window.src_limit, "src"),
                                         (dst, "dst_indices", window.dst_limit, "dst")):
            if index[3]:
                bounds.check_indices(name, index[2](), limit, lambda side=side: window.what(self, side))

    def _run_host_indices(self, kernel, src, dst, count, items_per_warp, grid, threads, window, handle, check):
        """Indices in host memory: copied to the device on the call's stream, then waited for (the
        copies are freed when the call returns)."""
        from numba import cuda

        with on_device(self.device):
            stream = cuda.external_stream(handle) if handle else cuda.default_stream()
            staged = [cuda.to_device(np.ascontiguousarray(index[2]()), stream=stream) if index[3] else None
                      for index in (src, dst)]
            pointers = [index[0] if copy is None else copy.device_ctypes_pointer.value
                        for index, copy in zip((src, dst), staged)]
            blocks = kernel.blocks
            pack_call(blocks.view, 0, pointers[0], pointers[1], count, items_per_warp, *window.params)
            kernel.launch(grid, threads, handle, blocks.address)
            stream.synchronize()
        if check and guard.flag_set():
            guard.clear()
            raise IndexOutOfRangeError("the kernel skipped items with out-of-range token indices (flagged by "
                                       "another call in flight?); the other items were copied")
        return handle

    def _wait_and_check(self, handle, src_indices, dst_indices, window):
        with on_device(self.device):
            guard.synchronize(handle)
        if guard.flag_set():
            guard.clear()
            raise self._skipped_error(src_indices, dst_indices, window)

    def _skipped_error(self, src_indices, dst_indices, window):
        """The error for ``check=True`` after the kernel skipped items: the first offending index."""
        for name, obj, limit, side in (("src_indices", src_indices, window.src_limit, "src"),
                                       ("dst_indices", dst_indices, window.dst_limit, "dst")):
            values = bounds.host_indices(array_info(obj, name))
            where = bounds.first_outside(values, 0, limit)
            if where is not None:
                bound = "any token >= 0" if limit >= NO_LIMIT else f"[0, {limit})"
                return IndexOutOfRangeError(
                    f"{name}[{where}] = {int(values[where])} is out of range for {window.what(self, side)}: "
                    f"valid tokens are {bound}; the kernel skipped the out-of-range items and copied the others")
        return IndexOutOfRangeError("the kernel skipped items with out-of-range token indices (flagged by another "
                                    "call in flight?); the other items were copied")


# --- watching plans being made -------------------------------------------------------------------

_watchers: list = []


@contextlib.contextmanager
def watching(callback):
    """``with watching(callback):`` calls ``callback(plan)`` for every kernel plan made in the block, built
    or rebound (``plan.rebound``), once its kernels are bound: for tests and tools that ask what plans
    chose (e.g. ``plan.source_maps is not None``: the staged kernel)."""
    _watchers.append(callback)
    try:
        yield
    finally:
        _watchers.remove(callback)


# --- plans by geometry: a miss on new buffers of a known geometry is a rebind -----------------------

_shapes: dict[tuple, KernelPlan] = {}  # geometry key -> a plan of that geometry


def build_plan(spec, geometry, strict):
    """The plan for an entry point's geometry arguments: every argument checked.

    For a seed entry point without layer tables whose sizes and buffers' geometry (bytes, device,
    kind of memory, writability, 16-byte alignment) were seen before, the plan is the earlier one
    rebound to these addresses (``KernelPlan.rebind``): the checks that depend on the geometry are
    not repeated; those that depend on addresses are. Anything else is built from scratch."""
    if spec.name == "copy" or TBL in (spec.src_layout, spec.dst_layout):
        return KernelPlan(spec, geometry, strict)
    sizes_key = _sizes_key(spec, geometry)
    if sizes_key is not None and sizes_key in _sizes_seen:  # sizes known valid: describe the buffers first
        names = buffer_names(spec)
        infos = {}
        for name in names:
            if name is not None:
                info = infos[name] = array_info(geometry[name], name)
                if info.ptr & 7:
                    validate.aligned(name, info)
        template = _shapes.get(_shape_key(sizes_key, infos.values()))
        if template is not None:
            return template.rebind(infos, names)
    plan = KernelPlan(spec, geometry, strict)
    if plan.shape_key is not None:
        if len(_shapes) > 1024:
            _shapes.clear()
        _shapes[plan.shape_key] = plan
    return plan


def _shape_key(sizes_key, infos):
    """What a plan's checks depend on besides addresses: the sizes, and per buffer its bytes, device,
    writability, kind and 16-byte alignment."""
    return (sizes_key, *[(i.nbytes, i.device, i.writable, i.is_torch, not i.ptr % 16) for i in infos])


def clear_shapes():
    """Forget the geometries seen (settings read at plan build apply to the next plan)."""
    _shapes.clear()
    _sizes_seen.clear()


# --- sizes, validated once per set of values -----------------------------------------------------

class Sizes(NamedTuple):
    head_num: int
    page_size: int
    heads: int  # heads a copy goes by: head_num for page-head entry points, else 1
    item_size: int
    num_layers: int
    window: int  # layers one call moves
    src_dim: int  # src_layout_dim (0 if the entry point has none)
    dst_dim: int


_SIZE_NAMES = ("item_size", "src_layout_dim", "dst_layout_dim", "num_layers", "page_size", "head_num")
_sizes_seen: dict[tuple, Sizes] = {}  # (entry point, sizes and their types) -> Sizes: checks depend on values only


def _sizes_key(spec, geometry):
    """The key of an entry point's size arguments (with their types), or None if one is unhashable."""
    values = tuple(map(geometry.get, _SIZE_NAMES))
    key = (spec.name, *values, *map(type, values))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _sizes(spec, geometry):
    """The entry point's size arguments, validated (memoised by value: a miss on new buffers with
    known sizes does not check them again)."""
    key = _sizes_key(spec, geometry)
    known = _sizes_seen.get(key) if key is not None else None
    if known is None:
        known = _validate_sizes(spec, geometry)
        if key is not None:
            if len(_sizes_seen) > 4096:
                _sizes_seen.clear()
            _sizes_seen[key] = known
    return known


def _validate_sizes(spec, geometry):
    headed = PH in (spec.src_layout, spec.dst_layout)
    g = geometry.get
    head_num = validate.integer("head_num", g("head_num"), minimum=1, maximum=validate.MAX_SIZE) \
        if "head_num" in geometry else 1
    page_size = validate.integer("page_size", g("page_size"), minimum=1, maximum=validate.MAX_SIZE) \
        if "page_size" in geometry else 1
    heads = head_num if headed else 1
    item_size = validate.item_size(g("item_size"), heads)
    tables = TBL in (spec.src_layout, spec.dst_layout)
    num_layers = validate.integer("num_layers", g("num_layers"), minimum=1, maximum=validate.MAX_SIZE) \
        if tables else 1
    dims = [_layout_dim(name, g(name), spec, item_size, num_layers, heads) if name in geometry else 0
            for name in ("src_layout_dim", "dst_layout_dim")]
    return Sizes(head_num, page_size, heads, item_size, num_layers, num_layers, *dims)


def _layout_dim(name, value, spec, item_size, num_layers, heads):
    if spec.per_layer:  # its lower bound depends on layer_id: checked per layer (window_for)
        value = validate.integer(name, value, minimum=0, maximum=validate.MAX_SIZE)
        if value % (8 * heads):
            return validate.layout_dim(name, value, item_size, 0, heads)
        return value
    return validate.layout_dim(name, value, item_size, num_layers, heads)


# --- index arrays, per call ----------------------------------------------------------------------
# An index is (address, count, host values getter or None, in host memory?, torch?). The torch path
# is the hot one (SGLang passes torch tensors): a handful of attribute reads.

_torch_types: set[type] = set()
_torch_int64: list = []


def _index(obj, name, device):
    kind = type(obj)
    if kind in _torch_types:
        ptr = obj.data_ptr()
        shape = obj.shape
        on = obj.get_device()
        if obj.dtype is _torch_int64[0] and len(shape) == 1 and not ptr & 7 and obj.is_contiguous():
            if on == device and not SIMULATOR:
                return ptr, shape[0], None, False, True
            if on < 0 or SIMULATOR:
                return ptr, shape[0], obj.numpy if on < 0 else obj.cpu().numpy, True, True
    elif kind.__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        _torch_types.add(kind)
        _torch_int64[:] = [sys.modules["torch"].int64]
        return _index(obj, name, device)
    return _slow_index(obj, name, device)


def _slow_index(obj, name, device):
    """Any array type, and every error message."""
    info = validate.index_info(name, obj)
    if SIMULATOR or info.device == HOST:
        values = info.obj.numpy if info.is_torch and info.device == HOST else (lambda: bounds.host_indices(info))
        return info.ptr, info.shape[0], values, True, info.is_torch
    if info.device != device:
        raise DeviceMismatchError(f"{name} is on cuda:{info.device} but the buffers are on cuda:{device}")
    return info.ptr, info.shape[0], None, False, info.is_torch
