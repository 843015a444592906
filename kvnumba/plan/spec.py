"""The table of kvnumba's entry points (the seed's thirteen, and ``copy``): each one's arguments in order,
with defaults and roles, its layouts (``copy`` takes them from its views), MLA or not, one layer or all.
It is the one table: ``prepare``, the plain entry points, the plans, the tests and ``scripts/bench.py``
read it.

Roles: ``index`` (``src_indices``/``dst_indices``, new on almost every call); ``layer`` (a per-layer
entry point's ``layer_id``: it picks token limits, not buffers); ``launch`` (``block_quota``,
``num_warps_per_block``, ``kv.copy``'s ``route``); ``geometry``: everything else, validated once per
prepared transfer or per set of objects for plain calls (``Spec.buffers`` names the arrays).

A kernel entry point's layouts are ``kernels.layouts.Layout`` members; a copy-engine entry point moves
between lists of layer-first buffers and lists of page-first-direct buffers (``PAGE_FIRST_DIRECT``).
"""
from typing import Any, NamedTuple

from ..kernels.layouts import Layout

LF, TBL, PF, PH = Layout.LAYER_FIRST, Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD
PAGE_FIRST_DIRECT = "pfd"

# Geometry arguments that are sizes; the other geometry arguments are buffers (arrays, lists, views).
_SIZES = frozenset(("item_size", "num_layers", "src_layout_dim", "dst_layout_dim", "page_size", "head_num",
                    "layer_id", "layers"))

_ROLES = {"src_indices": "index", "dst_indices": "index", "block_quota": "launch", "num_warps_per_block": "launch",
          "route": "launch"}


class Spec(NamedTuple):
    name: str
    params: tuple[str, ...]  # argument names, in order
    defaults: dict[str, Any]  # name -> default (the rest are required)
    kind: str  # "kernel" or "direct"
    src_layout: object = None  # a Layout, or PAGE_FIRST_DIRECT; None for copy (its views carry them)
    dst_layout: object = None
    mla: bool = False  # kernel entry points (a copy-engine call is MLA when its page-first list holds one buffer)
    keyword_only: tuple[str, ...] = ()  # arguments given by keyword only (kv.copy's launch shape)

    def role(self, name: str) -> str:
        if name == "layer_id":
            return "layer" if self.kind == "kernel" else "geometry"
        return _ROLES.get(name, "geometry")

    def layout_of(self, name: str) -> object:
        """The layout of buffer argument ``name`` of a kernel entry point (its side's); None for ``copy``."""
        if self.kind != "kernel" or self.src_layout is None:
            return None
        names = buffer_names(self)
        return self.src_layout if name in (names[0], names[2]) else self.dst_layout

    @property
    def per_layer(self) -> bool:
        """A kernel entry point whose calls each pick a layer (``layer_id`` changes per call)."""
        return "layer_id" in self.params and self.kind == "kernel"

    @property
    def one_layer(self):
        """Moves one layer per call: it picks a layer (``layer_id``), or it is a kernel between two
        layer-first buffers (a layer each). The others move every layer of their tables or lists."""
        return "layer_id" in self.params or (self.kind == "kernel" and self.src_layout is LF and self.dst_layout is LF)

    @property
    def buffers(self):
        """The arguments that are buffers (arrays, tables, lists of arrays, views), in order."""
        return tuple(n for n in self.params if self.role(n) == "geometry" and n not in _SIZES)


_LAUNCH = ("block_quota", "num_warps_per_block")
_LAUNCH_DEFAULTS = {"block_quota": 2, "num_warps_per_block": 32}
_KV = ("src_k", "dst_k", "src_v", "dst_v")
_KV_TABLES = ("src_k_layers", "dst_k_layers", "src_v_layers", "dst_v_layers")
_IDX = ("src_indices", "dst_indices")


def _kernel(name, params, src, dst, mla):
    return Spec(name, params + _LAUNCH, dict(_LAUNCH_DEFAULTS), "kernel", src, dst, mla)


SPECS = {spec.name: spec for spec in [
    _kernel("transfer_kv_per_layer", _KV + _IDX + ("item_size",), LF, LF, False),
    _kernel("transfer_kv_per_layer_pf_lf", _KV + _IDX + ("layer_id", "item_size", "src_layout_dim"), PF, LF, False),
    _kernel("transfer_kv_per_layer_ph_lf",
            _KV + _IDX + ("layer_id", "item_size", "src_layout_dim", "page_size", "head_num"), PH, LF, False),
    _kernel("transfer_kv_all_layer", _KV_TABLES + _IDX + ("item_size", "num_layers"), TBL, TBL, False),
    _kernel("transfer_kv_all_layer_lf_pf",
            ("src_k_layers", "dst_k", "src_v_layers", "dst_v") + _IDX + ("item_size", "dst_layout_dim", "num_layers"),
            TBL, PF, False),
    _kernel("transfer_kv_all_layer_lf_ph",
            ("src_k_layers", "dst_k", "src_v_layers", "dst_v") + _IDX
            + ("item_size", "dst_layout_dim", "num_layers", "page_size", "head_num"), TBL, PH, False),
    _kernel("transfer_kv_per_layer_mla", ("src", "dst") + _IDX + ("item_size",), LF, LF, True),
    _kernel("transfer_kv_per_layer_mla_pf_lf", ("src", "dst") + _IDX + ("layer_id", "item_size", "src_layout_dim"),
            PF, LF, True),
    _kernel("transfer_kv_all_layer_mla", ("src_layers", "dst_layers") + _IDX + ("item_size", "num_layers"),
            TBL, TBL, True),
    _kernel("transfer_kv_all_layer_mla_lf_pf",
            ("src_layers", "dst") + _IDX + ("item_size", "dst_layout_dim", "num_layers"), TBL, PF, True),
    Spec("copy", ("src_view", "dst_view") + _IDX + ("layers",) + _LAUNCH + ("route",),
         dict(_LAUNCH_DEFAULTS, layers=None, route="auto"), "kernel", keyword_only=_LAUNCH + ("route",)),
    Spec("transfer_kv_direct", ("src_layers", "dst_layers") + _IDX + ("page_size",), {}, "direct", LF, LF),
    Spec("transfer_kv_per_layer_direct_pf_lf", ("src_ptrs", "dst_ptrs") + _IDX + ("layer_id", "page_size"), {},
         "direct", PAGE_FIRST_DIRECT, LF),
    Spec("transfer_kv_all_layer_direct_lf_pf", ("src_ptrs", "dst_ptrs") + _IDX + ("page_size",), {}, "direct",
         LF, PAGE_FIRST_DIRECT),
]}

KERNEL_ENTRY_POINTS = [name for name, spec in SPECS.items() if spec.kind == "kernel" and name != "copy"]
DIRECT_ENTRY_POINTS = [name for name, spec in SPECS.items() if spec.kind == "direct"]


def buffer_names(spec):
    """Argument names of (src_k, dst_k, src_v, dst_v) of a kernel entry point (V None for MLA)."""
    if spec.mla:
        return spec.params[0], spec.params[1], None, None
    return spec.params[:4]
