"""The GPU's alignment rules, as the simulator's twins check them: an access the hardware would refuse
(``CUDA_ERROR_MISALIGNED_ADDRESS``, which poisons the context) fails here at once, naming the address.

- plain loads and stores (``ld``/``st``, global or shared, ``.v2`` too): the address is a multiple of the
  access's width (4, 8 or 16 bytes);
- ``cp.async.bulk`` (no tensor map): both addresses 16-byte aligned, the size a multiple of 16;
- ``cp.async.bulk.tensor`` into shared memory (tensor maps without swizzle, as kvnumba's): the
  shared-memory destination 128-byte aligned, the tensor map 64-byte aligned;
- ``mbarrier`` objects: 8-byte aligned.

A fault ends the launch: the simulator raises it and flags the block's other threads (``abort``); the twins'
own waits (barriers, votes) give up on that flag or are broken by ``on_fault``'s hooks, so no thread is left
waiting for one that died.
"""

import threading

__all__ = ["MisalignedAddress", "check_aligned", "on_fault"]

_hooks: list = []  # called with the faulting simulator thread: they free the block's other threads


class MisalignedAddress(AssertionError):
    """An access at an address (or of a size) the GPU would refuse."""


def check_aligned(address, alignment, what):
    """``address`` (an int, or anything ``int()`` takes) as an int, or ``MisalignedAddress`` when it is not a
    multiple of ``alignment``; ``what`` names the access."""
    address = int(address)
    if address % alignment:
        thread = threading.current_thread()
        for hook in _hooks:
            hook(thread)
        raise MisalignedAddress(f"{what} at {address:#x}: not {alignment}-byte aligned")
    return address


def on_fault(hook):
    """``hook(thread)`` runs when ``thread`` faults (before the fault is raised); returns ``hook``."""
    _hooks.append(hook)
    return hook
