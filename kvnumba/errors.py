"""kvnumba's own exception classes, all of them, in one place (each is exported as ``kvnumba.<Name>``).

Argument errors subclass the built-in a caller would catch anyway (``ValueError``), so
``except ValueError`` keeps working; CUDA failures subclass ``RuntimeError`` and are made by
``kvnumba.driver.bindings.failure``, which names the call and the CUDA error.
"""
import signal

__all__ = [
    "BadAddressError",
    "BufferMovedError",
    "CaptureError",
    "CopyError",
    "CudaError",
    "DeviceMismatchError",
    "ExportError",
    "IndexOutOfRangeError",
    "Interrupted",
    "MisalignedAddressError",
    "NoGpuError",
    "OverlapError",
    "PageableMemoryError",
    "RemoteError",
    "SettingError",
    "StaleExportError",
]


class SettingError(ValueError):
    """An environment variable kvnumba reads (``kvnumba.config``) holds a value it cannot use; the message
    names the variable, what it accepts and what it got. ``import kvnumba`` does not raise it: the first
    use of ``kvnumba.<name>`` does (and every command of the command line refuses to run)."""


class NoGpuError(RuntimeError):
    """kvnumba refuses to run on Numba's CUDA simulator: ``KVNUMBA_REQUIRE_GPU=1`` where there is no CUDA
    driver (or the simulator was asked for), or there is no driver and ``numba.cuda`` was imported, on its
    GPU target, before kvnumba could switch. Raised by the first use of ``kvnumba.<name>``."""


class IndexOutOfRangeError(IndexError, ValueError):
    """A token index lies outside the buffer it addresses.

    Raised before anything is written when the indices are readable on the host. For indices in
    GPU memory the kernel skips the offending items (copying the others) and sets kvnumba's error
    flag; the error is then raised by ``check=True``, by the next kvnumba call, or by
    ``kvnumba.check_errors()``.
    """


class PageableMemoryError(ValueError):
    """A host buffer passed to a kernel is pageable: the GPU cannot read or write it (it would fault
    with an illegal address and take the CUDA context with it)."""


class BadAddressError(ValueError):
    """An address in a raw layer table is not memory CUDA (or, on the simulator, kvnumba) knows,
    or not 8-byte aligned."""


class DeviceMismatchError(ValueError):
    """The buffers of one call live on different GPUs (or its indices, or the stream it is given, on
    another GPU than its buffers). kvnumba copies within one device (and its pinned host memory), never
    across two."""


class OverlapError(ValueError):
    """A destination overlaps memory the same call reads to find its way: a layer table or an
    index array. The copy would overwrite them mid-transfer and then follow garbage."""


class BufferMovedError(ValueError):
    """The memory of a buffer bound by ``kv.prepare`` moved since then (reallocated or resized in
    place): the transfer's addresses would point into freed memory. Nothing is written."""


class CudaError(RuntimeError):
    """A CUDA driver or runtime call failed. ``call`` names it, ``code`` is the CUDA error number
    (None when the call answered in a form kvnumba does not know)."""

    def __init__(self, message, code=None, call=None):
        super().__init__(message)
        self.code = code
        self.call = call


class CopyError(CudaError):
    """A CUDA copy failed (``cudaMemcpyAsync``, ``cudaMemcpyBatchAsync``). ``index`` is the failing
    copy of the call's copies, or None when the runtime does not say which."""

    def __init__(self, message, code=None, call=None, index=None):
        super().__init__(message, code, call)
        self.index = index


class MisalignedAddressError(CudaError):
    """A kernel's access at an address the GPU would refuse (``CUDA_ERROR_MISALIGNED_ADDRESS``), caught by Numba's
    CUDA simulator, whose loads, stores and bulk copies check the GPU's alignment rules
    (``kvnumba.kernels.simulator.alignment``). On a GPU the driver reports it as a ``CudaError``."""


class CaptureError(RuntimeError):
    """A call that a CUDA graph capture cannot hold, made while its stream is being captured: indices the
    host must read, ``check=True`` (it waits for the stream), the copy-engine route, a copy-engine entry
    point, or a first call with new buffers (building a plan allocates and copies). Nothing was recorded
    or written, and the capture is still valid. The message says what to do instead."""


class ExportError(ValueError):
    """Bytes given to ``kvnumba.remote.Agent.connect`` that are not a kvnumba export, are damaged, come
    from another format version, or describe a cache that does not fit the call."""


class StaleExportError(ExportError):
    """A ``kvnumba.remote`` export that no longer describes exported memory: its view was unexported,
    its agent closed, or the agent was replaced by a new one of the same name. Nothing was moved."""


class RemoteError(RuntimeError):
    """A NIXL call or transfer failed (``kvnumba.remote``). The message names the call and NIXL's
    error; a failed transfer never reports success."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped ``kvnumba convert``; its temporary file has been
    removed. A KeyboardInterrupt, so that code which catches ``Exception`` lets it through."""

    def __init__(self, signum):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
