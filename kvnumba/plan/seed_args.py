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

TBL, PH = Layout.LAYER_TABLE, Layout.PAGE_HEAD


class Sizes(NamedTuple):
    head_num: int
    page_size: int
    heads: int  # heads a copy goes by: head_num for page-head entry points, else 1
    item_size: int
    num_layers: int  # layers one call moves
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
        table = layout is TBL  # a table's layers bound it (extents), a buffer its bytes
        extents = smaller(tables[k].extents, tables[v].extents if v else None) if table else None
        nbytes = None if table else min(infos[n].nbytes for n in (k, v) if n)
        return Side(name=label, parts=PARTS[layout], mla=v is None, layout_dim=layout_dim, page_size=sizes.page_size,
                    ptrs=(infos[k].ptr, infos[v].ptr if v else 0), nbytes=nbytes, extents=extents)

    src = side(spec.src_layout, names[0], names[2], sizes.src_dim)
    dst = side(spec.dst_layout, names[1], names[3], sizes.dst_dim)
    key = sizes_key(spec, geometry)
    shape = None if tables or key is None else shape_key(key, infos.values())
    return SeedSides(sizes, src, dst, place, (infos[names[0]].device == HOST, infos[names[1]].device == HOST), shape)


def shape_key(key: tuple, infos: Any) -> tuple:
    """What a plan's checks depend on besides addresses: the sizes (``sizes_key``), and per buffer its bytes,
    device, writability, kind and 16-byte alignment."""
    return (key, *[(i.nbytes, i.device, i.writable, i.is_torch, not i.ptr % 16) for i in infos])


_SIZE_NAMES = ("item_size", "src_layout_dim", "dst_layout_dim", "num_layers", "page_size", "head_num")
sizes_seen = remembered(BoundedMemo(4096))  # (entry point, sizes and their types) -> Sizes


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
    def size(name: str) -> int:  # a positive size, 1 where the entry point takes none
        return validate.integer(name, geometry[name], minimum=1, maximum=validate.MAX_SIZE) if name in geometry else 1

    head_num, page_size = size("head_num"), size("page_size")
    heads = head_num if PH in (spec.src_layout, spec.dst_layout) else 1
    item_size = validate.item_size(geometry.get("item_size"), heads)
    num_layers = size("num_layers") if TBL in (spec.src_layout, spec.dst_layout) else 1
    needed = 0 if spec.per_layer else num_layers  # per layer, the lower bound depends on layer_id (window_for)
    dims = [validate.layout_dim(name, geometry[name], item_size, needed, heads) if name in geometry else 0
            for name in ("src_layout_dim", "dst_layout_dim")]
    return Sizes(head_num, page_size, heads, item_size, num_layers, *dims)
