"""What every call of a kernel plan does: ``run``, the general path (every check, every error), and
``make_fast_call``, the one form of it inlined for the hot case.

Why a fast call: SGLang calls a per-layer load once per layer of every forward pass, on the scheduler's
critical path. The fast call recognises only the common case (torch index tensors on the plan's GPU, int
launch sizes, a known layer) and does ``run``'s work in as few Python operations as it can, with the driver
layer's ``launch_shape`` and ``BoundKernel.launch`` inlined; anything else goes to ``run``. For the same plan
and arguments the two accept and refuse the same calls and write the same bytes (``tests/test_fast_call.py``).

SGLang loads every layer of a batch with the same two index tensors, so the last pair that passed every
check is remembered (weakly): the same objects with the same data pointers and lengths skip the dtype, stride
and device reads, which cannot change without the pointer or the length changing.
"""
import sys
import weakref
from typing import Any, NamedTuple

import numpy as np

from ..arrays import HOST, array_info, typed_address
from ..checks import bounds, guard, validate
from ..checks.devices import call_stream
from ..checks.overlap import overlaps_any
from ..driver import capture
from ..driver.bindings import cu
from ..driver.devices import on_device
from ..driver.lanes import LaneStream
from ..driver.launch import MAX_QUOTA, MAX_WARPS, STREAM_OBJECTS, WARP_SIZE, launch_shape, stream_object
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError, IndexOutOfRangeError
from ..kernels.params import NO_LIMIT, pack_call
from . import routes


def run(plan, src_indices, dst_indices, layer_id=None, block_quota=2, num_warps_per_block=32, stream=None,
        check=False, route="kernel"):
    """One transfer: ``checked``, then launch (``check``: wait and raise if the kernel skipped items), or for
    ``kv.copy`` by copy engine (``plan.routes``). Nothing is written when a check fails."""
    if route != "kernel":
        route = routes.check_route(route)
    call = checked(plan, src_indices, dst_indices, layer_id, block_quota, num_warps_per_block, stream, check, route)
    src, dst, count, warps, window, handle, host_side, check, block_quota = call[:9]  # count: call.items
    if count == 0:
        return handle
    if route != "kernel" and by_copy_engine(plan, route, call, src_indices, dst_indices):
        return handle
    # A staged block needs two warps; small loads are faster on registers (kvnumba.plan.staged_plan).
    kernel, warps = plan.kernel_for(count, warps)
    items_per_warp, grid, threads = launch_shape(count, block_quota, warps)
    if plan.spec.name == "copy":
        routes.log.record("kernel")
    if host_side and not SIMULATOR:
        _run_host_indices(plan, kernel, src, dst, count, items_per_warp, grid, threads, window, handle)
    else:
        blocks = kernel.blocks
        pack_call(blocks.view, 0, src.address, dst.address, count, items_per_warp, *window.params)
        kernel.launch(grid, threads, handle, blocks.address)
    if check:
        wait_and_check(plan, handle, src_indices, dst_indices, window)
    return handle


class Checked(NamedTuple):
    """A call that passed ``checked``: what launching it needs."""

    src: "Index"
    dst: "Index"
    items: int  # the indices' length
    warps: int
    window: Any  # the plan's LayerWindow for the call's layers
    handle: int  # the stream
    host_side: bool  # an index array in host memory (or on the simulator)
    check: bool  # wait and raise after the launch (check=True or KVNUMBA_CHECK)
    block_quota: int
    values: tuple  # the host values of (src, dst) checked on the host, read once (None for either not read)
    deferred: bool = False  # host indices left for by_copy_engine to check (its one pass does)


def checked(plan, src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route="kernel"):
    """Every check of a call of ``plan`` before anything is launched (``run``'s and the resident loader's):
    a pending error flag, the layer, the launch shape, the index arrays, the stream, and what a stream being
    captured cannot hold. Raises; writes nothing. A call that may go by copy engine (``route`` not "kernel")
    leaves its host indices' values to ``by_copy_engine``, which checks them in the pass that reads them."""
    if plan.flag[0]:
        guard.raise_pending()
    if not plan.spec.per_layer:
        window = plan.windows[0]
    else:  # a bool or NumPy integer must not hit an int's entry: window_for validates it
        window = plan.windows.get(layer_id) if type(layer_id) is int else None
    if window is None:
        window = plan.window_for(layer_id)
    if type(block_quota) is not int or type(warps) is not int or not (
            0 < block_quota <= MAX_QUOTA and 0 < warps <= MAX_WARPS):
        block_quota, warps = validate.launch_config(block_quota, warps)
    check = check or guard.ALWAYS_CHECK
    src = _index(src_indices, "src_indices", plan.device)
    dst = _index(dst_indices, "dst_indices", plan.device)
    count = src.length
    if count != dst.length:
        validate.same_length(array_info(src_indices, "src_indices"), array_info(dst_indices, "dst_indices"))
    _clear_of_destinations(plan, src, dst)
    host_side = src.on_host or dst.on_host
    values = (None, None)  # the host values checked here, read once: the copy engine takes them too
    deferred = False
    if host_side and count and plan.host_index_checks:
        if route != "kernel" and plan.engine is not None:
            deferred = True
        else:
            values = _check_host_indices(plan, src, dst, window)
    handle = call_stream(stream, plan.device, plan.uses_torch or src.torch or dst.torch)
    if count:
        if host_side and not SIMULATOR:
            capture.refuse(handle, "a call with indices in host memory",
                           "pass GPU index arrays (a replay reads their contents then)")
        if check:
            capture.refuse(handle, "check=True (it waits for the stream)",
                           "call kv.check_errors() after the replay instead")
    return Checked(src, dst, count, warps, window, handle, host_side, check, block_quota, values, deferred)


def by_copy_engine(plan, route, call, src_indices, dst_indices, signal=None):
    """A call of ``plan`` by copy engine (``plan.routes``; ``call``: what ``checked`` gave): True if it went that
    way, False for the kernel (its host indices checked first, where ``checked`` left them here). ``signal`` (a
    resident load's ``LayerSignal``): layer after layer, each layer's copies followed on the stream by its count
    in ``signal``; else one batch for every layer (``kv.copy``), its indices checked in the pass that writes it."""
    engine, src, dst, window, handle = plan.engine, call.src, call.dst, call.window, call.handle
    if engine is None:
        if route == "copy_engine":
            raise ValueError(f"route='copy_engine' cannot copy these views: {plan.no_engine}; use route='kernel'")
        return False
    # On a GPU, checked() has refused a capture for host indices already: only the simulator asks again.
    if route == "auto" and (not (src.on_host and dst.on_host) or not plan.host_index_checks or not engine.may_pay
                            or not routes.engine_available(handle) or (SIMULATOR and capture.capturing(handle))):
        return _to_the_kernel(plan, call)  # indices on the GPU (or taken as such), no batch call here, a graph
    if SIMULATOR or not (src.on_host or dst.on_host):  # else checked() has refused a capture (host indices)
        capture.refuse(handle, "route='copy_engine'", "use route='kernel' with GPU index arrays")
    indices, objects = (src, dst), (src_indices, dst_indices)
    with on_device(plan.device):
        batch = engine.batch
        if signal is None:
            s_idx, d_idx = engine_indices(plan, window, indices, objects, call.values, check=False)
            with batch.lock:  # from the pass to the submission: threads may share a plan
                found = engine.scan(s_idx, d_idx, (window.src_limit, window.dst_limit), window.first_layer,
                                    plan.window)
                if found is None:  # an index outside its buffer: the plain checks say which; nothing was submitted
                    for side, values in (("src", s_idx), ("dst", d_idx)):
                        _check_values(plan, window, side, values)
                if route == "auto" and not routes.engine_pays(found):
                    return False  # the pass checked every index
                batch.submit(found.copies, handle)
            routes.log.record("copy_engine")
        else:
            s_idx, d_idx = engine_indices(plan, window, indices, objects, call.values)
            with batch.lock:  # a resident load: layer after layer from one reading of the offsets
                s_off, d_off = engine.offsets(s_idx, d_idx)
                found = engine.fill(s_off, d_off, window.first_layer, 1)
                if route == "auto" and not routes.engine_pays(found):
                    return False
                signal.reset(handle)
                for layer in range(plan.window):
                    if layer:
                        found = engine.fill(s_off, d_off, window.first_layer + layer, 1)
                    batch.submit(found.copies, handle)
                    signal.publish(handle, layer + 1)
        if call.check:
            guard.synchronize(handle)
    return True


def _to_the_kernel(plan, call):
    """False (the call goes by kernel), once the host indices ``checked`` left to the copy engine are checked."""
    if call.deferred:
        _check_host_indices(plan, call.src, call.dst, call.window)
    return False


def engine_indices(plan, window, indices, objects, values, check=True):
    """The call's indices (``Index``es ``indices`` of arrays ``objects``) as host int64 arrays for the copy engine,
    each checked against ``window``'s limits unless ``checked`` read and checked it already (``values``) or the
    caller checks them (``check=False``)."""
    host = []
    for index, known, obj, side in zip(indices, values, objects, ("src", "dst")):
        if known is None:  # not checked by checked(): no kernel guard here
            known = index.values() if index.on_host else bounds.host_indices(array_info(obj, side + "_indices"))
            if check:
                _check_values(plan, window, side, known)
        host.append(np.ascontiguousarray(known, dtype=np.int64))
    return host


def _clear_of_destinations(plan, src, dst):
    """Index arrays must not overlap a destination (the kernel would overwrite them mid-transfer)."""
    for index, name in ((src, "src_indices"), (dst, "dst_indices")):
        plan.clearance.check(name, index.address, index.address + 8 * index.length)


def _check_values(plan, window, side, values):
    """Host index values of ``side`` (``"src"`` or ``"dst"``) against the window's token limit."""
    bounds.check_indices(side + "_indices", values, window.src_limit if side == "src" else window.dst_limit,
                         lambda: window.what(plan, side))


def _check_host_indices(plan, src, dst, window):
    """Check the indices in host memory against the window's limits; their values (None for device indices)."""
    read = tuple(index.values() if index.on_host else None for index in (src, dst))
    for values, side in zip(read, ("src", "dst")):
        if values is not None:
            _check_values(plan, window, side, values)
    return read


def stage_indices(indices, handle):
    """``(copies, addresses)``: the call's ``Index``es where a kernel reads them; on a GPU, host indices are
    copied on stream ``handle`` (not waited for; keep ``copies`` until the kernel is done)."""
    if SIMULATOR or not any(index.on_host for index in indices):
        return (), [index.address for index in indices]
    from numba import cuda

    stream = cuda.external_stream(handle) if handle else cuda.default_stream()
    copies = [cuda.to_device(np.ascontiguousarray(index.values()), stream=stream) if index.on_host else None
              for index in indices]
    return copies, [index.address if copy is None else copy.device_ctypes_pointer.value
                    for index, copy in zip(indices, copies)]


def _run_host_indices(plan, kernel, src, dst, count, items_per_warp, grid, threads, window, handle):
    """Indices in host memory: copied to the device on the call's stream, then waited for (the
    copies are freed when the call returns)."""
    with on_device(plan.device):
        _copies, pointers = stage_indices((src, dst), handle)
        blocks = kernel.blocks
        pack_call(blocks.view, 0, pointers[0], pointers[1], count, items_per_warp, *window.params)
        kernel.launch(grid, threads, handle, blocks.address)
        guard.synchronize(handle)


def wait_and_check(plan, handle, src_indices, dst_indices, window):
    """``check=True``: wait for the stream; if the kernel skipped items, raise naming the first offending index."""
    with on_device(plan.device):
        guard.synchronize(handle)
    if not guard.flag_set():
        return
    guard.clear()
    for name, obj, limit, side in (("src_indices", src_indices, window.src_limit, "src"),
                                   ("dst_indices", dst_indices, window.dst_limit, "dst")):
        values = bounds.host_indices(array_info(obj, name))
        where = bounds.first_outside(values, 0, limit)
        if where is not None:
            bound = "any token >= 0" if limit >= NO_LIMIT else f"[0, {limit})"
            raise IndexOutOfRangeError(
                f"{name}[{where}] = {int(values[where])} is out of range for {window.what(plan, side)}: "
                f"valid tokens are {bound}; the kernel skipped the out-of-range items and copied the others")
    raise IndexOutOfRangeError("the kernel skipped items with out-of-range token indices (flagged by another "
                               "call in flight?); the other items were copied")


class Index(NamedTuple):
    """One index array of a call, as ``checked`` reads it."""

    address: int
    length: int
    values: Any  # a function giving the values as a host NumPy array (None: on the device, never read)
    on_host: bool  # read on the host (host memory, or the simulator)
    torch: bool


_torch_types: set[type] = set()
_torch_int64: list = []


_INT64 = np.dtype(np.int64)


def _index(obj, name, device):
    kind = type(obj)
    if kind is np.ndarray:  # host memory: int64, one axis, aligned, contiguous (else _slow_index's errors)
        flags = obj.flags
        if obj.dtype is _INT64 and obj.ndim == 1 and flags.aligned and flags.c_contiguous:
            return Index(typed_address(obj), obj.shape[0], obj.view, True, False)
    elif kind in _torch_types:
        ptr = obj.data_ptr()
        shape = obj.shape
        on = obj.get_device()
        if obj.dtype is _torch_int64[0] and len(shape) == 1 and not ptr & 7 and obj.is_contiguous():
            if on == device and not SIMULATOR:
                return Index(ptr, shape[0], None, False, True)
            if on < 0 or SIMULATOR:
                return Index(ptr, shape[0], obj.numpy if on < 0 else obj.cpu().numpy, True, True)
    elif kind.__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        _torch_types.add(kind)
        _torch_int64[:] = [sys.modules["torch"].int64]
        return _index(obj, name, device)
    return _slow_index(obj, name, device)


def _slow_index(obj, name, device):
    """Any array type, and every error message."""
    info = validate.index_info(name, obj)
    if SIMULATOR or info.device == HOST:
        values = info.obj.numpy if info.is_torch and info.device == HOST else (lambda: bounds.host_indices(info))
        return Index(info.ptr, info.shape[0], values, True, info.is_torch)
    if info.device != device:
        raise DeviceMismatchError(f"{name} is on cuda:{info.device} but the buffers are on cuda:{device}")
    return Index(info.ptr, info.shape[0], None, False, info.is_torch)


def _dead():
    return None


# The last index pair that passed every check: (weakref, weakref, src ptr, dst ptr, count, device).
_LAST_INDICES = [(_dead, _dead, 0, 0, 0, -2)]


def make_fast_call(plan, snapshot=None, again=None, *, torch=None, launch=None):
    """``call(src_indices, dst_indices, layer_id, block_quota=2, num_warps_per_block=32, *, stream=None,
    check=False, route="auto")`` for ``plan`` (torch indices on the GPU always take the kernel). ``snapshot``: a
    prepared transfer's bound buffers (``kvnumba.api.snapshot``), checked first on every call. ``again(stream)``:
    the plan built again with its layer tables read again, which calls with checks on run instead (a prepared
    transfer's tables may have been rewritten). ``torch`` and ``launch`` (``cuLaunchKernel``): stand-ins for
    tests, so that the inlined launch runs on the simulator too (tests/kernels/test_launch.py)."""
    run = plan.run
    if again is not None:
        plan_run = run

        def run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route):
            if check or guard.ALWAYS_CHECK:
                return again(stream).run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)
            return plan_run(src_indices, dst_indices, layer_id, block_quota, warps, stream, check, route)

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
    device, clearance = plan.device, plan.clearance
    low, high = clearance.low, clearance.high  # Clearance.check, inlined below
    starts, ends = clearance.starts, clearance.ends
    # The plan's kernel, and the register kernel for calls below plan.staged_from items (the same kernel
    # unless the plan is staged: kvnumba.plan.staged_plan); one-warp blocks take the narrow build.
    staged_launch, register_launch = plan.kernel.launch_values, plan.register_kernel.launch_values
    staged_from = plan.staged_from
    streams, new_stream, cu_launch = STREAM_OBJECTS, stream_object, launch or cu.cuLaunchKernel
    routed, record = plan.spec.name == "copy", routes.log.record  # kv.copy says which route it took
    last = _LAST_INDICES
    settings = guard  # KVNUMBA_CHECK, read on every call: config.override may turn it on after this is made
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
        if (flag[0] or check or settings.ALWAYS_CHECK or type(src_indices) is not tensor or type(dst_indices) is not tensor
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
        elif type(stream) is LaneStream and stream.device == device:  # an SM lane's (kvnumba.driver.lanes)
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
