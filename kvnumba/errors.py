"""kvnumba's own exception classes. Each subclasses the built-in a caller would catch anyway
(``ValueError``), so ``except ValueError`` keeps working."""


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
    """An address in a raw layer table is not memory CUDA knows (not device or pinned host memory),
    or not 8-byte aligned."""
