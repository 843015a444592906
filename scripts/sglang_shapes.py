"""SGLang's own call shapes, for ``scripts/bench.py``: its ``sglang`` rows.

SGLang does not pass the same objects twice. Its layer-first host pool is one tensor ``[L, T, ...]``
and ``load_to_device_per_layer`` passes ``host_pool[layer_id]``, a fresh view, on every call; every
batch brings new index tensors. These cases call kvnumba (and the reference, on the same buffers) the
way SGLang does:

- ``fresh-view <entry point>``: every per-layer entry point, host->device, with every buffer a fresh
  view (``root[0]``) on each call, the same index tensors;
- ``layer loop lf`` / ``layer loop pf``: HiCache's load of one batch, all ``L`` layers, one call per
  layer: fresh host views of a layer-first pool (or the page-first pool itself), the same device
  tensors, new index tensors for every batch. Host us are per layer call, GB/s over the whole loop;
- ``miss <kernel>``: a per-layer load whose plan is not cached (its entry point's cache emptied first),
  with the staged kernel and with the register kernel (``KVNUMBA_LOAD_PATH``).

``rows(backend, shape, reference)`` returns one record per case, with the keys bench.py prints;
``cases(shape)`` their ``"case"`` strings, in the same order, without measuring anything.
"""
import dataclasses

import numpy as np

import kvnumba
import kvnumba.config
from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS
from kvnumba.api.transfer import plain

ITEM = {"mha": 2048, "mla": 1152}
HEADS = {"mha": 8, "mla": 1}
LOOP_TOKENS = 512  # one batch of the layer loop: 8 pages of 64 (the staged kernel's smallest auto call)


def per_layer_entry_points():
    return [name for name in KERNEL_ENTRY_POINTS if SPECS[name].one_layer]


class Roots:
    """Pools with a leading axis, so that ``root[0]`` (or ``root[layer]``) is a fresh view each call."""

    def __init__(self, backend, shape):
        self.backend, self.shape = backend, shape

    def pool(self, where, model, layout):
        s, item = self.shape, ITEM[model]
        T, L, P, H = s.pool, s.layers, s.page_size, HEADS[model]
        shapes = {"lf": (L, T, item), "pf": (1, T, L, item), "ph": (1, T // P, H, P, L, item // H)}
        nbytes = int(np.prod(shapes[layout]))
        return self.backend.buffer(nbytes, where).reshape(shapes[layout])


def _layouts(op):
    spec = SPECS[op]
    return spec.src_layout.value, spec.dst_layout.value


def _args(op, model, src, dst, si, di, shape, block_quota):
    """The entry point's arguments by name: ``src``/``dst`` are (K, V) pairs (V None for MLA)."""
    spec = SPECS[op]
    item = ITEM[model]
    names = spec.params
    values = dict(src_indices=si, dst_indices=di, layer_id=min(3, shape.layers - 1), item_size=item,
                  src_layout_dim=shape.layers * item, page_size=shape.page_size, head_num=HEADS[model],
                  block_quota=block_quota, num_warps_per_block=shape.warps)
    if spec.mla:
        values.update(src=src[0], dst=dst[0])
    else:
        values.update(src_k=src[0], dst_k=dst[0], src_v=src[1], dst_v=dst[1])
    return tuple(values[n] for n in names)


def fresh_view_call(module, op, roots, idx, shape, block_quota):
    """A call of ``module.op`` host->device with fresh views of every buffer, and the bytes it moves."""
    model = "mla" if SPECS[op].mla else "mha"
    src_layout, dst_layout = _layouts(op)
    kinds = 1 if model == "mla" else 2
    src_roots = [roots.pool("host", model, src_layout) for _ in range(kinds)]
    dst_roots = [roots.pool("device", model, dst_layout) for _ in range(kinds)]
    fn = getattr(module, op)
    si, di = idx

    def call():
        src = [r[0] for r in src_roots] + [None]
        dst = [r[0] for r in dst_roots] + [None]
        fn(*_args(op, model, src, dst, si, di, shape, block_quota))

    return call, shape.tokens * ITEM[model] * kinds


def layer_loop(module, layout, roots, rng, shape, block_quota, tokens=LOOP_TOKENS):
    """One batch of HiCache's per-layer load: new index tensors, then one call per layer. Returns the
    batch's call and the bytes it moves."""
    backend, L, item = roots.backend, shape.layers, ITEM["mha"]
    if layout == "lf":
        host = [roots.pool("host", "mha", "lf") for _ in range(2)]  # [L, T, item] each
    else:
        host = [roots.pool("host", "mha", "pf")[0] for _ in range(2)]  # [T, L, item]
    device = [[backend.buffer(shape.pool * item, "device").reshape(shape.pool, item) for _ in range(L)] for _ in range(2)]
    pages = rng.choice(shape.pool // shape.page_size, tokens // shape.page_size, replace=False)
    src_np = (pages[:, None] * shape.page_size + np.arange(shape.page_size)).reshape(-1).astype(np.int64)
    dst_np = rng.permutation(shape.pool)[:tokens].astype(np.int64)
    si0, di0 = backend.indices(src_np), backend.indices(dst_np)
    per_layer = module.transfer_kv_per_layer if layout == "lf" else module.transfer_kv_per_layer_pf_lf

    def batch():
        si, di = _new(si0), _new(di0)  # every batch brings new index tensors
        for layer in range(L):
            if layout == "lf":
                per_layer(host[0][layer], device[0][layer], host[1][layer], device[1][layer], si, di, item,
                          block_quota, shape.warps)
            else:
                per_layer(host[0], device[0][layer], host[1], device[1][layer], si, di, layer, item, L * item,
                          block_quota, shape.warps)

    return batch, tokens * item * 2 * L


def _new(indices):
    return indices.clone() if hasattr(indices, "clone") else indices.copy()


def _fresh_view_case(op):
    return f"sglang fresh-view {op} h2d"


def _loop_case(layout, shape):
    return f"sglang layer loop {layout} h2d ({shape.layers} layers, {min(LOOP_TOKENS, shape.tokens)} tokens)"


def _miss_case(op, kernel):
    return f"sglang miss {op} h2d ({kernel} kernel)"


MISS_OP = "transfer_kv_per_layer"
MISS_KERNELS = ("staged", "register")


def cases(shape):
    """The ``"case"`` string of every record ``rows`` yields at ``shape``, in order."""
    return ([_fresh_view_case(op) for op in per_layer_entry_points()] + [_loop_case(lo, shape) for lo in ("lf", "pf")]
            + [_miss_case(MISS_OP, kernel) for kernel in MISS_KERNELS])


def rows(backend, shape, reference, block_quota, skip=()):
    """Every case of the module docstring, for kvnumba and ``reference`` (or None), one record at a time.

    Cases whose ``"case"`` string is in ``skip`` are neither measured nor yielded (``bench.py --resume``).
    Skipping the ``lf`` layer loop draws other (equally random) pages for the ``pf`` one."""
    roots = Roots(backend, shape)
    rng = np.random.default_rng(1)
    pages = rng.choice(shape.pool // shape.page_size, shape.tokens // shape.page_size, replace=False)
    si = (pages[:, None] * shape.page_size + np.arange(shape.page_size)).reshape(-1).astype(np.int64)
    di = rng.permutation(shape.pool)[:shape.tokens].astype(np.int64)
    idx = (backend.indices(si), backend.indices(di))
    impls = {"kvnumba": kvnumba}
    if reference is not None:
        impls["reference"] = reference
    for op in per_layer_entry_points():
        if _fresh_view_case(op) in skip:
            continue
        record = {"op": op, "case": _fresh_view_case(op), "direction": "h2d", "tokens": shape.tokens}
        for name, module in impls.items():
            call, nbytes = fresh_view_call(module, op, roots, idx, shape, block_quota)
            _measure(record, name, call, nbytes, shape)
        yield record
    loop_shape = dataclasses.replace(shape, repeat=max(shape.groups, shape.repeat // 5))
    for layout in ("lf", "pf"):
        if _loop_case(layout, shape) in skip:
            continue
        record = {"op": "layer loop", "case": _loop_case(layout, shape), "direction": "h2d",
                  "tokens": min(LOOP_TOKENS, shape.tokens)}
        for name, module in impls.items():
            call, nbytes = layer_loop(module, layout, roots, rng, shape, block_quota, min(LOOP_TOKENS, shape.tokens))
            _measure(record, name, call, nbytes, loop_shape, calls_per_run=shape.layers)
        yield record
    op = MISS_OP
    for kernel in MISS_KERNELS:
        if _miss_case(op, kernel) in skip:
            continue
        with kvnumba.config.override(load_path="auto" if kernel == "staged" else "register"):
            call, nbytes = fresh_view_call(kvnumba, op, roots, idx, shape, block_quota)
            cache = plain(op)._cache

            def miss(call=call, cache=cache):
                cache.clear()
                call()

            record = {"op": op, "case": _miss_case(op, kernel), "direction": "h2d", "tokens": shape.tokens}
            _measure(record, "kvnumba", miss, nbytes, shape)
            record["plan_kernel"] = _kernel_of(op)
            yield record


def _kernel_of(op):
    """Which kernel the last plan of ``op`` chose (to show that a miss does not fall back)."""
    entries = list(plain(op)._cache.entries.values())
    if not entries:
        return None
    plan = entries[-1].plan
    return "staged" if plan.kernel is not plan.register_kernel else "register"


def _measure(record, name, call, nbytes, shape, calls_per_run=1):
    seconds = shape.device_seconds(call)
    record["bytes"] = nbytes
    record[f"{name}_gbps"] = nbytes / seconds / 1e9
    record[f"{name}_host_us"] = shape.host_seconds(call) * 1e6 / calls_per_run
