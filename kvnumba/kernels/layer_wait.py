"""A stream's wait for a resident load's layer as a kernel: one thread polls the load's ``layers_done`` word
until it reaches the count asked for. ``LayerSignal.wait`` uses it on a stream being captured into a CUDA graph
(a kernel node, which every graph holds); uncaptured, it waits with ``cuStreamWaitValue32``.
"""
import functools

from numba import cuda

from .ptx import ptx_of
from .signals import acquire_u32, backoff

WAIT_SIGNATURE = "void(int64, int64)"  # the word's address, the count to wait for


def _wait_layers(layers_done, count):
    if cuda.threadIdx.x == 0:
        while acquire_u32(layers_done) < count:
            backoff()


@functools.cache
def get_wait_kernel():
    """The wait kernel (built on first request)."""
    from .jit import kernel

    return kernel(_wait_layers)


def wait_ptx(cc=(9, 0)):
    """PTX of the wait kernel for compute capability ``cc``; needs NVVM, not a GPU (not the simulator)."""
    return ptx_of(get_wait_kernel(), WAIT_SIGNATURE, cc)
