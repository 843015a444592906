"""The kernels' error flag, and the optional synchronous check.

Indices in GPU memory are not read by the host before a launch (that would cost a synchronising
device-to-host copy per call). Instead each launch receives exclusive token limits for both sides
(``kvnumba.checks.bounds``) and the address of one int64 flag: the kernel skips any item whose token lies
outside its buffer, copies the others, and stores 1 to the flag.

The flag is one int64 in pinned host memory per process (``numba.cuda.pinned_array``, which the
GPU reaches at its host address through unified addressing; on the simulator a NumPy array), so the host reads it without a copy (~100 ns). It is reported:

- at the call itself with ``check=True`` (or with ``KVNUMBA_CHECK=1`` in the environment, read at
  import): the entry point synchronises its stream after the launch and raises
  ``IndexOutOfRangeError``. Cost: the synchronisation, i.e. the call no longer overlaps the host;
- otherwise at the start of the next kvnumba call (which then does nothing and raises), or by
  ``kvnumba.check_errors()``, which synchronises the device and raises.

The flag is cleared when it is raised. It is shared by every stream and thread of the process, so a
deferred report says that *an* earlier call skipped items, not which one.

Checks also change how raw layer tables (uint64 arrays not made by ``kvnumba.layer_table``) are
treated: with checks on, the table is read to the host and each address's allocation is asked of
the driver (``cuPointerGetAttribute`` ``RANGE_START_ADDR``/``RANGE_SIZE``), giving the layers' extents;
with checks off, nothing is known about a raw table's layers and that side gets no token limit.
"""
import threading

import numpy as np

from ..config import env_flag
from ..driver.target import SIMULATOR
from ..errors import IndexOutOfRangeError

# KVNUMBA_CHECK=1: every call behaves as if given check=True (read once, at import).
ALWAYS_CHECK = env_flag("KVNUMBA_CHECK")

_lock = threading.Lock()
_flag = None  # the int64 flag as a plain NumPy array (host view)
_owner = None  # what keeps its memory alive (the mapped array on a GPU)
_address = 0  # where kernels write it


def flag_address():
    """Address of the error flag for a kernel argument (allocated on first use)."""
    global _flag, _owner, _address
    if _flag is None:
        with _lock:
            if _flag is None:
                if SIMULATOR:
                    flag = np.zeros(1, np.int64)
                    address = flag.ctypes.data
                else:
                    from numba import cuda

                    # Pinned host memory is mapped into the GPU's unified address space: the kernel
                    # writes it at its host address, the host reads it as a plain NumPy array.
                    flag = cuda.pinned_array(1, np.int64)
                    flag[0] = 0
                    address = flag.ctypes.data
                    _owner = flag
                _address = address
                _flag = flag
    return _address


def checks_on(check):
    """Whether this call checks synchronously: ``check=True`` or ``KVNUMBA_CHECK=1``."""
    return bool(check) or ALWAYS_CHECK


def flag_set():
    """True if a kernel has flagged a skipped item since the flag was last cleared (no synchronisation)."""
    return _flag is not None and _flag[0] != 0


def clear():
    if _flag is not None:
        _flag[0] = 0


def raise_pending():
    """At the start of every entry point: report what an earlier asynchronous launch flagged."""
    if _flag is not None and _flag[0] != 0:
        _flag[0] = 0
        raise IndexOutOfRangeError(
            "an earlier kvnumba transfer skipped items whose token indices (in GPU memory) were out of range "
            "for their buffers; the other items were copied. This call did nothing. Pass check=True (or set "
            "KVNUMBA_CHECK=1) to raise at the call that does it.")


def synchronize(handle):
    """Wait for stream ``handle`` (0: the default stream). Nothing to wait for on the simulator."""
    if SIMULATOR:
        return
    from numba import cuda

    (cuda.external_stream(handle) if handle else cuda.default_stream()).synchronize()


def check_errors():
    """Wait for the GPU, then raise ``IndexOutOfRangeError`` if any earlier kvnumba kernel skipped items
    with out-of-range indices (and clear the flag).

    Cost: a device synchronisation (``numba.cuda.synchronize()``).

    Raises
    ------
    IndexOutOfRangeError
        A ``ValueError`` (and ``IndexError``) subclass, from ``kvnumba.errors``.
    """
    if not SIMULATOR and _flag is not None:
        from numba import cuda

        cuda.synchronize()
    raise_pending()


def raw_table_extents(name, info, num_layers):
    """Each layer's usable bytes for a raw table (read to the host; the driver gives each address's
    allocation): ``min(end of allocation - address)`` per layer. Checks the addresses' alignment."""
    from .bounds import host_indices
    from ..errors import BadAddressError
    from .pinned import address_range

    addresses = host_indices(info).view(np.uint64)[:num_layers].tolist()
    for layer, address in enumerate(addresses):
        if address % 8:
            raise BadAddressError(f"{name}[{layer}] = 0x{address:x} is not 8-byte aligned")
    if SIMULATOR:  # no driver to ask: a NumPy address could be anything
        return None
    extents = []
    for layer, address in enumerate(addresses):
        start, size = address_range(f"{name}[{layer}]", address)
        extents.append(start + size - address)
    return tuple(extents)
