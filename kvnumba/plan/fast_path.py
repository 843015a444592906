"""The hot path of a kernel transfer: torch index tensors on the plan's GPU, nothing unusual.

SGLang calls a per-layer load once per layer of every forward pass, with torch tensors; each call's
host time is on the scheduler's critical path. ``make_fast_call(plan)`` returns a function that does
what ``KernelPlan.run`` does for that common case in as few Python operations as it can: a handful
of attribute reads per index tensor, one ``struct.pack_into``, one ``cuLaunchKernel`` (the driver
layer's ``launch_shape`` and ``BoundKernel.launch``, inlined with the kernels' ``launch_values``: a Python
call costs ~0.1 us on the H200's host; ``tests/kernels/test_launch.py`` checks the two launch alike). Anything it
does not recognise (another array type, host indices, a pending error flag, ``check=True``, an
index array overlapping a destination, zero items) goes to ``plan.run``, which checks everything
and gives the errors; so both paths accept and refuse exactly the same calls.

SGLang loads every layer of a batch with the same two index tensors. The last pair that passed every
check is remembered (weakly, process-wide, across plans): the same objects, with the same data
pointers and lengths, skip the dtype, stride and device reads (~0.4 us). Those cannot change without
the pointer or the length changing, short of ``tensor.data = ...`` tricks, and the kernel bounds
every index in any case.
"""
import sys
import weakref

from ..checks import guard
from ..checks.overlap import merged, overlaps_any
from ..driver.bindings import cu
from ..driver.lanes import LaneStream
from ..driver.launch import MAX_QUOTA, MAX_WARPS, STREAM_OBJECTS, WARP_SIZE, stream_object
from ..driver.target import SIMULATOR
from ..kernels.params import pack_call
from . import routes


def _dead():
    return None


# The last index pair that passed every check: (weakref, weakref, src ptr, dst ptr, count, device).
_LAST_INDICES = [(_dead, _dead, 0, 0, 0, -2)]


def make_fast_call(plan, snapshot=None, *, torch=None, launch=None):
    """``call(src_indices, dst_indices, layer_id, block_quota=2, num_warps_per_block=32, *, stream=None,
    check=False, route="auto")`` for ``plan`` (``route``: ``kv.copy``'s, ``plan.routes``; torch indices on the GPU
    always take the kernel) (``layer_id`` is ignored by all-layer plans). ``snapshot``: a prepared
    transfer's bound buffers (``kvnumba.api.snapshot``), checked first on every call.

    ``torch`` (default: the imported torch module) and ``launch`` (default: ``cuLaunchKernel``) are for
    tests: with a stand-in for each, the inlined launch runs on the simulator too (tests/kernels/test_launch.py)."""
    run = plan.run
    if torch is None:
        torch = sys.modules.get("torch")
    if (SIMULATOR and launch is None) or guard.ALWAYS_CHECK or torch is None:
        verify = snapshot.verify if snapshot is not None else None

        def checked(src_indices, dst_indices, layer_id, block_quota=2, num_warps_per_block=32, *, stream=None,
                    check=False, route="auto"):
            if verify is not None:
                verify()
            return run(src_indices, dst_indices, layer_id, block_quota, num_warps_per_block, stream, check, route)

        checked.__name__ = checked.__qualname__ = plan.spec.name
        return checked
    tensor, int64, one = torch.Tensor, torch.int64, (1,)
    current_stream = torch._C._cuda_getCurrentRawStream
    flag, packed, per_layer = plan.flag, plan.packed, plan.spec.per_layer
    device, low, high = plan.device, plan.dst_low, plan.dst_high
    starts, ends = merged(plan.destinations)
    # The plan's kernel, and the register kernel for calls below plan.staged_from items (the same kernel
    # unless the plan is staged: kvnumba.plan.staged_plan); one-warp blocks take the narrow build.
    staged_launch, register_launch = plan.kernel.launch_values, plan.register_kernel.launch_values
    staged_from = plan.staged_from
    streams, new_stream, cu_launch = STREAM_OBJECTS, stream_object, launch or cu.cuLaunchKernel
    routed, record = plan.spec.name == "copy", routes.log.record  # kv.copy says which route it took
    last = _LAST_INDICES
    data_ptr = tensor.data_ptr
    # A prepared transfer's torch buffers: their data pointers, read here; anything else: changed().
    watched = expected = None
    others = False
    if snapshot is not None:
        watched, expected, others = snapshot.tensors, snapshot.pointers, snapshot.watches_others

    def call(src_indices, dst_indices, layer_id, block_quota=2, num_warps_per_block=32, *, stream=None, check=False,
             route="auto"):
        warps = num_warps_per_block
        if watched is not None and (list(map(data_ptr, watched)) != expected or (others and snapshot.changed())):
            snapshot.verify()  # raises, naming the buffer that moved
        if (flag[0] or check or type(src_indices) is not tensor or type(dst_indices) is not tensor
                or type(block_quota) is not int or type(warps) is not int or (route != "auto" and route != "kernel")):
            return run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
        window = packed.get(layer_id if per_layer else 0) if type(layer_id) is int or not per_layer else None
        src, dst = src_indices.data_ptr(), dst_indices.data_ptr()
        count = src_indices.numel()
        seen = last[0]
        if not (seen[0]() is src_indices and seen[1]() is dst_indices and seen[2] == src and seen[3] == dst
                and seen[4] == count and seen[5] == device and dst_indices.numel() == count):
            if (src_indices.dtype is not int64 or dst_indices.dtype is not int64
                    or src_indices.stride() != one or dst_indices.stride() != one
                    or src_indices.get_device() != device or dst_indices.get_device() != device
                    or (src | dst) & 7 or count != dst_indices.numel() or not count):
                return run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
            last[0] = (weakref.ref(src_indices), weakref.ref(dst_indices), src, dst, count, device)
        if (window is None or not (0 < block_quota <= MAX_QUOTA and 0 < warps <= MAX_WARPS)
                or (src < high and src + 8 * count > low and overlaps_any(starts, ends, src, src + 8 * count))
                or (dst < high and dst + 8 * count > low and overlaps_any(starts, ends, dst, dst + 8 * count))):
            return run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
        items_per_warp = -(-count // (block_quota * warps))  # driver.launch.launch_shape, inlined
        grid = -(-count // (items_per_warp * warps))
        if stream is None:
            handle = current_stream(device)
        elif type(stream) is int:
            handle = stream
        elif type(stream) is LaneStream:  # an SM lane's (kvnumba.driver.lanes)
            handle = stream.handle
        else:
            return run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
        if warps > 1:  # plan.kernel_for, inlined
            blocks, function, retry, shared = staged_launch if count >= staged_from else register_launch
        else:
            narrow = plan.narrow_kernel
            if narrow is None:  # bound on its first call, by run
                return run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
            blocks, function, retry, shared = narrow.launch_values
        view, address = blocks.pair
        pack_call(view, 0, src, dst, count, items_per_warp, *window)
        cu_stream = streams.get(handle)
        if cu_stream is None:
            cu_stream = new_stream(handle)
        (err,) = cu_launch(function, grid, 1, 1, warps * WARP_SIZE, 1, 1, shared, cu_stream, address, 0)
        if err:  # another context is current (pushed and retried), or a real error (raised)
            retry(err, grid, warps * WARP_SIZE, cu_stream, address)
        if routed:
            record("kernel")
        return handle

    call.__name__ = call.__qualname__ = plan.spec.name  # Python's own argument errors name the entry point
    return call
