"""Buffers with guard bytes on both sides, and cache views over them, for the safety tests
of cache views and prepared transfers.

``Guarded(shape, place, fill)`` is one allocation of ``GUARD_BYTES`` guard bytes, the buffer's bytes
(``POISON``, or random from a seed), and ``GUARD_BYTES`` more; ``.array`` is the middle as an int16 array
shaped ``shape`` (a view of that allocation) in the form ``place`` names:

- ``"device"``: NumPy on the simulator, a Numba device array on a GPU;
- ``"host"``: NumPy on the simulator, a pinned NumPy array on a GPU;
- ``"torch"``: a CPU tensor on the simulator (standing for GPU memory), a CUDA tensor on a GPU;
- ``"torch_host"``: a CPU tensor on the simulator, a pinned CPU tensor on a GPU.

torch buffers own their storage (``resize_`` can move it). ``intact()`` says the guards are unchanged;
``untouched()`` that the middle is still all ``POISON``.

``guarded_view(name, L, T, P, H, D, place, poison, seed)`` builds a view of layout ``name``
(``view_cases.LAYOUTS``) over such buffers: ``(kvnumba view, NumPy twin for the reference, every
Guarded)``.
"""
import numpy as np

from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import to_numpy
from tests.helpers.view_cases import KV_ONLY, LAYOUTS, UNIFIED

GUARD = 0x5A
POISON = 0xA5
GUARD_BYTES = 64


class Guarded:
    def __init__(self, shape, place="device", fill=None):
        self.shape, self.place = tuple(shape), place
        self.nbytes = int(np.prod(shape)) * 2
        whole = np.full(self.nbytes + 2 * GUARD_BYTES, GUARD, np.uint8)
        middle = whole[GUARD_BYTES:GUARD_BYTES + self.nbytes]
        if fill is None:
            middle[...] = POISON
        else:
            middle[...] = np.random.default_rng(fill).integers(0, 256, self.nbytes, dtype=np.uint8)
        self.initial = middle.view(np.int16).reshape(shape).copy()
        self.whole, self.array = _place(whole, place, self.nbytes, shape)

    def whole_bytes(self):
        whole = self.whole
        if type(whole).__module__.startswith("torch"):  # a copy: .numpy() would pin a CPU tensor's storage size
            whole = whole.detach().clone()
        return to_numpy(whole).view(np.uint8).reshape(-1)

    def middle(self):
        return self.whole_bytes()[GUARD_BYTES:GUARD_BYTES + self.nbytes]

    def intact(self):
        b = self.whole_bytes()
        return len(b) >= self.nbytes + 2 * GUARD_BYTES and (b[:GUARD_BYTES] == GUARD).all() and \
            (b[GUARD_BYTES + self.nbytes:GUARD_BYTES * 2 + self.nbytes] == GUARD).all()

    def untouched(self):
        return (self.middle() == POISON).all()


def _place(whole, place, nbytes, shape):
    """``(the allocation, its middle as int16 shaped shape)`` in the form ``place`` names."""
    if place in ("torch", "torch_host"):
        import torch

        t = torch.tensor(whole)  # its own, resizable storage
        if not SIMULATOR:
            t = t.cuda() if place == "torch" else t.pin_memory()
        return t, t[GUARD_BYTES:GUARD_BYTES + nbytes].view(torch.int16).view(shape)
    if SIMULATOR:
        return whole, whole[GUARD_BYTES:GUARD_BYTES + nbytes].view(np.int16).reshape(shape)
    from numba import cuda

    if place == "device":
        d = cuda.to_device(whole)
        return d, d[GUARD_BYTES:GUARD_BYTES + nbytes].view(np.int16).reshape(shape)
    pinned = cuda.pinned_array(whole.shape, np.uint8)
    pinned[...] = whole
    return pinned, pinned[GUARD_BYTES:GUARD_BYTES + nbytes].view(np.int16).reshape(shape)


def guarded_view(name, L, T, P, H, D, place="device", poison=True, seed=0):
    """A view of layout ``name`` over guarded buffers: ``(view, NumPy twin, [Guarded])``. Per-layer
    layouts get one allocation per layer."""
    shape_of, make, per_layer, _ = LAYOUTS[name]
    shape = shape_of(L, T, P, H, D)
    kv_only = name in KV_ONLY
    listed = per_layer or kv_only
    guards = []

    def buffer(which):
        if listed:
            out = [Guarded(shape[1:], place, None if poison else seed * 100 + which * 10 + i) for i in range(L)]
            guards.extend(out)
            return out
        g = Guarded(shape, place, None if poison else seed * 100 + which)
        guards.append(g)
        return g

    one_array = kv_only or name in UNIFIED  # K and V in one array (per layer, or all of it)
    sides = [buffer(w) for w in range(1 if one_array else 2)]

    def build(pick):
        arrays = [[pick(g) for g in side] if listed else pick(side) for side in sides]
        if one_array:
            return make(arrays[0])
        return make(arrays[0], arrays[1])

    return build(lambda g: g.array), build(lambda g: g.initial.copy()), guards


def all_intact(guards):
    return all(g.intact() for g in guards)
