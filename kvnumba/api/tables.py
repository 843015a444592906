"""``layer_table``: the uint64 table of per-layer base addresses that all-layer transfers read."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy as np

from ..arrays import array_info, flagged
from ..checks import pinned, validate
from ..checks.devices import one_device
from ..checks.tables import register_layers
from ..plan.device_tables import device_table
from ..types import ArrayLike, TorchTensorLike

_Tensor = TypeVar("_Tensor", bound=TorchTensorLike)


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

    Examples
    --------
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
        table.flagged_layers = flagged(layers)  # layers whose writable flag plans read again (arrays.flagged)
    except AttributeError:  # CuPy arrays take no attributes: the caller keeps the layers alive
        pass
    return table
