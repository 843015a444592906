"""What a cache view holds: its buffers as one owned tuple, per-layer lists that agree, and the memory
under each buffer.

- ``layers_alike(view, name, buffers)``: a per-layer list as a tuple the view owns, every layer the shape
  and dtype of layer 0 (errors name ``k[3]``, ``caches[2]``...).
- ``Held``: each buffer's memory, held or watched. A NumPy array cannot move: the view keeps a weak
  reference to the array owning the memory, and NumPy then refuses to resize it. A Numba device array's
  allocation is held. A torch tensor (or any ``__cuda_array_interface__`` array) can be given new memory in
  place, so its data pointer and size are compared on every ``kv.copy`` of the layers it holds.
"""
from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..arrays import flagged, is_torch, memory_of, numpy_address, shape_of
from ..driver.target import SIMULATOR


# --- per-layer lists -----------------------------------------------------------------------------

def layers_alike(view: str, name: str, buffers: Sequence[Any]) -> tuple[Any, ...]:
    """``buffers`` (a list or tuple of per-layer arrays, argument ``name`` of view class ``view``) as a
    tuple, after checking that every layer has layer 0's dtype and shape: a kernel reads every layer
    with layer 0's item bytes. ``TypeError`` for another dtype, ``ValueError`` for another shape."""
    if not buffers:
        raise ValueError(f"{view}: {name} must hold at least one layer")
    layers = tuple(buffers)
    first = shape_of(layers[0], f"{view} {name}[0]")
    for i, buffer in enumerate(layers[1:], 1):
        shape, itemsize, dtype = shape_of(buffer, f"{view} {name}[{i}]")
        if (itemsize, dtype) != first[1:]:
            raise TypeError(f"{view}: {name}[{i}] is {dtype} ({itemsize} B per element) but {name}[0] is "
                            f"{first[2]} ({first[1]} B): every layer must have the same dtype")
        if shape != first[0]:
            raise ValueError(f"{view}: {name}[{i}] has the shape {shape} but {name}[0] has {first[0]}: every layer "
                             "must have the same shape")
    return layers


# --- what a view holds -----------------------------------------------------------------------------

def _owner(array: np.ndarray) -> np.ndarray:
    """The last NumPy array along ``array``'s chain of bases: the one whose resize would move its memory."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _numpy_fingerprint(array: np.ndarray, owner: np.ndarray) -> tuple[int, int, int, int]:
    return numpy_address(array), array.nbytes, numpy_address(owner), owner.nbytes


class _Watch(NamedTuple):
    """A buffer that is not a torch tensor but is checked on every call: ``read(buffer) == expected``."""

    label: str
    buffer: Any
    read: Callable[[Any], Any]
    expected: Any


_TORCH = "torch"


def _watch(label: str, buffer: Any, kept: list[Any]) -> str | _Watch | None:
    """How ``buffer`` is held: ``_TORCH`` (a tensor: its pointer and size compared per call), a
    ``_Watch``, or None when nothing can change (its memory is held: what keeps it goes in ``kept``)."""
    kind = type(buffer)
    if is_torch(buffer):
        return _TORCH
    array = buffer._ary if SIMULATOR and kind.__name__ == "FakeCUDAArray" else buffer
    if isinstance(array, np.ndarray):
        owner = _owner(array)
        try:
            kept.append(weakref.ref(owner))  # NumPy refuses to resize an array that has a weak reference
            return None
        except TypeError:  # a subclass without weak references: compare its pointers and sizes per call
            return _Watch(label, array, functools.partial(_numpy_fingerprint, owner=owner),
                          _numpy_fingerprint(array, owner))
    if kind.__module__.startswith("numba") and hasattr(buffer, "gpu_data"):
        kept.append(buffer.gpu_data)  # held: the allocation lives as long as the view
        return _Watch(label, buffer, operator.attrgetter("gpu_data"), buffer.gpu_data)
    if kind.__module__.startswith("cupy"):
        return _Watch(label, buffer, lambda b: (b.data.ptr, b.nbytes), (buffer.data.ptr, buffer.nbytes))
    return _Watch(label, buffer, memory_of, memory_of(buffer))


class Held:
    """A view's buffers as they were when it was made (see the module docstring). ``unchanged(layers)`` is
    the per-call check over the layers ``layers`` picks (None, or anything but an int or a range with step
    1: all); ``changed(layers)`` says which buffers differ, in words."""

    __slots__ = ("labels", "by_layer", "every", "kept")

    def __init__(self, layers: Sequence[Sequence[tuple[str, Any]]]) -> None:
        """``layers``: per layer, its (label, buffer) pairs (one entry: the buffers hold every layer)."""
        self.labels: dict[int, str] = {}
        self.kept: list[Any] = []
        by_layer = []
        for items in layers:
            entries: list[Any] = []
            for label, buffer in items:
                watch = _watch(label, buffer, self.kept)
                if watch is _TORCH:
                    self.labels[id(buffer)] = label
                    entries.append((buffer, buffer.data_ptr(), buffer.nbytes))
                elif watch is not None:
                    entries.append(watch)
            by_layer.append(tuple(entries))
        self.by_layer = tuple(by_layer) if len(by_layer) > 1 else ()
        self.every = tuple(entry for entries in by_layer for entry in entries)

    @property
    def watched(self) -> bool:
        """Anything to compare per call (a view of NumPy arrays has nothing: they cannot move)."""
        return bool(self.every)

    def _entries(self, layers: Any) -> Any:
        by_layer = self.by_layer
        if by_layer:
            if type(layers) is int and 0 <= layers < len(by_layer):
                return by_layer[layers]
            if type(layers) is range and layers.step == 1 and 0 <= layers.start and layers.stop <= len(by_layer):
                return [entry for entries in by_layer[layers.start:layers.stop] for entry in entries]
        return self.every

    def unchanged(self, layers: Any = None) -> bool:
        for entry in self._entries(layers):
            if type(entry) is _Watch:
                if entry.read(entry.buffer) != entry.expected:
                    return False
            else:
                tensor, ptr, nbytes = entry
                if tensor.data_ptr() != ptr or tensor.nbytes != nbytes:
                    return False
        return True

    def changed(self, layers: Any = None) -> list[str]:
        out = []
        for entry in self._entries(layers):
            if type(entry) is _Watch:
                if entry.read(entry.buffer) != entry.expected:
                    out.append(f"{entry.label}, a {type(entry.buffer).__name__}, has other memory than when the "
                               "view was made")
            else:
                tensor, ptr, nbytes = entry
                now = tensor.data_ptr(), tensor.nbytes
                if now != (ptr, nbytes):
                    out.append(f"{self.labels[id(tensor)]}, a torch tensor, is now {now[1]} bytes at {now[0]:#x} "
                               f"({nbytes} bytes at {ptr:#x} when the view was made)")
        return out


def hold(view: Any) -> tuple[Held | None, list[Any], tuple[np.ndarray, ...]]:
    """``(Held, or None if nothing needs comparing per call; what keeps the other buffers' memory from moving;
    the NumPy arrays whose writable flag a copy into the view reads again: arrays.flagged)`` of ``view``'s K
    (and V) buffers, by layer for a per-layer view; for raw tables, of the layers kv.layer_table recorded."""
    kinds: list[tuple[str, Any]] = [("k", view.k)] + ([] if view.v is None or view.v is view.k else [("v", view.v)])
    if not view.per_layer:
        held = Held([[(which, buffer) for which, buffer in kinds]])
    else:
        label = "caches" if getattr(view, "caches", None) is view.k else None
        held = Held([[(f"{label or which}[{i}]", buffer[i]) for which, buffer in kinds]
                     for i in range(view.geometry.layers)])
    if view.raw_tables:
        flags = tuple(a for _, table in kinds for a in getattr(table, "flagged_layers", ()))
    else:
        flags = flagged(buffer for _, buffers in kinds for buffer in (buffers if view.per_layer else [buffers]))
    return (held if held.watched else None), held.kept, flags
