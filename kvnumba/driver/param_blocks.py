"""A kernel's parameters as ``cuLaunchKernel`` takes them (``driver.launch``'s ``BoundKernel`` and its twin)."""
import threading

import numpy as np


class ParamBlocks(threading.local):
    """One parameter block per thread (cuda-bindings releases the GIL during a launch), each starting as a copy
    of ``template`` (int64 values): the values, then the pointers to them, in one NumPy buffer (cheaper to make
    than ctypes arrays: a plan is built on every miss of the plan cache)."""

    def __init__(self, template):
        count = len(template)
        block = np.empty(2 * count, np.int64)
        block[:count] = template
        base = block.__array_interface__["data"][0]
        np.add(_OFFSETS[:count], base, out=block[count:])
        self.block = block  # keeps the memory alive
        self.count = count
        self.address = base + 8 * count  # the void** cuLaunchKernel takes
        self.view = memoryview(block.data).cast("B")  # for struct.pack_into
        self.pair = (self.view, self.address)  # both in one thread-local read

    @property
    def values(self):
        """The parameter values, as Python ints."""
        return self.block[:self.count].tolist()


_OFFSETS = np.arange(0, 8 * 64, 8, dtype=np.int64)
