"""A kernel transfer's plan: everything about a call that does not change from call to call, validated once,
built from its two sides (``seed_args`` for an entry point, ``copy_plan`` for ``kv.copy``), with its kernels
bound to a parameter block of every value that stays the same. Each call is ``plan.per_call``'s.
"""
import contextlib
from collections.abc import Callable
from typing import Any

from .. import config
from ..arrays import HOST
from ..checks import guard, pinned, validate
from ..checks.overlap import Clearance, check_disjoint
from ..driver.launch import BoundKernel, launchable
from ..kernels.factory import get_kernel
from ..kernels.layouts import Layout, slot_bytes
from ..kernels.params import NO_LIMIT, SIGNATURE, KernelArgs
from . import per_call, tensor_maps
from .copy_plan import copy_sides
from .seed_args import seed_sides
from .sides import Side
from .staged_plan import bind_staged

PF, PH = Layout.PAGE_FIRST, Layout.PAGE_HEAD


class LayerWindow:
    """Token limits of one layer window (per-layer calls: one per layer_id)."""

    __slots__ = ("first_layer", "src_limit", "dst_limit", "src_bytes", "dst_bytes", "params")

    def __init__(self, plan, first_layer):
        self.first_layer = first_layer
        self.src_limit, self.src_bytes = plan.src.limit(plan.item_size, plan.heads, first_layer, plan.window)
        self.dst_limit, self.dst_bytes = plan.dst.limit(plan.item_size, plan.heads, first_layer, plan.window)
        self.params = (first_layer, self.src_limit, self.dst_limit)  # the kernel parameters a window sets

    def what(self, plan, side):
        if side == "src":
            return plan.src.describe(plan.item_size, self.src_bytes, self.first_layer, plan.window)
        return plan.dst.describe(plan.item_size, self.dst_bytes, self.first_layer, plan.window)


class KernelPlan:
    """The validated, launch-ready part of one kernel transfer."""

    fast: Callable[..., Any]  # the per-call path for the common case (plan.per_call), made with the plan
    run = per_call.run

    rebound = False  # made by rebind (the checks of an earlier plan of its geometry reused)
    engine = None  # kv.copy's copy-engine form (plan.routes.EnginePlan); None: kernels only
    no_engine = "SGLang's kernel entry points always launch a kernel"  # why there is no copy-engine form
    shape_key = None  # the geometry plan.build finds this plan by to rebind it (None: never rebound)
    memory = (False, False)  # (source in host memory, destination in host memory): for the staged kernel

    def __init__(self, spec, geometry, strict):
        self.spec = spec
        if spec.name == "copy":
            copy = copy_sides(geometry, strict)
            self.first_layer, self.window, self.num_layers = copy.first_layer, copy.window, copy.num_layers
            self.item_size, self.head_num, self.heads, self.page_size = copy.item_size, copy.heads, copy.heads, 1
            self.engine, self.no_engine = copy.engine, copy.no_engine
            src, dst, place = copy.src, copy.dst, copy.place
            self.memory = (src.device == HOST, dst.device == HOST)
        else:
            seed = seed_sides(spec, geometry, strict)
            sizes = seed.sizes
            self.first_layer, self.window, self.num_layers = 0, sizes.num_layers, sizes.num_layers
            self.item_size, self.head_num, self.heads, self.page_size = (sizes.item_size, sizes.head_num,
                                                                         sizes.heads, sizes.page_size)
            self.shape_key, self.memory = seed.shape_key, seed.memory
            src, dst, place = seed.src, seed.dst, seed.place
        self.src, self.dst = src, dst
        self.raw_tables, self.tables = place.raw, place.tables  # with checks on, tables are read again per call
        self.device, self.uses_torch = place.device(), place.torch
        self.destinations, self.guides = place.destinations, place.guides
        self._finish(src, dst)

    def _finish(self, src: Side, dst: Side):
        """Refuse destinations over the tables, fill the parameter values that never change, load the kernels."""
        check_disjoint(self.destinations, self.guides)
        self.clearance = Clearance(self.destinations)  # every call's index arrays against them (per_call)
        self.windows = {}
        self.packed = {}  # layer -> (first_layer, src_limit, dst_limit): the parameters a layer changes
        first = None
        if not self.spec.per_layer:  # one window, at key 0
            first = self.windows[0] = LayerWindow(self, self.first_layer)
            self.packed[0] = first.params
        self.template = KernelArgs(
            src_indices=0, dst_indices=0, num_items=0, items_per_warp=0, first_layer=self.first_layer,
            src_token_limit=first.src_limit if first else NO_LIMIT,
            dst_token_limit=first.dst_limit if first else NO_LIMIT,
            src_k=src.ptrs[0], dst_k=dst.ptrs[0], src_v=src.ptrs[1], dst_v=dst.ptrs[1],
            num_layers=self.num_layers if first is None else self.window, item_size=self.item_size,
            src_layout_dim=src.layout_dim, dst_layout_dim=dst.layout_dim, src_page_size=src.page_size,
            dst_page_size=dst.page_size, head_num=self.head_num, error_flag=guard.flag_address())
        self.flag = guard.flag_view()
        checks = config.tuning("host_index_checks")
        self.host_index_checks = checks is None or bool(checks)  # config's host_index_checks (tests of the guard)
        self.kernel_key = (src.kernel_parts, dst.kernel_parts, src.mla)
        self.register = launchable(get_kernel(*self.kernel_key), SIGNATURE)
        self._bind()

    def _bind(self):
        """The kernels with this plan's parameter values: the register kernel, and the staged (bulk-copy) one
        where it applies (``staged_plan``)."""
        self.kernel = self.register_kernel = BoundKernel(self.register, self.device, self.template)
        self.narrow_kernel = None  # one-warp blocks' build, bound on first use (kernel_for)
        staged = bind_staged(self, *self._staged_source())
        self.staged_from = NO_LIMIT  # calls with at least this many items (and two warps) take self.kernel
        self.source_maps = None
        if staged is not None:
            self.kernel, self.source_maps, self.staged_from = staged
        self.fast = per_call.make_fast_call(self)
        announce(self)

    def _staged_source(self):
        """``(K and V addresses, bytes)`` of the source as the staged kernel's tensor maps picture it: an entry
        point's buffers as given; a view's ``tokens`` token slots (``tensor_maps.layer_part``)."""
        ptrs, src = (self.template.src_k, self.template.src_v), self.src
        if self.spec.name != "copy":
            return ptrs, src.nbytes
        assert src.tokens is not None  # a view's side: its shapes give its tokens
        slot = slot_bytes(src.kernel_parts, src.layout_dim, src.page_size)
        return tensor_maps.layer_part(src.kernel_parts, ptrs, src.tokens * slot, self.first_layer,
                                      src.layout_dim, src.tokens, self.item_size)

    def kernel_for(self, count, warps):
        """``(kernel, warps)``: the bound kernel a call of ``count`` items in blocks of ``warps`` warps launches
        (the staged kernel for two warps or more and at least ``staged_from`` items, else the register kernel;
        for one-warp blocks its narrow build, which runs beside a GEMM's blocks, bound on first use), and the
        warps of its blocks (as asked: a codec plan's staged load may take fewer). The fast call inlines this."""
        if warps > 1:
            return (self.kernel if count >= self.staged_from else self.register_kernel), warps
        narrow = self.narrow_kernel
        if narrow is None:
            kernel = launchable(get_kernel(*self.kernel_key, narrow=True), SIGNATURE)
            narrow = self.narrow_kernel = BoundKernel(kernel, self.device, self.template)
        return narrow, warps

    def fast_call(self, snapshot=None, again=None):
        """``per_call.make_fast_call`` for this plan (``self.fast`` is the plan's own, with neither argument)."""
        return per_call.make_fast_call(self, snapshot, again)

    def rebind(self, infos, names):
        """A plan of this one's geometry for other buffers (``infos``: their ``ArrayInfo`` by argument name): the
        checks that depend on geometry hold for it; those that depend on addresses are done again."""
        plan = object.__new__(KernelPlan)
        plan.__dict__.update(self.__dict__)  # sizes, sides and token limits: the same geometry
        plan.rebound = True
        for name in names:
            if name is not None and infos[name].device == HOST:
                pinned.require(name, infos[name])
        ptrs = [infos[n].ptr if n else 0 for n in names]
        plan.destinations = [(n, infos[n].ptr, infos[n].ptr + infos[n].nbytes) for n in (names[1], names[3]) if n]
        plan.clearance = Clearance(plan.destinations)
        plan.template = self.template._replace(src_k=ptrs[0], dst_k=ptrs[1], src_v=ptrs[2], dst_v=ptrs[3])
        plan._bind()
        return plan

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


_watchers: list = []


def announce(plan):
    """Tell the watchers (``watching``) of a plan made, its kernels bound: a kernel plan, or a codec plan."""
    for watch in _watchers:
        watch(plan)


@contextlib.contextmanager
def watching(callback):
    """``with watching(callback):`` calls ``callback(plan)`` for every plan made (or rebound) in the block, kernel
    and codec plans alike, once its kernels are bound: for tests and tools that ask what plans chose (a codec
    plan's ``staged``: its staged load, or None)."""
    _watchers.append(callback)
    try:
        yield
    finally:
        _watchers.remove(callback)
