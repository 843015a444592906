"""The simulator's twin of ``driver.launch.BoundKernel``: the same parameter blocks, launched through Numba's
dispatcher. Simulated launches are serialised: the simulator keeps a kernel's launch shape on the
shared dispatcher, and runs one grid at a time."""
import threading

from .param_blocks import ParamBlocks

__all__ = ["BoundKernel"]

_simulator_lock = threading.Lock()


class BoundKernel:
    """A kernel and a parameter template, launched through the simulator's dispatcher."""

    __slots__ = ("dispatcher", "blocks", "shared")

    def __init__(self, kernel, device, template):
        self.dispatcher = kernel.dispatcher
        self.blocks = ParamBlocks(template)
        self.shared = kernel.shared_bytes

    @property
    def launch_values(self):
        """``(blocks, function, retry, shared bytes)``: the simulator launches through the dispatcher."""
        return self.blocks, self.dispatcher, None, self.shared

    def launch(self, grid, threads, stream, address):
        values = self.blocks.values  # this thread's block
        with _simulator_lock:
            self.dispatcher[grid, threads, 0, self.shared](*values)
