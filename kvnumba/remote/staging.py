"""Staging views for the staged route (``kvnumba.remote.plan``): a cache of the remote view's class, item and
page size holding only the pages a copy touches, made by its class's ``staging`` (``kvnumba.layouts``), with
items as raw bytes (uint8, which ``kv.copy`` takes opposite any dtype). ``Pool`` keeps them, and their NIXL
registrations, for reuse.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..driver.target import SIMULATOR
from ..layouts.base import Allocate, CacheView
from .sides import Side, find_class


def allocator(mem: str, device: int) -> Allocate:
    """A function making uint8 arrays of a shape in NIXL memory ``mem`` (``"DRAM"``/``"VRAM"``): NumPy on
    the simulator; on a GPU, device memory on ``device`` or pinned host memory. Their contents start
    undefined: a copy fills what it reads."""
    if SIMULATOR:
        return lambda shape: np.zeros(shape, np.uint8)
    from numba import cuda

    def on_device(shape: tuple[int, ...]) -> Any:
        with cuda.gpus[device]:
            return cuda.device_array(shape, np.uint8)

    return on_device if mem == "VRAM" else (lambda shape: cuda.pinned_array(shape, np.uint8))


def can_stage(remote: Side) -> bool:
    """Whether a staging view can be made for the remote side's layout (its class's ``stages``)."""
    cls = find_class(remote.origin.view_class)
    return cls is not None and cls.stages()


class Pool:
    """Staging views kept for reuse, keyed on what shapes them; each with room for ``capacity`` pages
    (a power of two at least what was asked, so requests of other lengths reuse it). At most ``KEEP`` free
    views per key are kept (the largest): many copies in flight take many views, and once they are done
    the others go (with their NIXL registrations, which end with the view)."""

    KEEP = 2

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[tuple[int, CacheView, Any]]] = {}

    def take(self, remote: Side, pages: int, layers: np.ndarray, mem: str, device: int,
             register: Callable[[CacheView], Any]) -> tuple[tuple[Any, ...], int, CacheView, Any]:
        """A staging view with at least ``pages`` pages, and its registration (``register(view)``)."""
        key = (remote.origin.view_class, tuple(sorted(remote.origin.options.items())), remote.parts.name, remote.mla,
               remote.geometry.layers, remote.geometry.page_size, remote.geometry.heads, remote.geometry.item_bytes,
               int(layers[0]), int(layers[-1]), mem, device)
        entries = self.free.get(key, [])
        for i, (capacity, view, registration) in enumerate(entries):
            if capacity >= pages:
                del entries[i]
                return key, capacity, view, registration
        capacity = 1 << max(0, int(pages - 1).bit_length())
        cls = find_class(remote.origin.view_class)
        assert cls is not None, "can_stage said yes"
        view = cls.staging(remote, capacity, layers, allocator(mem, device))
        return key, capacity, view, register(view)

    def give_back(self, key: tuple[Any, ...], capacity: int, view: CacheView, registration: Any) -> None:
        entries = self.free.setdefault(key, [])
        entries.append((capacity, view, registration))
        if len(entries) > self.KEEP:
            entries.sort(key=lambda entry: -entry[0])
            del entries[self.KEEP:]

    def size(self) -> int:
        """The free views kept."""
        return sum(len(entries) for entries in self.free.values())
