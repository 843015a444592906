"""Files converted from or to SGLang's page-unified pool (``kvnumba.convert.unified``): a pool holds K and V
in one array, so a file's arrays ``k`` and ``v`` pair with the pool ``kv`` (the rules, one per direction:
docs/guides/convert.md). The outputs are described as the input's ``Item``s are, so the writers, the checks
of the output format and the all-or-nothing rule are the file converter's (``kvnumba.convert.files``).
"""
from .inputs import Item, Source
from . import unified

POOL, K, V = "kv", "k", "v"


def _where(in_path, kind, name):
    return in_path if kind == ".npy" else f"{in_path}[{name}]"


def outputs(source, kind, in_path, src, dst, page_size, head_groups):
    """``(Source of the outputs, {output name: shape}, {output name: (input items, part)})`` for a conversion
    from or to a pool (part: 0 for K, 1 for V out of one pool), every input's shape checked: ``ValueError``
    naming the file (and the array) otherwise."""
    plans = []  # (output name, inputs, part)
    items = list(source.items)
    if src.kv_pool and not dst.kv_pool:
        for item in items:
            if len(item.shape) != 7:  # an MLA pool (or not a pool: planned() says so)
                plans.append((item.name, [item], 0))
            elif kind == ".npy" or item.name == POOL:
                plans += [(K, [item], 0), (V, [item], 1)]
            else:
                raise ValueError(f"{_where(in_path, kind, item.name)}: a page_unified pool of K and V converts into "
                                 f"arrays named {K!r} and {V!r}: store it as {POOL!r}")
    elif dst.kv_pool and not src.kv_pool:
        by_name = {item.name: item for item in items}
        paired = K in by_name and V in by_name
        for item in items:
            if paired and item.name == K:
                plans.append((POOL, [by_name[K], by_name[V]], 0))
            elif not (paired and item.name == V):
                plans.append((item.name, [item], 0))
    else:
        plans = [(item.name, [item], 0) for item in items]
    names = [name for name, _, _ in plans]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{in_path}: converting it would write {', '.join(map(repr, twice))} twice (the names "
                         f"{K!r}, {V!r} and {POOL!r} pair K and V with a page_unified pool): rename one")
    out_items, shapes, made_of = [], {}, {}
    for name, inputs, part in plans:
        dtypes = {str(i.dtype) for i in inputs}
        if len(dtypes) > 1:
            raise TypeError(f"{in_path}: K and V must have one dtype, got {inputs[0].dtype} and {inputs[1].dtype}")
        where = _where(in_path, kind, inputs[0].name) if len(inputs) == 1 else f"{in_path}[{K}, {V}]"
        try:
            mha = len(inputs) == 2 or (src.kv_pool and len(inputs[0].shape) == 7)
            planned = unified.planned([i.shape for i in inputs], src, dst, page_size, head_groups if mha else None,
                                      argument=where)  # an MLA pool has no head groups: they are K and V's
        except ValueError as err:
            text = str(err)
            raise ValueError(text if text.startswith(where) else f"{where}: {text}") from None
        shape = planned.shapes[min(part, len(planned.shapes) - 1)]
        out_items.append(Item(name, shape, inputs[0].dtype, inputs[0].load))
        shapes[name] = shape
        made_of[name] = (inputs, part)
    return Source(out_items, source.compressed, source.metadata, pooled=True), shapes, made_of


def fill(out_item, out, made_of, src, dst, page_size, copy_views):
    """Write the output ``out`` (for ``out_item``) from its inputs, one picture at a time through
    ``copy_views(source, destination)`` (the file converter's chunked copy)."""
    inputs, part = made_of[out_item.name]
    arrays = [item.load() for item in inputs]
    pics = unified.pictures(arrays, [out], src, dst, page_size)
    for source, destination in zip(pics.sources[part:], pics.destinations):
        copy_views(source, destination)


__all__ = ["K", "POOL", "V", "fill", "outputs"]
