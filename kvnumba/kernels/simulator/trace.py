"""Which simulated lane touched which bytes: an opt-in record of the simulator's loads and stores.

Inside ``with recording() as accesses:`` every 8- and 16-byte load and store a simulated kernel makes is
appended to ``accesses`` as an ``Access``, in each thread's program order (threads interleave); outside, it
costs one test of a module global per access. notebooks/00_the_copy_kernel.ipynb draws a warp's lanes from it.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["ACCESSES", "Access", "record", "recording"]


class Access(NamedTuple):
    """One load or store of a simulated kernel."""

    block: int  # blockIdx.x
    thread: int  # threadIdx.x (lane = thread % 32)
    op: str  # "ld" or "st"
    address: int
    nbytes: int  # 8 or 16


ACCESSES: list[Access] | None = None  # the list being filled, or None: not recording


@contextlib.contextmanager
def recording() -> Iterator[list[Access]]:
    """Record every load and store of the simulated kernels run inside the block."""
    global ACCESSES
    if ACCESSES is not None:
        raise RuntimeError("the simulator's accesses are already being recorded (recording() does not nest)")
    found: list[Access] = []
    ACCESSES = found
    try:
        yield found
    finally:
        ACCESSES = None


def record(op: str, address: int, nbytes: int) -> None:
    """Append one access of the calling simulated thread (a thread outside a kernel records block -1)."""
    found = ACCESSES
    if found is None:
        return
    thread = threading.current_thread()
    block, index = getattr(thread, "blockIdx", None), getattr(thread, "threadIdx", None)
    found.append(Access(block.x if block is not None else -1, index.x if index is not None else -1, op,
                        int(address), nbytes))  # list.append holds the GIL: safe from every simulated thread
