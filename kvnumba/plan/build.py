"""Where a call's plan comes from: its entry point's plan cache (``plan.cache``), a plan of the same geometry
rebound to new buffers, or a new one: a kernel plan, a copy-engine plan (``direct_plan``) or, for ``kv.copy``
with a quantised view on a side, its codec's plan (by the view's ``codec.family``). A miss calls down from
here, never back up. ``caller`` and ``direct_caller`` make a plain entry point's per-call function.

A miss on new buffers of a known geometry is a rebind: SGLang's per-layer calls pass a fresh ``pool[layer_id]``
view per call, often at new addresses of a geometry seen before. For a seed entry point without layer tables
whose sizes and buffers' geometry (``seed_args.shape_key``) were seen before, the plan is the earlier one
rebound to these addresses (``KernelPlan.rebind``): only the checks that depend on addresses are repeated.
"""
from ..arrays import array_info
from ..checks import guard, validate
from ..driver import capture
from ..kernels.layouts import Layout
from ..memo import BoundedMemo
from .cache import PlanCache, remembered
from .direct_plan import DirectPlan
from .fp8_plan import Fp8Plan
from .kernel_plan import KernelPlan
from .nvfp4_plan import Nvfp4Plan
from .seed_args import shape_key, sizes_key, sizes_seen
from .spec import TBL, buffer_names

_shapes = remembered(BoundedMemo(1024))  # geometry key -> a plan of that geometry
CODEC_PLANS = {"fp8": Fp8Plan, "nvfp4": Nvfp4Plan}  # a quantised view's codec family -> its copy's plan


def geometry_names(spec):
    """The geometry arguments of ``spec``, in order (buffers first, then sizes)."""
    return tuple(n for n in spec.params if spec.role(n) == "geometry")


def destinations(spec):
    """The arguments of ``spec`` that are written: destination buffers, tables, lists or views."""
    return tuple(n for n in spec.buffers if n.startswith("dst"))


def plan_cache(spec):
    """An empty plan cache for ``spec``'s geometry: layer tables found by identity, other buffers by value."""
    written = destinations(spec)
    return PlanCache(identity=[i for i, n in enumerate(spec.buffers) if spec.kind == "kernel"
                               and spec.layout_of(n) is TBL],
                     destinations=[i for i, n in enumerate(spec.buffers) if n in written])


def build(spec, geometry, strict, stream=None):
    """A new plan for ``geometry`` (argument name -> value), every argument checked (``strict``: layer tables'
    contents read again); refused while ``stream`` (the call's) is being captured: building allocates and
    copies."""
    capture.refuse(capture.current_handle(stream), "building a plan (a first call with these buffers, or raw "
                   "layer tables read again with checks on: it allocates and copies)",
                   "make one call with the same buffers before the capture, or kv.prepare it there")
    if spec.name == "copy":  # a quantised view on either side: its codec's plan
        src, dst = geometry["src_view"], geometry["dst_view"]
        for family in (getattr(getattr(view, "codec", None), "family", None) for view in (src, dst)):
            if family is not None:
                return CODEC_PLANS[family](src, dst, geometry.get("layers"))
    if spec.kind == "kernel":
        return _kernel_plan(spec, geometry, strict)
    return DirectPlan(spec, geometry, strict)


def find(spec, cache, values, strict, stream=None):
    """The plan for geometry ``values`` (in ``geometry_names`` order), from ``cache`` or built and stored;
    with checks on (``strict``), one whose layer tables are read again."""
    arrays = len(spec.buffers)
    plan = cache.get(values[:arrays], values[arrays:], lambda: build(spec, _named(spec, values), False, stream))
    if strict and plan.tables:
        return build(spec, _named(spec, values), True, stream)
    return plan


def caller(spec, cache):
    """The per-call function of plain kernel entry point ``spec``: ``call(objects, scalars, src_indices,
    dst_indices, layer_id, block_quota, warps, stream, check, route="auto")``, ``objects`` its buffers and
    ``scalars`` its sizes, in argument order: the plan ``cache`` holds for them, else built and stored (with
    checks on, ``find``'s); then the plan's fast call."""
    lookup, add, names = cache.find, cache.add, geometry_names(spec)

    def call(objects, scalars, src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route="auto"):
        if check or guard.ALWAYS_CHECK:
            plan = find(spec, cache, objects + scalars, True, stream)
            check = True
        else:
            plan = lookup(objects, scalars)
            if plan is None:
                plan = add(objects, scalars, lambda: build(spec, dict(zip(names, objects + scalars)), False, stream))
        return plan.fast(src_indices, dst_indices, layer_id, block_quota, warps, stream=stream, check=check,
                         route=route)

    return call


def direct_caller(spec, cache):
    """``caller``'s twin for plain copy-engine entry point ``spec``: ``call(objects, scalars, src_indices,
    dst_indices, stream, check)``, then the plan's ``run`` (it reads no layer tables: checks need no other plan)."""
    names = geometry_names(spec)

    def call(objects, scalars, src_indices, dst_indices, stream, check):
        plan = cache.find(objects, scalars)  # looked up by name: scripts/direct_host_profile.py times it
        if plan is None:
            plan = cache.add(objects, scalars, lambda: build(spec, dict(zip(names, objects + scalars)), False, stream))
        plan.run(src_indices, dst_indices, stream, check)

    return call


def _named(spec, values):
    return dict(zip(geometry_names(spec), values))


def _kernel_plan(spec, geometry, strict):
    """A kernel plan for an entry point's geometry arguments: rebound where it can be."""
    if spec.name == "copy" or Layout.LAYER_TABLE in (spec.src_layout, spec.dst_layout):
        return KernelPlan(spec, geometry, strict)
    key = sizes_key(spec, geometry)
    if key is not None and key in sizes_seen:  # sizes known valid: describe the buffers first
        names = buffer_names(spec)
        infos = {}
        for name in names:
            if name is not None:
                info = infos[name] = array_info(geometry[name], name)
                if info.ptr & 7:
                    validate.aligned(name, info)
        template = _shapes.get(shape_key(key, infos.values()))
        if template is not None:
            return template.rebind(infos, names)
    plan = KernelPlan(spec, geometry, strict)
    if plan.shape_key is not None:
        _shapes.remember(plan.shape_key, plan)
    return plan
