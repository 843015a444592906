"""Many small copies on one stream: one ``cudaMemcpyBatchAsync``, or page by page with the same bytes.

Contract
--------
The real batch call is used when all of these hold:

- kvnumba runs on a GPU (not the simulator);
- libcudart's ``cudaMemcpyBatchAsync`` loads, or the cuda-bindings package has major version 12 or 13 and
  exposes it (cuda-bindings >= 12.8);
- the driver reports CUDA >= 12.8 (``cudaDriverGetVersion() >= 12080``);
- the stream is not a legacy default stream (handle 0, or ``cudaStreamLegacy`` = 1): the driver
  forbids it there.

Otherwise, and when the batch call answers ``cudaErrorNotSupported`` or
``cudaErrorCallRequiresNewerDriver``, every copy is issued in the same order through
``cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, stream)`` (on the simulator: ``ctypes.memmove``
between the NumPy buffers' addresses). Both give the same bytes. Every copy shares one attribute set:
``srcAccessOrder = Stream``, source and destination location hints (device ordinal, or host), ``flags = 0``.

The binding converts its Python-list arguments element by element, so kvnumba calls libcudart's
``cudaMemcpyBatchAsync`` through ctypes with the NumPy address arrays (``CudartBatch``), choosing the C
signature by ``cudaRuntimeGetVersion`` of the library it loaded (CUDA 13 dropped ``failIdx``), never by the
driver's version. The binding, used where libcudart cannot be loaded, returns ``(err, failIdx)`` in 12.x and
``(err,)`` in 13.x: the form is chosen by its major version.

The copy-engine entry points skip even the ctypes call: ``PreparedBatch.native`` gives the addresses of
``cudaMemcpyBatchAsync``, ``cudaStreamIsCapturing`` and ``cuCtxGetCurrent`` with everything the batch call
shares, in one int64 array (``NATIVE_SLOTS``), and ``plan.direct_fill`` checks the stream, fills the copies and
submits them in one compiled call. ``settle`` reads what it answered.
"""
import ctypes
import functools
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..config import BATCH_COPY_ROUTES, batch_copy_route
from ..errors import CopyError
from .bindings import failure
from .target import SIMULATOR, announce

# cudaStreamLegacy is ((cudaStream_t)0x1); 0 is the default stream, legacy unless built per-thread.
LEGACY_STREAMS = (0, 1)
MIN_DRIVER_VERSION = 12080
_NOT_SUPPORTED = 801  # cudaErrorNotSupported
_REQUIRES_NEWER_DRIVER = 36  # cudaErrorCallRequiresNewerDriver


class PathLog:
    """Which path the last copy submission took, ``"batch"`` or ``"page"``, and counts per path."""

    def __init__(self):
        self.last = None
        self.counts = {"batch": 0, "page": 0}

    def record(self, path):
        self.last = path
        self.counts[path] += 1


log = PathLog()


class BatchResult(NamedTuple):
    error: int  # cudaError_t as an int; 0 is success
    fail_index: object  # the failing copy's index (12.x), else None


# The slots of a prepared batch's native array (``PreparedBatch.native``): C functions' addresses, what every
# call passes, and words the functions write (the compiled submission sets each before its call).
(BATCH_FUNCTION, CAPTURING_FUNCTION, CONTEXT_FUNCTION, CONTEXT, ATTRIBUTES, ATTRIBUTES_INDEX, HAS_FAIL_INDEX,
 STATUS, CURRENT, FAIL, ERROR, COUNT) = range(12)
NATIVE_SLOTS = 12
NOT_HERE = -2  # the compiled submission did nothing: the stream captures, or another context is current
FAILED = -3  # the batch call answered an error: ERROR and FAIL say which (``settle``)
_NO_INDEX = -1  # failIdx's "no copy" (SIZE_MAX), as int64


class NativeCalls(NamedTuple):
    """The C functions the compiled submission calls, by address, and each device's context as it names it."""

    batch: int  # cudaMemcpyBatchAsync
    capturing: int  # cudaStreamIsCapturing(stream, cudaStreamCaptureStatus*)
    current_context: int  # cuCtxGetCurrent(CUcontext*)
    context_of: Callable[[int], int]  # device ordinal -> the handle of its primary context


def _function_address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


class SimulatorRuntime:
    """The simulator's stand-in: NumPy arrays are device and host memory alike; no batch call."""

    binding_major = None
    driver_version = 0
    has_batch = False

    def memcpy(self, dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):  # cudaMemcpyAttributes, as in cuda_runtime_api.h
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _MemLocation), ("dstLocHint", _MemLocation),
                ("flags", ctypes.c_uint)]


class CudartBatch:
    """``cudaMemcpyBatchAsync`` straight from libcudart: NumPy address arrays, no per-copy Python.

    The C signature follows the version of the library loaded here (``cudaRuntimeGetVersion``):
    CUDA 13 dropped the ``size_t* failIdx`` argument before the stream.
    """

    def __init__(self, lib, rt):
        """``lib``: the loaded libcudart (``ctypes.CDLL``; tests pass a stand-in), ``rt``: the binding."""
        version = ctypes.c_int()
        err = lib.cudaRuntimeGetVersion(ctypes.byref(version))
        if err:
            raise failure("cudaRuntimeGetVersion", err)
        self.runtime_version = version.value
        self.has_fail_index = version.value < 13000
        fn = lib.cudaMemcpyBatchAsync
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        fn.argtypes = [pointer, pointer, pointer, size, pointer, pointer, size] + (
            [pointer, pointer] if self.has_fail_index else [pointer])
        fn.restype = ctypes.c_int
        self.fn = fn
        self.access_order = int(rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream)
        self.host = int(rt.cudaMemLocationType.cudaMemLocationTypeHost)
        self.device = int(rt.cudaMemLocationType.cudaMemLocationTypeDevice)
        self.attrs_index = (ctypes.c_size_t * 1)(0)
        self._attrs = {}  # (src device, dst device) -> the one cudaMemcpyAttributes every copy shares
        self.native: NativeCalls | None = None  # set where the driver library loads too (_load_cudart_batch)

    def attributes(self, src_device, dst_device):
        attrs = self._attrs.get((src_device, dst_device))
        if attrs is None:
            attrs = _MemcpyAttributes(self.access_order)
            for hint, device in ((attrs.srcLocHint, src_device), (attrs.dstLocHint, dst_device)):
                hint.type, hint.id = (self.host, 0) if device is None else (self.device, device)
            self._attrs[(src_device, dst_device)] = attrs
        return attrs

    def __call__(self, dsts, srcs, sizes, src_device, dst_device, stream):
        """``dsts``/``srcs``/``sizes``: int64 NumPy arrays of equal length."""
        dsts, srcs, sizes = (np.ascontiguousarray(a, dtype=np.int64) for a in (dsts, srcs, sizes))
        addresses = (dsts.ctypes.data, srcs.ctypes.data, sizes.ctypes.data)
        return self.call(addresses, len(dsts), ctypes.byref(self.attributes(src_device, dst_device)), stream)

    def call(self, pointers, count, attrs_ref, stream):
        """The call with everything but ``count`` and ``stream`` made beforehand (``PreparedBatch``):
        ``pointers``, the three arrays' addresses; ``attrs_ref``, ``byref`` of ``attributes(...)``."""
        if self.has_fail_index:
            fail = ctypes.c_size_t(2**64 - 1)
            err = self.fn(*pointers, count, attrs_ref, self.attrs_index, 1, ctypes.byref(fail), stream)
            return BatchResult(err, None if fail.value == 2**64 - 1 else fail.value)
        return BatchResult(self.fn(*pointers, count, attrs_ref, self.attrs_index, 1, stream), None)


def _load_cudart_batch(rt):
    """``(CudartBatch, None)`` for the libcudart cuda-python uses, or ``(None, why not)``; its ``native`` calls
    where libcuda loads too."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        lib = ctypes.CDLL(load_nvidia_dynamic_lib("cudart").abs_path)
        cudart = CudartBatch(lib, rt)
    except Exception as error:  # noqa: BLE001 - any failure means "use the binding"
        return None, f"{type(error).__name__}: {error}"
    try:
        from .devices import context

        driver = ctypes.CDLL("libcuda.so.1")
        cudart.native = NativeCalls(_function_address(cudart.fn), _function_address(lib.cudaStreamIsCapturing),
                                    _function_address(driver.cuCtxGetCurrent), lambda device: context(device)[1])
    except (OSError, AttributeError):  # no compiled submission: the ctypes call serves every call
        pass
    return cudart, None


class CudaRuntime:
    """The few runtime calls the copy paths make, through a cuda-python ``runtime`` module ``rt`` (tests pass a
    stand-in); ``cudart``: a ``CudartBatch`` (the fast batch call), or None (batch through the binding)."""

    route: str  # the batch route taken, set by make_runtime

    def __init__(self, rt, binding_major, driver_version, cudart=None):
        self.rt = rt
        self.binding_major = binding_major
        self.driver_version = driver_version
        self.cudart = cudart
        self.has_batch = (hasattr(rt, "cudaMemcpyBatchAsync") and binding_major in (12, 13)) or cudart is not None
        self._default_kind = rt.cudaMemcpyKind.cudaMemcpyDefault

    def memcpy(self, dst, src, nbytes, stream):
        (err,) = self.rt.cudaMemcpyAsync(dst, src, nbytes, self._default_kind, stream)
        if int(err):
            raise failure("cudaMemcpyAsync", err, f" ({nbytes} bytes from 0x{src:x} to 0x{dst:x})", CopyError)

    def attributes(self, src_device, dst_device):
        """One ``cudaMemcpyAttributes`` for every copy: stream order, location hints, no flags."""
        rt = self.rt
        attrs = rt.cudaMemcpyAttributes()
        attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        kinds = rt.cudaMemLocationType
        host, on_device = kinds.cudaMemLocationTypeHost, kinds.cudaMemLocationTypeDevice
        for hint, device in ((attrs.srcLocHint, src_device), (attrs.dstLocHint, dst_device)):
            hint.type, hint.id = (host, 0) if device is None else (on_device, device)
        attrs.flags = 0
        return attrs

    def batch(self, dsts, srcs, sizes, src_device, dst_device, stream):
        """Submit one ``cudaMemcpyBatchAsync``; ``dsts``/``srcs``/``sizes`` are lists of ints."""
        attrs = self.attributes(src_device, dst_device)
        result = self.rt.cudaMemcpyBatchAsync(dsts, srcs, sizes, len(dsts), [attrs], [0], 1, stream)
        expected = 2 if self.binding_major == 12 else 1  # 12.x: (err, failIdx); 13.x: (err,)
        if len(result) != expected:
            raise CopyError(f"cuda-bindings {self.binding_major}.x cudaMemcpyBatchAsync returned {len(result)} values, "
                            f"expected {expected}", call="cudaMemcpyBatchAsync")
        fail_index = result[1] if expected == 2 else None
        return BatchResult(int(result[0]), None if fail_index is None else int(fail_index))


def make_runtime(route="auto"):
    """The runtime for one batch route (see the module docstring): ``"auto"`` (libcudart's call with
    NumPy address arrays where it loads, else cuda-bindings'), ``"cudart"`` (that call; an error if
    it cannot be loaded), ``"bindings"`` (cuda-bindings' ``cudaMemcpyBatchAsync`` with Python lists),
    ``"page"`` (never batch: page by page)."""
    if route not in BATCH_COPY_ROUTES:
        raise ValueError(f"batch copy route must be one of {', '.join(BATCH_COPY_ROUTES)}, got {route!r}")
    if SIMULATOR:
        announce()  # kvnumba chose the simulator by itself: say so, once
        return SimulatorRuntime()
    import cuda.bindings
    from cuda.bindings import runtime as rt

    major = int(cuda.bindings.__version__.split(".")[0])
    err, version = rt.cudaDriverGetVersion()
    cudart, why_not = _load_cudart_batch(rt) if route in ("auto", "cudart") else (None, None)
    if route == "cudart" and cudart is None:
        raise RuntimeError(f"KVNUMBA_BATCH_COPY=cudart: libcudart's cudaMemcpyBatchAsync could not be loaded "
                           f"({why_not})")
    runtime = CudaRuntime(rt, major, int(version) if not int(err) else 0, cudart)
    if route == "page":
        runtime.has_batch = False
    runtime.route = route if route != "auto" else ("cudart" if cudart is not None else "bindings")
    return runtime


_runtime_for = functools.cache(make_runtime)  # one runtime per route, made when first used


def runtime():
    """The runtime the copy paths use: the route ``KVNUMBA_BATCH_COPY`` names, read at every call (a
    dictionary look-up beside a copy submission), so a process can switch routes (``scripts/host_cost.py``)."""
    return _runtime_for(batch_copy_route())


def batch_copy_available(stream: int | None = None) -> bool:
    """True when ``copy_many`` on ``stream`` (a raw handle; default: a non-legacy stream) would use
    the real ``cudaMemcpyBatchAsync``. It can still fall back if the call answers not-supported."""
    rt = runtime()
    if not rt.has_batch or rt.driver_version < MIN_DRIVER_VERSION:
        return False
    return stream is None or int(stream) not in LEGACY_STREAMS


def copy_many(dsts, srcs, sizes, stream, *, src_device=None, dst_device=None, batch=True):
    """Copy ``sizes[i]`` bytes from ``srcs[i]`` to ``dsts[i]`` (int64 NumPy arrays of addresses and byte
    counts) for every i, on raw stream handle ``stream``; the path taken, ``"batch"`` or ``"page"`` (also in
    ``log``), or None for no copies.

    The location hints: ``src_device``/``dst_device``, a device ordinal, or None for host memory. ``batch=False``:
    never the batch call (a side mixing host and GPU memory has no one location hint). Raises ``CopyError`` if
    the batch call fails other than not-supported (naming the failing copy where the runtime reports it), or a
    page copy fails.
    """
    count = len(dsts)
    if count == 0:
        return None
    rt = runtime()
    dst_list = src_list = size_list = None
    if batch and batch_copy_available(stream):
        cudart = getattr(rt, "cudart", None)
        if cudart is not None:
            result = cudart(dsts, srcs, sizes, src_device, dst_device, stream)
        else:
            dst_list, src_list, size_list = dsts.tolist(), srcs.tolist(), sizes.tolist()
            result = rt.batch(dst_list, src_list, size_list, src_device, dst_device, stream)
        if result.error == 0:
            log.record("batch")
            return "batch"
        if result.error not in (_NOT_SUPPORTED, _REQUIRES_NEWER_DRIVER):
            raise _batch_error(result, dsts.tolist(), srcs.tolist(), sizes.tolist())
    if dst_list is None or src_list is None or size_list is None:  # set together
        dst_list, src_list, size_list = dsts.tolist(), srcs.tolist(), sizes.tolist()
    for index, (dst, src, size) in enumerate(zip(dst_list, src_list, size_list)):
        try:
            rt.memcpy(dst, src, size, stream)
        except CopyError as error:
            raise CopyError(f"page copy {index} of {count}: {error}", error.code, error.call, index) from None
    log.record("page")
    return "page"


def _batch_error(result, dsts, srcs, sizes):
    count = len(dsts)
    if result.fail_index is not None and 0 <= result.fail_index < count:
        i = result.fail_index
        where = f"at copy {i} of {count} (0x{srcs[i]:x} -> 0x{dsts[i]:x}, {sizes[i]} bytes)"
    elif result.fail_index is not None:
        where = f"(failIdx={result.fail_index}, not a single copy) of {count} copies"
    else:
        where = f"for one of {count} copies (this runtime does not report which)"
    return failure("cudaMemcpyBatchAsync", result.error, f" {where}", CopyError, index=result.fail_index)


class PreparedBatch:
    """One plan's batch call, made once: destinations, sources and sizes as rows of one int64 array (grown
    when a call needs more copies), their pointers for ctypes, and the attributes' reference. Per call a fill
    writes ``out[:, :count]`` and ``submit(count, stream)`` hands it to libcudart's ``cudaMemcpyBatchAsync``;
    any other runtime, route or stream takes ``copy_many`` with the same arrays. ``lock``: held by the caller
    from the fill to the submission (threads may share a plan).
    """

    def __init__(self, src_device, dst_device, batch=True):
        self.lock = threading.Lock()
        self.src_device, self.dst_device, self.batch = src_device, dst_device, batch
        # The GPU whose context the copies run in, set by a plan that takes the compiled submission (DirectPlan);
        # None: no native array (``native``).
        self.device = None
        self.out = np.zeros((3, 0), np.int64)
        self.pointers: tuple = ()
        # (the runtime, its CudartBatch, byref of this plan's attributes) once that runtime takes the batch call
        self._ready: tuple = (None, None, None)
        self._native: tuple = (None, None)  # (the runtime, its native array or None)

    def reserve(self, count):
        """``out`` with room for ``count`` copies (a new array when it has less: twice the room)."""
        if count > self.out.shape[1]:
            room = max(count, 2 * self.out.shape[1], 64)
            self.out = np.zeros((3, room), np.int64)
            base = self.out.ctypes.data
            self.pointers = tuple(ctypes.c_void_p(base + row * room * 8) for row in range(3))
        return self.out

    def submit(self, count, stream):
        """Submit the first ``count`` copies of ``out`` on ``stream``; the path taken (as ``copy_many``)."""
        if count == 0:
            return None
        rt = runtime()
        ready, cudart, attrs_ref = self._ready
        if ready is not rt:
            cudart = getattr(rt, "cudart", None)
            if not (self.batch and cudart is not None and rt.has_batch and rt.driver_version >= MIN_DRIVER_VERSION):
                return self._by_copy_many(count, stream, self.batch)
            attrs_ref = ctypes.byref(cudart.attributes(self.src_device, self.dst_device))
            self._ready = (rt, cudart, attrs_ref)
        if int(stream) in LEGACY_STREAMS:
            return self._by_copy_many(count, stream, self.batch)
        result = cudart.call(self.pointers, count, attrs_ref, stream)
        if result.error == 0:
            log.record("batch")
            return "batch"
        if result.error not in (_NOT_SUPPORTED, _REQUIRES_NEWER_DRIVER):
            out = self.out
            raise _batch_error(result, out[0, :count].tolist(), out[1, :count].tolist(), out[2, :count].tolist())
        return self._by_copy_many(count, stream, False)  # not supported: page by page, without asking again

    def native(self, stream):
        """The int64 array (``NATIVE_SLOTS``) that ``plan.direct_fill``'s compiled submission reads, for a call on
        ``stream``; None where it cannot serve: no libcudart or libcuda by ctypes, a runtime or driver without the
        batch call, a side of mixed memory, a legacy default stream, no device given."""
        rt = runtime()
        ready, native = self._native
        if ready is not rt:
            native = self._native_array(rt)
            self._native = (rt, native)
        if native is None or int(stream) in LEGACY_STREAMS:
            return None
        return native

    def _native_array(self, rt):
        cudart = getattr(rt, "cudart", None)
        calls = getattr(cudart, "native", None)
        if (cudart is None or calls is None or self.device is None or not self.batch or not rt.has_batch
                or rt.driver_version < MIN_DRIVER_VERSION):
            return None
        native = np.zeros(NATIVE_SLOTS, np.int64)
        native[BATCH_FUNCTION], native[CAPTURING_FUNCTION], native[CONTEXT_FUNCTION] = calls[:3]
        native[CONTEXT] = calls.context_of(self.device)
        native[ATTRIBUTES] = ctypes.addressof(cudart.attributes(self.src_device, self.dst_device))  # kept by cudart
        native[ATTRIBUTES_INDEX] = ctypes.addressof(cudart.attrs_index)
        native[HAS_FAIL_INDEX] = cudart.has_fail_index
        return native

    def settle(self, result, stream):
        """What a compiled submission on ``stream`` answered: a count of copies submitted (logged), or ``FAILED``:
        a batch call the runtime does not support goes page by page, any other error raises ``CopyError``."""
        if result >= 0:
            if result:
                log.record("batch")
            return
        native, out = self._native[1], self.out
        count, error = int(native[COUNT]), int(native[ERROR])
        if error in (_NOT_SUPPORTED, _REQUIRES_NEWER_DRIVER):
            self._by_copy_many(count, stream, False)
            return
        fail = int(native[FAIL])
        result = BatchResult(error, fail if native[HAS_FAIL_INDEX] and fail != _NO_INDEX else None)
        raise _batch_error(result, out[0, :count].tolist(), out[1, :count].tolist(), out[2, :count].tolist())

    def _by_copy_many(self, count, stream, batch):
        out = self.out
        return copy_many(out[0, :count], out[1, :count], out[2, :count], stream, src_device=self.src_device,
                         dst_device=self.dst_device, batch=batch)
