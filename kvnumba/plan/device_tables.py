"""Tables of addresses where the kernels read them: a uint64 array on the device of the arrays it points
into (torch, CuPy or Numba, following those arrays), or a NumPy array on the simulator. ``kv.layer_table``
(``kvnumba.api.tables``) and ``kv.copy``'s per-layer views (``copy_plan``) make theirs here.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arrays import ArrayInfo
from ..checks.devices import one_device
from ..driver.devices import on_device
from ..driver.target import SIMULATOR


class HostLayerTable(np.ndarray):
    """A NumPy uint64 table that keeps its layers alive (``.layers``) and records their sizes (``.layer_nbytes``)."""

    layers = ()
    layer_nbytes = None


def device_table(addresses: np.ndarray, infos: Sequence[ArrayInfo], device: int | None = None) -> Any:
    """A uint64 array of ``addresses`` on the device of the arrays ``infos`` describe, of their kind (torch, CuPy,
    else Numba); on the simulator a ``HostLayerTable``."""
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
