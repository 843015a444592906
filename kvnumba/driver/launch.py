"""Launching a compiled kernel with as little host time as possible.

Why: Numba's dispatcher re-inspects every argument at each launch, which costs more host time than the
transfers it launches take. kvnumba's kernels take only int64 scalars, so a launch here is a ``Kernel``
(compiled once, loaded on each device it runs on), its ``ParamBlocks`` (the parameters as the driver takes
them, one block per thread, written in place per call) and ``BoundKernel.launch`` (``cuLaunchKernel``).
``launch_values`` serve a caller that inlines the launch (``kvnumba.plan.per_call``). On the simulator
``BoundKernel`` is ``driver.simulated_launch``'s, chosen once, at import.
"""
import threading

from ..memo import BoundedMemo
from .bindings import check, cu, failure
from .devices import context, on_device
from .param_blocks import ParamBlocks
from .target import SIMULATOR

__all__ = ["MAX_QUOTA", "MAX_THREADS_PER_BLOCK", "MAX_WARPS", "STREAM_OBJECTS", "WARP_SIZE", "BoundKernel", "Kernel",
           "ParamBlocks", "launch_shape", "launchable", "stream_object"]

WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_QUOTA = 2**31 - 1  # blocks a launch may ask for (the grid's x dimension)
MAX_WARPS = MAX_THREADS_PER_BLOCK // WARP_SIZE  # warps a block may have


def launch_shape(num_items, block_quota, num_warps_per_block):
    """The seed's launch geometry: ``(items_per_warp, blocks, threads_per_block)``; ``block_quota`` caps the
    blocks (and so the SMs) a transfer takes. ``kvnumba.plan.per_call`` inlines these two lines."""
    items_per_warp = -(-num_items // (block_quota * num_warps_per_block))  # ceiling division, exact
    blocks = -(-num_items // (items_per_warp * num_warps_per_block))
    return items_per_warp, blocks, num_warps_per_block * WARP_SIZE


class Kernel:
    """A Numba kernel compiled for one signature, with its function handle per device."""

    def __init__(self, dispatcher, signature, shared_bytes=0):
        self.dispatcher = dispatcher
        self.signature = signature
        self.shared_bytes = shared_bytes  # dynamic shared memory per block
        self._lock = threading.Lock()
        self._functions = {}  # device -> CUfunction
        self._compiled = None  # keeps Numba's compiled kernel (and so its loaded modules) alive

    def function(self, device):
        """The CUfunction of this kernel in ``device``'s context (compiled and loaded on first use)."""
        function = self._functions.get(device)
        if function is None:
            with self._lock, on_device(device):
                function = self._functions.get(device)
                if function is None:
                    self._compiled = self.dispatcher.compile(self.signature)
                    handle = int(self._compiled._codelibrary.get_cufunc().handle)
                    # resolving Numba's library kernel (CUkernel) to this context's CUfunction once saves
                    # the driver that lookup on every launch
                    err, resolved = cu.cuKernelGetFunction(cu.CUkernel(handle))
                    function = resolved if not err else cu.CUfunction(handle)
                    if self.shared_bytes > _DEFAULT_SHARED_LIMIT:  # more than 48 KB must be asked for
                        check(cu.cuFuncSetAttribute(
                            function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            self.shared_bytes), "cuFuncSetAttribute")
                    self._functions[device] = function
        return function


_launchables: dict[object, Kernel] = {}  # Numba dispatcher -> its Kernel


def launchable(dispatcher, signature, shared_bytes=0):
    """The one ``Kernel`` of a Numba kernel (``dispatcher``), compiled for ``signature`` with
    ``shared_bytes`` of dynamic shared memory a block: every plan of that kernel shares it."""
    kernel = _launchables.get(dispatcher)
    if kernel is None:
        kernel = _launchables.setdefault(dispatcher, Kernel(dispatcher, signature, shared_bytes))
    return kernel


_DEFAULT_SHARED_LIMIT = 48 * 1024

# raw handle -> CUstream: wrapping an int costs the binding more than a dict lookup
STREAM_OBJECTS = BoundedMemo(4096)


def stream_object(handle):
    """The ``CUstream`` for raw handle ``handle`` (kept: handles are few and long-lived)."""
    stream = STREAM_OBJECTS.get(handle)
    if stream is None:
        stream = STREAM_OBJECTS.remember(handle, cu.CUstream(handle))
    return stream


# One world, chosen once: the simulator's twin (its dispatcher launches), else the driver's launch below.
if SIMULATOR:
    from .simulated_launch import BoundKernel  # noqa: F401
else:

    class BoundKernel:  # type: ignore[no-redef]  # the GPU's
        """A kernel loaded on one device and a parameter template: what a prepared transfer launches.

        The launch is tried as it stands first: the driver refuses (never misplaces) a function of one
        context launched on another device's stream, or on the null stream while another context is
        current. Only a refused launch pays for pushing the device's context and retrying: checking the
        current context first would cost every call a driver call.
        """

        __slots__ = ("function", "ctx", "ctx_handle", "blocks", "shared")

        def __init__(self, kernel, device, template):
            self.function = kernel.function(device)
            self.ctx, self.ctx_handle = context(device)
            self.blocks = ParamBlocks(template)
            self.shared = kernel.shared_bytes

        @property
        def launch_values(self):
            """``(blocks, function, retry, shared bytes)``: what ``launch`` uses besides its arguments."""
            return self.blocks, self.function, self.retry, self.shared

        def launch(self, grid, threads, stream, address, _launch=cu.cuLaunchKernel):
            """Launch with this thread's block at ``address`` on raw stream handle ``stream``."""
            cu_stream = STREAM_OBJECTS.get(stream)
            if cu_stream is None:
                cu_stream = stream_object(stream)
            (err,) = _launch(self.function, grid, 1, 1, threads, 1, 1, self.shared, cu_stream, address, 0)
            if err:
                self.retry(err, grid, threads, cu_stream, address)

        def retry(self, err, grid, threads, cu_stream, address):
            """After a refused launch: again with this device's context pushed, if that was the cause."""
            if err in _WRONG_CONTEXT:
                check(cu.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
                try:
                    (err,) = cu.cuLaunchKernel(self.function, grid, 1, 1, threads, 1, 1, self.shared, cu_stream,
                                               address, 0)
                finally:
                    check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
            if err:
                raise failure("cuLaunchKernel", err)

    _WRONG_CONTEXT = (cu.CUresult.CUDA_ERROR_INVALID_HANDLE, cu.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                      cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED)
