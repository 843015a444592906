"""The simulator's warps: Numba's CUDA simulator runs a Python thread per CUDA thread and has no warp shuffles
or votes, so their twins meet the 32 threads of a warp here: ``exchange(value)`` gives every lane the 32 values.
A meeting point lives on the simulator's block manager (one per block and launch), and gives up once a thread
of the block has failed (the simulator's ``abort`` flag, or ``simulator.alignment``'s hooks).
"""
import threading
from typing import Any

from .alignment import on_fault, raise_block_fault

__all__ = ["exchange"]

WARP_SIZE = 32


class _Warp:
    """One warp's meeting point: a barrier of its 32 threads that a failed block breaks."""

    __slots__ = ("cond", "values", "arrived", "generation", "broken")

    def __init__(self):
        self.cond = threading.Condition()
        self.values = [0] * WARP_SIZE
        self.arrived = 0
        self.generation = 0
        self.broken = False

    def meet(self, thread):
        with self.cond:
            generation = self.generation
            self.arrived += 1
            if self.arrived == WARP_SIZE:
                self.arrived = 0
                self.generation += 1
                self.cond.notify_all()
                return
            while self.generation == generation:
                if self.broken or getattr(thread, "abort", False):
                    raise_block_fault("a lane of the warp failed")
                self.cond.wait(0.05)


_lock = threading.Lock()


def _warp_of(thread):
    """The meeting point of ``thread``'s warp, kept on the simulator's block manager."""
    block = thread._manager
    with _lock:
        warps = vars(block).setdefault("_kvnumba_warps", {})
        return warps.setdefault(thread.thread_id // WARP_SIZE, _Warp())


@on_fault
def _break_warps(thread):
    """A thread faulted: its block's warps stop waiting for it."""
    block = getattr(thread, "_manager", None)
    with _lock:
        warps = list(vars(block).get("_kvnumba_warps", {}).values()) if block is not None else []
    for warp in warps:
        with warp.cond:
            warp.broken = True
            warp.cond.notify_all()


def exchange(value):
    """The 32 lanes' ``value`` s of the calling thread's warp, by lane (every lane of the warp must call it,
    as every lane takes part in a shuffle or a vote)."""
    thread: Any = threading.current_thread()  # the simulator's BlockThread
    warp = _warp_of(thread)
    warp.values[thread.thread_id % WARP_SIZE] = value
    warp.meet(thread)
    values = list(warp.values)
    warp.meet(thread)  # every lane has read before any lane writes again
    return values
