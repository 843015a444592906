"""Export tokens: one 8-byte word per export in the exporter's registered host memory, holding
``remote.export.token_of(header)`` while the export stands and 0 after; importers read it before every copy,
so a stale export and an altered one do not match. Slabs of ``TOKEN_SLOTS`` words, each registered with NIXL.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TOKEN_SLOTS = 512  # tokens per slab (8 bytes each); more slabs are added as needed

Register = Callable[[np.ndarray], Any]  # registers a slab with NIXL, returns its registration key


class Tokens:
    """An agent's token slots. ``take()`` a free slot, ``write(slot, value)``, ``release(slot)`` (zeroed and
    free again), ``clear()`` every slot (the agent closes)."""

    def __init__(self, register: Register) -> None:
        self._register = register
        self._slabs: list[tuple[np.ndarray, Any]] = []  # (slab, its registration key)
        self._free: list[int] = []

    def take(self) -> int:
        if not self._free:
            first = len(self._slabs) * TOKEN_SLOTS
            slab = np.zeros(TOKEN_SLOTS, np.uint64)
            self._slabs.append((slab, self._register(slab)))
            self._free = list(range(first + TOKEN_SLOTS - 1, first - 1, -1))
        return self._free.pop()

    def _word(self, slot: int) -> tuple[np.ndarray, int]:
        slab, _ = self._slabs[slot // TOKEN_SLOTS]
        return slab, slot % TOKEN_SLOTS

    def address(self, slot: int) -> int:
        slab, index = self._word(slot)
        return int(slab.ctypes.data) + 8 * index

    def key(self, slot: int) -> Any:
        """The registration key of the slot's slab."""
        return self._slabs[slot // TOKEN_SLOTS][1]

    def write(self, slot: int, value: int) -> None:
        slab, index = self._word(slot)
        slab[index] = value

    def release(self, slot: int) -> None:
        self.write(slot, 0)
        self._free.append(slot)

    def clear(self) -> None:
        for slab, _ in self._slabs:
            slab[:] = 0
