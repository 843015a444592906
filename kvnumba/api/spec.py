"""The table of kvnumba's entry points (the seed's thirteen, and ``copy``): each one's arguments, in
order, with their defaults and roles, and for the seed's kernel entry points the layouts they move
between (``copy`` takes them from its views).

``prepare``, the plain entry points, the tests and the benchmark read this one table.

Roles:
- ``index``: ``src_indices`` / ``dst_indices``, new on almost every call;
- ``layer``: ``layer_id`` of a per-layer kernel entry point (it picks token limits, not buffers);
- ``launch``: ``block_quota`` / ``num_warps_per_block``;
- ``geometry``: everything else (buffers, tables, sizes): validated once per prepared transfer, or
  once per set of objects for plain calls.
"""
from typing import Any, NamedTuple

from ..kernels.layouts import Layout

REQUIRED = object()
LF, TBL, PF, PH = Layout.LAYER_FIRST, Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD

_ROLES = {"src_indices": "index", "dst_indices": "index", "block_quota": "launch", "num_warps_per_block": "launch"}


class Spec(NamedTuple):
    name: str
    params: tuple[str, ...]  # argument names, in order
    defaults: dict[str, Any]  # name -> default (the rest are required)
    kind: str  # "kernel" or "direct"
    src_layout: Layout | None = None  # kernel entry points only
    dst_layout: Layout | None = None
    mla: bool = False

    def role(self, name: str) -> str:
        if name == "layer_id":
            return "layer" if self.kind == "kernel" else "geometry"
        return _ROLES.get(name, "geometry")

    @property
    def per_layer(self) -> bool:
        return "layer_id" in self.params and self.kind == "kernel"


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
    Spec("copy", ("src_view", "dst_view") + _IDX + ("layers",) + _LAUNCH, dict(_LAUNCH_DEFAULTS, layers=None),
         "kernel"),
    Spec("transfer_kv_direct", ("src_layers", "dst_layers") + _IDX + ("page_size",), {}, "direct"),
    Spec("transfer_kv_per_layer_direct_pf_lf", ("src_ptrs", "dst_ptrs") + _IDX + ("layer_id", "page_size"), {},
         "direct"),
    Spec("transfer_kv_all_layer_direct_lf_pf", ("src_ptrs", "dst_ptrs") + _IDX + ("page_size",), {}, "direct"),
]}

KERNEL_ENTRY_POINTS = [name for name, spec in SPECS.items() if spec.kind == "kernel" and name != "copy"]
DIRECT_ENTRY_POINTS = [name for name, spec in SPECS.items() if spec.kind == "direct"]


def buffer_names(spec):
    """Argument names of (src_k, dst_k, src_v, dst_v) of a kernel entry point (V None for MLA)."""
    if spec.mla:
        return spec.params[0], spec.params[1], None, None
    return spec.params[:4]
