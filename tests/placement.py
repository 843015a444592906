"""Where test buffers live, for the same tests on the simulator and on a real GPU.

``device(a)`` and ``host(a)`` return a copy of NumPy array ``a`` in GPU memory or pinned host
memory (on the simulator both are NumPy copies); ``to_numpy`` brings any of them back.
"""
import numpy as np

from kvnumba.driver.target import SIMULATOR, gpu_available

ON_GPU = gpu_available()


def device(a):
    if SIMULATOR:
        return np.array(a, copy=True)
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def host(a):
    if SIMULATOR or a.size == 0:  # numba cannot pin zero bytes; nothing is read from an empty array
        return np.array(a, copy=True)
    from numba import cuda

    pinned = cuda.pinned_array(a.shape, dtype=a.dtype)
    pinned[...] = a
    return pinned


PLACE = {"device": device, "host": host}


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


def to_numpy(x):
    synchronize()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if type(x).__module__.startswith("torch"):
        return x.cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.array(x, copy=True)


def synchronize():
    if not SIMULATOR:
        from numba import cuda

        cuda.synchronize()


def gpu_count():
    """How many CUDA GPUs this machine has (0 on the simulator or without a GPU)."""
    if not ON_GPU:
        return 0
    from numba import cuda

    return len(cuda.gpus)
