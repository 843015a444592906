"""The simulator's twin of ``driver.launch.BoundKernel``: the same parameter blocks, launched through Numba's
dispatcher, one grid at a time (the simulator keeps a kernel's launch shape on the shared dispatcher)."""
import threading

from .param_blocks import ParamBlocks

__all__ = ["BoundKernel"]

_simulator_lock = threading.Lock()


class BoundKernel:
    __slots__ = ("dispatcher", "blocks", "shared")

    def __init__(self, kernel, device, template):
        self.dispatcher = kernel.dispatcher
        self.blocks = ParamBlocks(template)
        self.shared = kernel.shared_bytes

    @property
    def launch_values(self):
        return self.blocks, self.dispatcher, None, self.shared

    def launch(self, grid, threads, stream, address):
        values = self.blocks.values
        with _simulator_lock:
            self.dispatcher[grid, threads, 0, self.shared](*values)
