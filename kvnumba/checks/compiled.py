"""Host functions compiled for the CPU (``numba.njit``): the per-call passes over a call's host indices.

``compiled(function)`` compiles on first use and caches on disk (``cache=True``: Numba keeps the machine code
beside the module, or in the user's cache directory where the package is read-only); where Numba finds no
directory it may write, the function is compiled again in each process. ``first_outside`` is the index check's
pass: one loop where NumPy's ``min`` and ``max`` make two, each with its own fixed cost of about a microsecond.
"""
from numba import njit


def compiled(function):
    """``function`` compiled for the CPU, cached on disk where Numba finds a directory it may write."""
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:  # no cache locator (no writable directory): compiled again in each process
        return njit(nogil=True)(function)


@compiled
def first_outside(values, low, high):
    """The position of the first value outside ``[low, high)``, or -1."""
    for i in range(values.shape[0]):
        if values[i] < low or values[i] >= high:
            return i
    return -1
