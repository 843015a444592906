"""The plan of a ``kv.copy`` where a side is a ``kv.Fp8View``: quantise into FP8, dequantise out of it, or copy FP8
caches, in one kernel launch (quantising: ``kernels.quantise_wide``; dequantising: ``kernels.dequantise_staged``
for one-layer loads from pinned host memory on sm_90+ (``plan.fp8_staged_plan``), else
``kernels.dequantise_pipelined``; where those do not run, ``kernels.scaled_copy``).

``plan.build`` builds one per (source view, destination view, layers) and the plan cache keeps it
(``plan.cache``): the views checked against each other, every buffer described, aligned (plain 8 bytes, codes
and scales 4), reachable by the GPU, on one device, the destinations writable and clear of the layer tables the
kernel reads. A call is every kernel plan's (``plan.per_call.run``): its indices checked (host indices before
anything is written, device indices by the kernel's guard and error flag), written into the parameter block with
the plan's one layer window (``CodecWindow``), then one launch. The views are
read through their protocol (``is_fp8``), so this module does not import them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from ..checks import guard
from ..checks.overlap import Clearance, check_disjoint
from ..driver.launch import BoundKernel, launchable
from ..driver.target import SIMULATOR
from ..kernels import dequantise_pipelined, quantise_wide
from ..kernels import scaled_copy as kernels
from ..checks.user_layouts import check_user_layout
from . import fp8_staged_plan, per_call, routes
from .copy_plan import copy_window, is_view, view_side
from .kernel_plan import announce
from .sides import Placement, Side
from .spec import SPECS
from .tensor_maps import compute_capability, shared_limit


def is_fp8(view: Any) -> bool:
    """Whether ``view`` is a ``kv.Fp8View`` (its class says so: ``Fp8View.fp8``)."""
    return getattr(type(view), "fp8", False) is True


def plain_dtype_of(plain: Any, quantised: Any) -> str:
    """``"bfloat16"`` or ``"float16"``: the element type of ``plain`` (its dtype, or for uint16 buffers
    ``quantised.dtype``); ``TypeError`` when there is none or they disagree."""
    dtype = plain.geometry.dtype
    if dtype in ("bfloat16", "float16"):
        if quantised.dtype is not None and quantised.dtype != dtype:
            raise TypeError(f"the plain view holds {dtype} but the FP8 view says dtype={quantised.dtype!r}")
        return dtype
    if dtype in ("uint16", "int16") and plain.itemsize == 2:
        if quantised.dtype is None:
            raise TypeError(f"the plain view holds {dtype} bit patterns: say which floats they are with "
                            "kv.Fp8View(..., dtype='bfloat16') (or 'float16')")
        return quantised.dtype
    raise TypeError(f"an FP8 copy quantises bfloat16 or float16 views, got a view of {dtype}")


def _sides(place: Placement, name: str, view: Any, destination: bool, first_layer: int,
           window: int) -> tuple[Side, Side | None]:
    """One view as the kernel's side (``plan.sides``, through the checks every plan's sides go through): a
    plain view's, or an Fp8View's codes and scales (4-byte aligned). Per-layer views read tables of their
    layers' addresses, one layer too."""
    def side(label: str, part: Any, align: int) -> Side:
        return view_side(place, label, part, destination, first_layer, window, strict=False, align=align,
                         one_layer=False)

    if is_fp8(view):
        return side(f"{name}.codes", view.codes, 4), side(f"{name}.scales", view.scales, 4)
    return side(name, view, 8), None


def _wide_slots(mode: str, heads: int, head_dim: int, device: int, scales: Side | None, codes: Side) -> int:
    """The slots of the fast kernel for this copy, 0 for ``scaled_copy``'s: the wide kernel's for a quantising
    copy (``kernels.quantise_wide``: heads of 16 * 2**k elements), 1 for a dequantising one that the pipelined
    kernel takes (``kernels.dequantise_pipelined``: heads of 8 * 2**k). Both need codes on 8-byte boundaries
    (they move them 8 bytes at a time) and, on a GPU, compute capability 9.0 (their packed conversions); the
    pipelined one also a block's worth of shared memory for its rings (``dequantise_pipelined.shared_bytes``);
    ``config.override(fp8_kernel=...)`` picks one where both run."""
    chosen = config.tuning("fp8_kernel")
    if mode == "dequantise":
        slots = 1 if dequantise_pipelined.takes(head_dim) else 0
    else:
        slots = quantise_wide.slots_for(head_dim) if mode == "quantise" else 0
    if chosen == "general" or not slots or scales is None:
        return 0
    if codes.bases is None or (np.asarray(codes.bases) % 8).any():
        return 0
    if not SIMULATOR and compute_capability(device) < (9, 0):
        return 0
    if (mode == "dequantise" and not SIMULATOR
            and shared_limit(device) < dequantise_pipelined.shared_bytes(heads, head_dim)):
        return 0  # the pipelined kernel's rings do not fit in a block's shared memory there (sm_120)
    return slots


def kernel_numbers(prefix: str, side: Side | None) -> dict[str, int]:
    """A side's ``{prefix}_k``, ``_v``, ``_item`` and ``_dim`` as the kernel takes them (zeros: no scales)."""
    if side is None:
        return dict.fromkeys((f"{prefix}_k", f"{prefix}_v", f"{prefix}_item", f"{prefix}_dim"), 0)
    return {f"{prefix}_k": side.ptrs[0], f"{prefix}_v": side.ptrs[1], f"{prefix}_item": side.geometry.item_bytes,
            f"{prefix}_dim": side.layout_dim}


def check_views(src: Any, dst: Any, mode: str, quantised: Any, what: str) -> str:
    """What a quantised copy checks of its views: in a copy their heads agree; else the plain view's items are
    the ``quantised`` view's heads of bfloat16/float16 (returned: which), and its own layout takes them."""
    if mode == "copy":
        if (src.heads, src.head_dim) != (dst.heads, dst.head_dim):
            raise ValueError(f"the views' heads differ: src_view (H={src.heads}, D={src.head_dim}), dst_view "
                             f"(H={dst.heads}, D={dst.head_dim})")
        return "bfloat16"
    plain, name = (src, "src_view") if mode == "quantise" else (dst, "dst_view")
    heads, head_dim = quantised.heads, quantised.head_dim
    dtype = plain_dtype_of(plain, quantised)
    g = plain.geometry
    if g.heads != heads or g.item_bytes != heads * head_dim * 2:
        raise ValueError(f"{name} has items of {g.heads} heads, {g.item_bytes} bytes; the {what} view's are "
                         f"{heads} heads of {head_dim} elements ({heads * head_dim * 2} bytes as {dtype})")
    if plain.user_layout:
        check_user_layout(plain, heads)
    return dtype


def copy_mode(src: Any, dst: Any, quantised: Any = None, what: str = "FP8", view_name: str = "kv.Fp8View") -> str:
    """``"quantise"``, ``"dequantise"`` or ``"copy"``: which side of a copy is a quantised view (``quantised(view)``,
    FP8's by default; ``what``/``view_name`` name the format and its view class in errors)."""
    quantised = quantised or is_fp8
    for name, view in (("src_view", src), ("dst_view", dst)):
        if not (is_view(view) or quantised(view)):
            raise TypeError(f"{name} must be a kvnumba cache view or {view_name}, got {type(view).__name__}")
        if getattr(view, "raw_tables", False):
            raise TypeError(f"{name} is a LayerTable (raw addresses, no dtype): an {what} copy needs a LayerFirst of "
                            "the layers' arrays")
    src_q, dst_q = quantised(src), quantised(dst)
    if not (src_q or dst_q):
        raise TypeError(f"an {what} copy needs a {view_name} on one side at least")
    return "copy" if src_q and dst_q else "quantise" if dst_q else "dequantise"


class Fp8Plan:
    """The validated, launch-ready part of one FP8 copy (see the module docstring)."""

    spec = SPECS["copy"]  # what plan.per_call reads of a plan's entry point: kv.copy's
    engine = None  # no copy-engine form: the codec works in the kernel
    # kv.load_resident's one-launch build, () -> (kernel, its parameters' namedtuple); None: FP8's loads launch its
    # per-layer kernels layer by layer (its register kernel moves a head a round trip: slow in one launch)
    resident_build: Any = None

    def __init__(self, src: Any, dst: Any, layers: Any) -> None:
        self.mode = mode = copy_mode(src, dst)
        fp8 = dst if mode == "quantise" else src
        if src.mla != dst.mla:
            raise ValueError(f"src_view is {'MLA (no V)' if src.mla else 'K and V'} but dst_view is "
                             f"{'MLA (no V)' if dst.mla else 'K and V'}")
        heads, head_dim = fp8.heads, fp8.head_dim
        if mode == "copy" and src.fmt != dst.fmt:
            raise ValueError(f"src_view holds {src.fmt} codes but dst_view {dst.fmt}: an FP8 copy does not convert "
                             "between formats")
        dtype = check_views(src, dst, mode, fp8, "FP8")
        for name, view in (("src_view", src), ("dst_view", dst)):  # FP8 kernels go head by head (a scale a head)
            for one in (view.codes, view.scales) if is_fp8(view) else (view,):
                if one.head_runs not in (1, heads):
                    raise ValueError(f"{name} ({one!r}) keeps its {heads} heads in {one.head_runs} groups: an FP8 copy "
                                     "goes head by head, which needs one head group or one head a group")
        self.first_layer, self.window = copy_window(src, dst, layers)
        place = Placement()
        self.src, src_scales = _sides(place, "src_view", src, False, self.first_layer, self.window)
        self.dst, dst_scales = _sides(place, "dst_view", dst, True, self.first_layer, self.window)
        self._placed(place, src, dst)
        self.fmt, self.codec, self.dtype = fp8.fmt, fp8.codec, dtype
        s, d = self.src, self.dst
        self.template = kernels.ScaledArgs(
            src_indices=0, dst_indices=0, num_items=0, items_per_warp=0, first_layer=self.first_layer,
            src_token_limit=self.tokens[0], dst_token_limit=self.tokens[1], num_layers=self.window, heads=heads,
            words=head_dim // 4, error_flag=guard.flag_address(), **kernel_numbers("src", s), src_page=s.page_size,
            **kernel_numbers("src_scales", src_scales), **kernel_numbers("dst", d), dst_page=d.page_size,
            **kernel_numbers("dst_scales", dst_scales))
        self.slots = _wide_slots(mode, heads, head_dim, self.device, src_scales or dst_scales,
                                 self.src if mode == "dequantise" else self.dst)
        shared = 0
        if self.slots and mode == "dequantise":
            dispatcher = dequantise_pipelined.get_kernel(s.parts, d.parts, src.mla, self.codec, dtype, head_dim,
                                                         dequantise_pipelined.takes_whole(heads, head_dim))
            shared = dequantise_pipelined.shared_bytes(heads, head_dim)
        elif self.slots:
            dispatcher = quantise_wide.get_kernel(s.parts, d.parts, src.mla, self.codec, dtype, self.slots, head_dim)
        else:
            dispatcher = kernels.get_kernel(s.parts, d.parts, src.mla, mode, self.codec, dtype)
        self._bound(dispatcher, kernels.SIGNATURE, shared)
        self.staged = fp8_staged_plan.bind_staged(self, src, dst)  # staged loads (kvnumba.plan.fp8_staged_plan)
        announce(self)

    def _placed(self, place: Placement, src: Any, dst: Any) -> None:
        """The plan's device and destinations once its sides are placed, checked clear of what the kernel reads;
        the views' tokens and labels for every call's index checks."""
        self.device, self.destinations, self.uses_torch = place.device(), place.destinations, place.torch
        check_disjoint(self.destinations, place.guides)
        self.clearance = Clearance(self.destinations)  # every call's index arrays against them
        self.tokens = (src.geometry.tokens, dst.geometry.tokens)
        self.labels = (f"src_view ({src!r})", f"dst_view ({dst!r})")
        self.windows = {0: CodecWindow(self.first_layer, self.tokens, self.labels)}
        self.flag = guard.flag_view()

    def _bound(self, dispatcher: Any, signature: Any, shared: int) -> None:
        """The plan's kernel bound to its template, and whether its calls check host indices."""
        self.kernel = BoundKernel(launchable(dispatcher, signature, shared), self.device, self.template)
        checks = config.tuning("host_index_checks")
        self.host_index_checks = checks is None or bool(checks)

    tables: tuple = ()  # no layer tables of the caller's to read again with checks on (KernelPlan.tables)

    def kernel_for(self, count: int, warps: int) -> tuple[Any, int]:
        """``(kernel, warps)``: the staged load for its calls (whose blocks may have fewer warps than asked for:
        ``dequantise_staged.WARPS``), else the plan's kernel in blocks of ``warps``."""
        if self.staged is not None:
            return self.staged.kernel_for(count, warps, self.kernel)
        return self.kernel, warps

    run = per_call.run  # a call as every kernel plan's: checked (plan.per_call.checked), then one launch

    def fast(self, src_indices: Any, dst_indices: Any, layer_id: Any, block_quota: Any = 2,
             num_warps_per_block: Any = 32, *, stream: Any = None, check: bool = False, route: Any = "auto") -> int:
        """A call as a plan's per-call path takes it (``KernelPlan.fast``'s arguments: ``layer_id`` is None
        for ``kv.copy``): a copy-engine route refused, then ``run``."""
        if routes.check_route(route) == "copy_engine":
            raise ValueError("route='copy_engine' cannot quantise or dequantise (nor copy FP8 views, whose scales are "
                             "4-byte items); use route='kernel'")
        return per_call.run(self, src_indices, dst_indices, None, block_quota, num_warps_per_block, stream, check)


class CodecWindow:
    """A codec plan's one layer window, read as ``plan.per_call`` reads a kernel plan's: the token limits that
    the host checks and the kernel's guard apply, the kernel parameters they set, and how errors name a side."""

    __slots__ = ("first_layer", "src_limit", "dst_limit", "params", "labels")

    def __init__(self, first_layer: int, tokens: tuple[int, int], labels: tuple[str, str]) -> None:
        self.first_layer = first_layer
        self.src_limit, self.dst_limit = tokens
        self.params = (first_layer, *tokens)  # first_layer, src_token_limit, dst_token_limit: as the template's
        self.labels = labels

    def what(self, plan: Any, side: str) -> str:
        return self.labels[side == "dst"]
