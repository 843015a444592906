"""Staging views: a cache laid out like a remote one, holding only the pages a copy touches.

The staged route (``kvnumba.remote.plan``) moves the remote side's runs as they are into such a view
on this side, and ``kv.copy`` relayouts between it and the local view. A staging view has the remote
view's class, item and page size, ``pages`` pages (the touched ones, in page order), and:

- per-layer layouts (``LayerFirst`` lists, vLLM, FlashInfer; a single-buffer ``LayerFirst`` is staged
  as a list): arrays only for the copied layers; the other layers' entries repeat one of them (never
  read or written: ``kv.copy`` maps layer ``l`` to layer ``l``);
- layouts that keep every layer of a token or page together (``PageFirst``, ``PageFirstDirect``,
  ``PageHead``, ``PageUnified`` with the remote pool's head groups): layers ``0 .. last copied``;
- a user layout: ``buffer_shape`` of its class, if it defines one (else no staging: the direct route).

Items are stored as raw bytes (uint8, ``(H, item/H)``), which ``kv.copy`` takes opposite any dtype.
Memory: on the simulator NumPy; on a GPU, device memory on the local view's GPU, or pinned host
memory opposite a host view. ``Pool`` keeps them, and their NIXL registrations, for reuse.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..api import views
from ..driver.target import SIMULATOR
from .sides import Side, find_class

Allocate = Callable[[tuple[int, ...]], Any]


def allocator(mem: str, device: int) -> Allocate:
    """A function making uint8 arrays of a shape in NIXL memory ``mem`` (``"DRAM"``/``"VRAM"``): NumPy on
    the simulator; on a GPU, device memory on ``device`` or pinned host memory. Their contents start
    undefined: a copy fills what it reads."""
    if SIMULATOR:
        return lambda shape: np.zeros(shape, np.uint8)
    if mem == "VRAM":
        return lambda shape: _device_array(shape, device)
    return _pinned_array


def _device_array(shape: tuple[int, ...], device: int) -> Any:
    from numba import cuda

    with cuda.gpus[device]:
        return cuda.device_array(shape, np.uint8)


def _pinned_array(shape: tuple[int, ...]) -> Any:
    from numba import cuda

    return cuda.pinned_array(shape, np.uint8)


def item_shape(remote: Side) -> tuple[int, ...]:
    g = remote.geometry
    return (g.heads, g.item_bytes // g.heads)  # (1, item) for one head: every view takes it


def can_stage(remote: Side) -> bool:
    """Whether a staging view can be made for the remote side's layout: a built-in one, or a user layout
    (not per layer) whose class defines ``buffer_shape``."""
    cls = find_class(remote.origin.view_class)
    if cls is None:
        return False
    if cls in _BUILDERS:
        return True
    own = getattr(cls.buffer_shape, "__func__", None)
    return bool(cls.user_layout) and not cls.per_layer and own is not views.CacheView.buffer_shape.__func__  # type: ignore[attr-defined]


def make(remote: Side, pages: int, layers: np.ndarray, allocate: Allocate) -> views.CacheView:
    """A staging view for ``remote`` with ``pages`` pages covering ``layers``."""
    cls = find_class(remote.origin.view_class)
    if cls is None:  # pragma: no cover - can_stage said yes
        raise TypeError(f"no staging view for {remote.origin.view_class}")
    builder = _BUILDERS.get(cls, _user_layout)
    return builder(cls, remote, pages, layers, allocate)


def _per_layer(make_layer: Callable[[], Any], layers: np.ndarray, total: int) -> list[Any]:
    """``total`` entries: a fresh array for each copied layer, the first of them elsewhere."""
    arrays = {int(layer): make_layer() for layer in layers}
    first = arrays[int(layers[0])]
    return [arrays.get(layer, first) for layer in range(total)]


def _layer_first(cls: type[views.CacheView], remote: Side, pages: int, layers: np.ndarray, allocate: Allocate) -> views.CacheView:
    g, item = remote.geometry, item_shape(remote)
    k = _per_layer(lambda: allocate((pages * g.page_size, *item)), layers, g.layers)
    v = None if remote.mla else _per_layer(lambda: allocate((pages * g.page_size, *item)), layers, g.layers)
    return views.LayerFirst(k, v)


def _page_major(cls: type[views.CacheView], remote: Side, pages: int, layers: np.ndarray, allocate: Allocate) -> views.CacheView:
    g, item = remote.geometry, item_shape(remote)
    kept = int(layers[-1]) + 1
    shape = cls.buffer_shape(kept, pages * g.page_size, g.page_size, item)
    k = allocate(shape)
    return cls(k, None if remote.mla else allocate(shape))


def _page_unified(cls: type[views.CacheView], remote: Side, pages: int, layers: np.ndarray,
                  allocate: Allocate) -> views.CacheView:
    """SGLang's pool order with the remote's head groups (its layout's ``head_runs``), layers ``0 .. last
    copied``: each (page, group, layer) of the remote lands as one run."""
    g = remote.geometry
    kept, groups = int(layers[-1]) + 1, remote.parts.head_runs or 1
    if remote.mla:
        return cls(allocate((pages, kept, g.page_size, g.item_bytes)))
    return cls(allocate((pages, groups, kept, 2, g.page_size, g.heads // groups, g.item_bytes // g.heads)))


def _vllm(cls: type[views.CacheView], remote: Side, pages: int, layers: np.ndarray, allocate: Allocate) -> views.CacheView:
    g, item = remote.geometry, item_shape(remote)
    heads, per_head = (item if len(item) == 2 else (1, item[0]))
    if cls is views.VllmFlashAttn:
        shape = (2, pages, g.page_size, heads, per_head)
        return views.VllmFlashAttn(_per_layer(lambda: allocate(shape), layers, g.layers))
    layout = remote.origin.options.get("layout", "NHD")
    shape = ((pages, 2, g.page_size, heads, per_head) if layout == "NHD"
             else (pages, 2, heads, g.page_size, per_head))
    return views.VllmFlashInfer(_per_layer(lambda: allocate(shape), layers, g.layers), layout=layout)


def _user_layout(cls: type[views.CacheView], remote: Side, pages: int, layers: np.ndarray, allocate: Allocate) -> views.CacheView:
    g, item = remote.geometry, item_shape(remote)
    shape = cls.buffer_shape(g.layers, pages * g.page_size, g.page_size, item)
    return cls(allocate(shape), None if remote.mla else allocate(shape))


_BUILDERS: dict[type[views.CacheView], Callable[..., views.CacheView]] = {
    views.LayerFirst: _layer_first,
    views.PageFirst: _page_major,
    views.PageFirstDirect: _page_major,
    views.PageHead: _page_major,
    views.PageUnified: _page_unified,
    views.VllmFlashAttn: _vllm,
    views.VllmFlashInfer: _vllm,
}


class Pool:
    """Staging views kept for reuse, keyed on what shapes them; each with room for ``capacity`` pages
    (a power of two at least what was asked, so requests of other lengths reuse it). At most ``KEEP`` free
    views per key are kept (the largest): many copies in flight take many views, and once they are done
    the others go (with their NIXL registrations, which end with the view)."""

    KEEP = 2

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[tuple[int, views.CacheView, Any]]] = {}

    def take(self, remote: Side, pages: int, layers: np.ndarray, mem: str, device: int,
             register: Callable[[views.CacheView], Any]) -> tuple[tuple[Any, ...], int, views.CacheView, Any]:
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
        view = make(remote, capacity, layers, allocator(mem, device))
        return key, capacity, view, register(view)

    def give_back(self, key: tuple[Any, ...], capacity: int, view: views.CacheView, registration: Any) -> None:
        entries = self.free.setdefault(key, [])
        entries.append((capacity, view, registration))
        if len(entries) > self.KEEP:
            entries.sort(key=lambda entry: -entry[0])
            del entries[self.KEEP:]

    def size(self) -> int:
        """The free views kept."""
        return sum(len(entries) for entries in self.free.values())

    def drain(self) -> list[Any]:
        """Every pooled registration (the pool is emptied): for the agent to deregister."""
        registrations = [r for entries in self.free.values() for _, _, r in entries]
        self.free.clear()
        return registrations
