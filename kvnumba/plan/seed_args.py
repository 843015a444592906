"""A seed entry point's geometry arguments read as two sides: sizes validated, buffers and layer tables
resolved (``plan.sides``). SGLang passes the same sizes on every call and new buffers of one geometry on
many, so ``sizes`` is memoised by value, and ``shape_key`` (what a plan's checks depend on besides
addresses) lets ``plan.build`` rebind a plan instead of building one.
"""
from typing import Any, NamedTuple

from ..arrays import HOST
from ..checks import validate
from ..kernels.layouts import PARTS, Layout
from ..memo import BoundedMemo
from .cache import remembered
from .sides import Placement, Side, resolve_array, resolve_table, smaller
from .spec import buffer_names

TBL, PF, PH = Layout.LAYER_TABLE, Layout.PAGE_FIRST, Layout.PAGE_HEAD


class Sizes(NamedTuple):
    head_num: int
    page_size: int
    heads: int  # heads a copy goes by: head_num for page-head entry points, else 1
    item_size: int
    num_layers: int
    window: int  # layers one call moves
    src_dim: int  # src_layout_dim (0 if the entry point has none)
    dst_dim: int


class SeedSides(NamedTuple):
    """A seed entry point's arguments, resolved (``seed_sides``)."""

    sizes: Sizes
    src: Side
    dst: Side
    place: Placement
    memory: tuple[bool, bool]  # (source in host memory, destination in host memory)
    shape_key: Any  # the geometry a rebind finds this plan by; None with layer tables or unhashable sizes


def seed_sides(spec: Any, geometry: dict[str, Any], strict: bool) -> SeedSides:
    """The two sides of a seed entry point's call, every argument checked."""
    names = buffer_names(spec)
    sizes = validated_sizes(spec, geometry)
    place = Placement()
    infos, tables = {}, {}
    for name, layout, destination in zip(names, (spec.src_layout, spec.dst_layout) * 2, (False, True) * 2):
        if name is None:
            continue
        if layout is TBL:
            infos[name], tables[name] = resolve_table(place, name, geometry[name], sizes.num_layers, destination,
                                                      strict)
        else:
            infos[name] = resolve_array(place, name, geometry[name], destination)

    def side(layout: Layout, k: str, v: str | None, layout_dim: int) -> Side:
        label = k if v is None else f"{k}/{v}"
        ptrs = (infos[k].ptr, infos[v].ptr if v else 0)
        if layout is TBL:
            extents = smaller(tables[k].extents, tables[v].extents if v else None)
            return Side(name=label, parts=PARTS[layout], mla=v is None, layout_dim=layout_dim,
                        page_size=sizes.page_size, ptrs=ptrs, extents=extents)
        nbytes = infos[k].nbytes if v is None else min(infos[k].nbytes, infos[v].nbytes)
        return Side(name=label, parts=PARTS[layout], mla=v is None, layout_dim=layout_dim, page_size=sizes.page_size,
                    ptrs=ptrs, nbytes=nbytes)

    src = side(spec.src_layout, names[0], names[2], sizes.src_dim)
    dst = side(spec.dst_layout, names[1], names[3], sizes.dst_dim)
    key = sizes_key(spec, geometry)
    shape = None if tables or key is None else shape_key(key, infos.values())
    return SeedSides(sizes, src, dst, place, (infos[names[0]].device == HOST, infos[names[1]].device == HOST), shape)


def shape_key(key: tuple, infos: Any) -> tuple:
    """What a plan's checks depend on besides addresses: the sizes (``sizes_key``), and per buffer its bytes,
    device, writability, kind and 16-byte alignment."""
    return (key, *[(i.nbytes, i.device, i.writable, i.is_torch, not i.ptr % 16) for i in infos])


# --- sizes, validated once per set of values -----------------------------------------------------

_SIZE_NAMES = ("item_size", "src_layout_dim", "dst_layout_dim", "num_layers", "page_size", "head_num")
sizes_seen = remembered(BoundedMemo(4096))  # (entry point, sizes and their types) -> Sizes: checks depend on values only


def sizes_key(spec: Any, geometry: dict[str, Any]) -> tuple | None:
    """The key of an entry point's size arguments (with their types), or None if one is unhashable."""
    values = tuple(map(geometry.get, _SIZE_NAMES))
    key = (spec.name, *values, *map(type, values))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def validated_sizes(spec: Any, geometry: dict[str, Any]) -> Sizes:
    """The entry point's size arguments, validated (memoised by value: a miss on new buffers with
    known sizes does not check them again)."""
    key = sizes_key(spec, geometry)
    known = sizes_seen.get(key) if key is not None else None
    if known is None:
        known = _validate_sizes(spec, geometry)
        if key is not None:
            sizes_seen.remember(key, known)
    return known


def _validate_sizes(spec: Any, geometry: dict[str, Any]) -> Sizes:
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


def _layout_dim(name: str, value: Any, spec: Any, item_size: int, num_layers: int, heads: int) -> int:
    if spec.per_layer:  # its lower bound depends on layer_id: checked per layer (KernelPlan.window_for)
        value = validate.integer(name, value, minimum=0, maximum=validate.MAX_SIZE)
        if value % (8 * heads):
            return validate.layout_dim(name, value, item_size, 0, heads)
        return value
    return validate.layout_dim(name, value, item_size, num_layers, heads)
