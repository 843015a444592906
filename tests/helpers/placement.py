"""Where test buffers live, for the same tests on the simulator and on a real GPU: ``kvnumba.testing``'s
helpers (``device``, ``host``, ``to_numpy``), plus torch placements and the tests' names for them.

Nothing here touches CUDA at import: ``ON_GPU`` asks, once, when first read.
"""
import functools

import numpy as np

from kvnumba.driver.target import SIMULATOR
from kvnumba.testing import device_array as device
from kvnumba.testing import gpu_count, gpu_skip_reason, synchronize, to_numpy  # noqa: F401 - the tests' names
from kvnumba.testing import pinned as host

PLACE = {"device": device, "host": host}


@functools.cache
def on_gpu():
    """True on a real GPU (asks CUDA once, when first called)."""
    return gpu_skip_reason() is None


def __getattr__(name):
    if name == "ON_GPU":  # read at a test module's import on a GPU machine only where that module needs it
        return on_gpu()
    raise AttributeError(name)


def torch_device(a):
    """A copy of ``a`` as a CUDA torch tensor (on the simulator a CPU tensor, which stands for GPU memory
    there as NumPy arrays do)."""
    import torch

    copy = torch.from_numpy(np.array(a, copy=True, order="C"))
    return copy if SIMULATOR else copy.cuda()


def torch_host(a):
    """A copy of ``a`` as a pinned CPU torch tensor (a plain CPU tensor on the simulator)."""
    import torch

    copy = torch.from_numpy(np.array(a, copy=True, order="C"))
    return copy if SIMULATOR else copy.pin_memory()


TORCH_PLACE = {"device": torch_device, "host": torch_host}
