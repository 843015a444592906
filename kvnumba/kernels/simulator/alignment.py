"""The GPU's alignment rules, as the simulator's twins check them: an access the hardware would refuse
(``CUDA_ERROR_MISALIGNED_ADDRESS``, which poisons the context) fails here at once, naming the address.
Plain loads and stores are aligned to their width, ``cp.async.bulk`` to 16 bytes (its size a multiple of 16),
a tensor load's shared destination to 128 and its map to 64, ``mbarrier`` objects to 8.

A fault ends the launch: the simulator raises it and flags the block's other threads (``abort``); the twins'
own waits give up on that flag or are broken by ``on_fault``'s hooks, so no thread waits for one that died.
"""
import ctypes
import threading

from ...errors import MisalignedAddressError

__all__ = ["access", "check_aligned", "on_fault", "raise_block_fault"]

_hooks: list = []  # called with the faulting simulator thread: they free the block's other threads


def check_aligned(address, alignment, what):
    """``address`` (an int, or anything ``int()`` takes) as an int, or ``MisalignedAddressError`` when it is not a
    multiple of ``alignment``; ``what`` names the access."""
    address = int(address)
    if address % alignment:
        fault = MisalignedAddressError(f"{what} at {address:#x}: not {alignment}-byte aligned")
        thread = threading.current_thread()
        block = getattr(thread, "_manager", None)  # the simulator's BlockManager of the thread's block
        if block is not None:
            vars(block).setdefault("_kvnumba_fault", fault)
        for hook in _hooks:
            hook(thread)
        raise fault
    return address


def raise_block_fault(otherwise):
    """Raises, in a thread whose wait was broken off: its block's fault (so whichever thread the simulator
    reports names the access), else ``RuntimeError(otherwise)``."""
    block = getattr(threading.current_thread(), "_manager", None)
    fault = None if block is None else vars(block).get("_kvnumba_fault")
    if fault is not None:
        raise MisalignedAddressError(f"{fault} (in another thread of the block)")
    raise RuntimeError(otherwise)


def on_fault(hook):
    """``hook(thread)`` runs when ``thread`` faults (before the fault is raised); returns ``hook``."""
    _hooks.append(hook)
    return hook


def access(ctype):
    """``(load, store)`` of one ctypes unsigned integer type at raw integer addresses, aligned to its width; ``store`` keeps the
    value's low bits (a kernel's negative or wide integers, as the GPU's stores of that width do)."""
    width = ctypes.sizeof(ctype)
    mask = (1 << (8 * width)) - 1
    bits = 8 * width

    def load(addr):
        return ctype.from_address(check_aligned(addr, width, f"ld.global.b{bits}")).value

    def store(addr, value):
        ctype.from_address(check_aligned(addr, width, f"st.global.b{bits}")).value = int(value) & mask

    return load, store
