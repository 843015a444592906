"""Layer tables, and what is known about the layers they point to: each layer's size (to bound token indices)
and writability. In order of preference:

1. ``kv.layer_table`` records them on the table (``.layer_nbytes``, ``.layers``);
2. and every layer it saw in a process-wide registry (weakly), by address, so a table copied, sliced, moved or
   built by hand from those layers still finds them;
3. on a GPU, an unknown address is asked of the driver (for a torch tensor: the caching allocator's segment,
   which stops faults but not a write into a neighbour); one the driver does not know raises;
4. on the simulator an unknown address raises with checks on, and is left unbounded with them off.

A table's contents are read when kvnumba first sees the table object, and with checks on at every call. So
write new addresses into a new table (``kv.layer_table``), not into one kvnumba has seen.
"""
import threading
import weakref
from typing import NamedTuple

import numpy as np

from ..arrays import array_info
from ..driver.pointers import HOST
from ..driver.target import SIMULATOR
from ..errors import BadAddressError


class LayerRecord(NamedTuple):
    nbytes: int
    writable: bool
    device: int  # HOST for pinned host memory
    ref: weakref.ref  # to the layer


# Reentrant: a layer's weakref callback (``_forget``) takes it, and the garbage collector may run that
# callback on this thread while ``register_layers`` holds it (any allocation there can start a collection).
_lock = threading.RLock()
_registry: dict[int, LayerRecord] = {}  # address -> LayerRecord


def register_layers(infos):
    """Remember ``infos`` (``ArrayInfo`` of the layers given to ``kv.layer_table``) by address."""
    for info in infos:
        try:
            ref = weakref.ref(info.obj, _forget(info.ptr))
        except TypeError:  # an array type without weak references: known through its table only
            continue
        with _lock:
            _registry[info.ptr] = LayerRecord(info.nbytes, info.writable, info.device, ref)


def _forget(address):
    def callback(ref):
        with _lock:
            record = _registry.get(address)
            if record is not None and record.ref is ref:
                del _registry[address]
    return callback


def lookup(address):
    record = _registry.get(address)
    if record is not None and record.ref() is not None:
        return record
    return None


class TableLayers(NamedTuple):
    """What a call knows about the layers of one table."""

    extents: tuple  # usable bytes from each layer's address, or None where unknown (unbounded)
    writable: tuple  # per layer: True, False, or None (unknown)
    devices: tuple  # per layer: device ordinal, HOST, or None (unknown)
    addresses: tuple  # per layer (None if the table was not read)
    raw: bool  # True if the table was not made by kv.layer_table (its contents were read)


def table_layers(name, info, num_layers, strict):
    """``TableLayers`` for a validated table (``ArrayInfo``) of ``num_layers`` addresses; ``strict``: checks
    are on (the contents are read again; an address nobody knows raises instead of being left unbounded)."""
    recorded = getattr(info.obj, "layer_nbytes", None)
    layers = getattr(info.obj, "layers", None)
    addresses = None
    if recorded is not None and layers is not None and len(recorded) == num_layers:
        infos = [array_info(layer, f"{name}[{i}]") for i, layer in enumerate(layers)]
        pointers = tuple(i.ptr for i in infos)
        if strict:  # checks on: the contents are read, and used if they changed since kv.layer_table
            addresses = read_addresses(info, num_layers)
        if addresses is None or tuple(addresses) == pointers:
            return TableLayers(tuple(recorded), tuple(i.writable for i in infos), tuple(i.device for i in infos),
                               pointers, False)
    if addresses is None:
        addresses = read_addresses(info, num_layers)
    found = []  # per layer: (extent, writable, device)
    for layer, address in enumerate(addresses):
        if address % 8:
            raise BadAddressError(f"{name}[{layer}] = 0x{address:x} is not 8-byte aligned")
        record = lookup(address)
        array = None if record is None else record.ref()
        if record is not None and array is not None:  # writable as it is now (flags change)
            found.append((record.nbytes, array_info(array, f"{name}[{layer}]").writable, record.device))
        elif not SIMULATOR:
            found.append(_driver_extent(f"{name}[{layer}]", address))
        elif strict:
            raise BadAddressError(f"{name}[{layer}] = 0x{address:x} is not in any layer kvnumba knows: on the "
                                  "simulator, raw tables may point only into arrays given to kv.layer_table "
                                  "(checks are on: unknown addresses are refused)")
        else:
            found.append((None, None, None))
    extents, writable, devices = tuple(zip(*found)) or ((), (), ())
    return TableLayers(extents, writable, devices, tuple(addresses), True)


def read_addresses(info, num_layers):
    from .bounds import host_indices

    values = np.ascontiguousarray(host_indices(info)).view(np.uint64)
    return [int(v) for v in values[:num_layers]]


def _driver_extent(name, address):
    from ..driver.pointers import MEMORY_DEVICE, allocation, pointer_info

    found = allocation(address)
    if found is None:
        raise BadAddressError(f"{name} = 0x{address:x} is not in any allocation CUDA knows (device memory or "
                              "pinned host memory)")
    start, size, device = found
    kind = pointer_info(address).memory_type
    return start + size - address, True, device if kind == MEMORY_DEVICE else HOST
