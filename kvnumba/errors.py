"""kvnumba's own exception classes, in one place.

Argument errors subclass the built-in a caller would catch anyway (``ValueError``), so
``except ValueError`` keeps working; CUDA failures subclass ``RuntimeError``.
"""


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
    """The buffers of one call live on different GPUs (or its indices on another GPU than its
    buffers). kvnumba copies within one device (and its pinned host memory), never across two."""


class OverlapError(ValueError):
    """A destination overlaps memory the same call reads to find its way: a layer table or an
    index array. The copy would overwrite them mid-transfer and then follow garbage."""


class CudaError(RuntimeError):
    """A CUDA driver or runtime call failed. ``call`` names it, ``code`` is the CUDA error number."""

    def __init__(self, message, code=None, call=None):
        super().__init__(message)
        self.code = code
        self.call = call


class CopyError(CudaError):
    """A CUDA copy failed. ``error`` is the CUDA error code, ``index`` the failing copy (or None)."""

    def __init__(self, message, error=None, index=None):
        super().__init__(message, error, "copy")
        self.error = error
        self.index = index
