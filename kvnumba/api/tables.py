"""``layer_table``: the uint64 table of per-layer base addresses that all-layer transfers read."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy as np

from ..arrays import ArrayInfo, array_info
from ..checks import pinned, validate
from ..checks.devices import one_device
from ..checks.tables import register_layers
from ..driver.devices import on_device
from ..driver.target import SIMULATOR
from ..types import ArrayLike, TorchTensorLike

_Tensor = TypeVar("_Tensor", bound=TorchTensorLike)


class HostLayerTable(np.ndarray):
    """A NumPy uint64 table that keeps the layers it points into alive (``.layers``) and records
    their sizes (``.layer_nbytes``)."""

    layers = ()
    layer_nbytes = None


@overload
def layer_table(layers: Sequence[_Tensor]) -> _Tensor: ...
@overload
def layer_table(layers: Sequence[ArrayLike]) -> ArrayLike: ...
def layer_table(layers: Sequence[ArrayLike]) -> Any:
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
    device = one_device([(f"layers[{i}]", info.device) for i, info in enumerate(infos)],
                        "a layer table's layers live on one device")
    addresses = np.array([info.ptr for info in infos], dtype=np.uint64)
    register_layers(infos)

    table = device_table(addresses, infos, device)
    try:
        table.layers = layers
        table.layer_nbytes = tuple(info.nbytes for info in infos)
    except AttributeError:  # CuPy arrays take no attributes: the caller keeps the layers alive
        pass
    return table


def device_table(addresses: np.ndarray, infos: Sequence[ArrayInfo], device: int | None = None) -> Any:
    """A uint64 array of ``addresses`` where kernels read it: on the device of the arrays ``infos``
    describe, as a torch tensor (torch arrays), a CuPy array (CuPy) or a Numba device array (else);
    on the simulator a NumPy array (``HostLayerTable``)."""
    if device is None:
        device = one_device([(f"layers[{i}]", info.device) for i, info in enumerate(infos)])
    if SIMULATOR:
        return addresses.view(HostLayerTable)
    if infos[0].is_torch:
        torch = sys.modules["torch"]
        table = torch.from_numpy(addresses.view(np.int64)).to(torch.device("cuda", device))
        return table.view(torch.uint64) if hasattr(torch, "uint64") else table
    if type(infos[0].obj).__module__.startswith("cupy"):
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device):
            return cupy.asarray(addresses)
    from numba import cuda

    with on_device(device):
        return cuda.to_device(addresses)
