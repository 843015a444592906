"""``layer_table``: the uint64 table of per-layer base addresses that all-layer transfers read."""
import sys

import numpy as np

from ..checks import pinned

from ..checks import validate
from ..driver.target import SIMULATOR
from ..arrays import array_info


class HostLayerTable(np.ndarray):
    """A NumPy uint64 table that keeps the layers it points into alive (``.layers``) and records
    their sizes (``.layer_nbytes``)."""

    layers = ()
    layer_nbytes = None


def layer_table(layers):
    """Build a layer table for the current target from a sequence of per-layer buffers.

    Parameters
    ----------
    layers : sequence of arrays
        One contiguous buffer per layer (all on the GPU, or all pinned host memory), in layer
        order. Their shapes do not matter; their addresses do.

    Returns
    -------
    array
        A 1-D uint64 array of ``len(layers)`` addresses, where the kernels can read it: a torch
        CUDA tensor when the layers are torch tensors, a CuPy array for CuPy layers, else a Numba
        device array; on the simulator a NumPy array. It keeps a reference to ``layers`` in
        ``.layers``, so the addresses stay valid while the table lives, and each layer's size in
        bytes in ``.layer_nbytes``: the transfers bound token indices by it (``kvnumba.checks.bounds``).
        CuPy arrays take no attributes: a CuPy table is treated as a raw table (see
        ``kvnumba.checks.guard``).

    Raises
    ------
    TypeError
        If ``layers`` is not a sequence of arrays.
    ValueError
        If it is empty, a layer is not 8-byte aligned, or (on a GPU) a layer is pageable host
        memory (``kvnumba.errors.PageableMemoryError``).

    Example
    -------
    >>> table = kvnumba.layer_table(k_buffers)          # doctest: +SKIP
    >>> kvnumba.transfer_kv_all_layer(table, ..., num_layers=len(k_buffers))  # doctest: +SKIP
    """
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__len__"):
        raise TypeError(f"layers must be a sequence of arrays, got {type(layers).__name__}")
    layers = list(layers)
    if not layers:
        raise ValueError("layers must hold at least one buffer, got an empty sequence")
    infos = [array_info(layer, f"layers[{i}]") for i, layer in enumerate(layers)]
    for i, info in enumerate(infos):
        validate.aligned(f"layers[{i}]", info)
        pinned.require(f"layers[{i}]", info)
    addresses = np.array([info.ptr for info in infos], dtype=np.uint64)

    if SIMULATOR:
        table = addresses.view(HostLayerTable)
    elif infos[0].is_torch:
        torch = sys.modules["torch"]
        device = layers[0].device if layers[0].is_cuda else torch.device("cuda", torch.cuda.current_device())
        table = torch.from_numpy(addresses.view(np.int64)).to(device)
        if hasattr(torch, "uint64"):
            table = table.view(torch.uint64)
    elif type(layers[0]).__module__.startswith("cupy"):
        table = sys.modules["cupy"].asarray(addresses)
    else:
        from numba import cuda

        table = cuda.to_device(addresses)
    try:
        table.layers = layers
        table.layer_nbytes = tuple(info.nbytes for info in infos)
    except AttributeError:  # CuPy arrays take no attributes: the caller keeps the layers alive
        pass
    return table
