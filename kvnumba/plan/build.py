"""Building a kernel plan, or finding one of the same geometry to rebind: a miss on new buffers of a known
geometry is a rebind.

SGLang's per-layer calls pass a fresh ``pool[layer_id]`` view per call: new tensors, often new addresses of
a geometry seen before. For a seed entry point without layer tables whose sizes and buffers' geometry
(bytes, device, kind of memory, writability, 16-byte alignment: ``seed_args.shape_key``) were seen before,
the plan is the earlier one rebound to these addresses (``KernelPlan.rebind``): the checks that depend on
the geometry are not repeated; those that depend on addresses are. Anything else is built from scratch.
"""
from ..arrays import array_info
from ..checks import validate
from ..kernels.layouts import Layout
from .kernel_plan import KernelPlan
from ..memo import BoundedMemo
from .seed_args import shape_key, sizes_key, sizes_seen
from .spec import buffer_names

_shapes = BoundedMemo(1024)  # geometry key -> a plan of that geometry


def build_plan(spec, geometry, strict):
    """The plan for an entry point's geometry arguments: every argument checked (see the module docstring)."""
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


def clear_shapes():
    """Forget the geometries seen (settings read at plan build apply to the next plan)."""
    _shapes.clear()
    sizes_seen.clear()
