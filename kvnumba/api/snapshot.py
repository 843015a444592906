"""What a prepared transfer holds of its bound buffers, and the check that they have not moved.

``kv.prepare`` writes its buffers' addresses into the kernel's parameters once, so the memory must stay
where it was. A ``Snapshot``:

- *owns* what it points to: a bound list of arrays is copied, and a torch tensor is held through an alias
  of its own, which ``set_``, ``.data = ...`` or a shrinking ``resize_`` on the caller's tensor leave as
  they were;
- *checks on every call* that the memory has not moved (a new data pointer or size), else raises
  ``BufferMovedError`` naming the argument and writes nothing;
- *checks on every call* that no destination turned read-only (the writable flag of each NumPy array
  behind one, ``kvnumba.arrays.flagged``): one that did gets the plain call's error (``refuse``).
"""
from ..arrays import WRITEABLE, flagged, is_torch, memory_of
from ..errors import BufferMovedError


def _is_view(obj):
    from .fp8_views import Fp8View
    from ..layouts import CacheView

    return isinstance(obj, (CacheView, Fp8View))  # both say check_unchanged and flagged


def own(value):
    """What a snapshot keeps of one bound value: lists become tuples, torch tensors aliases."""
    if type(value) in (list, tuple):
        return tuple(own(x) for x in value)
    if is_torch(value):
        return value.detach()  # a tensor of its own over the same storage
    return value


class Snapshot:
    """The bound arguments of a prepared transfer (``values``: name -> what it holds) and the check."""

    def __init__(self, bound, buffer_names, tables=frozenset()):
        # Layer tables stay the caller's objects (kv.layer_table records their layers on them); they are
        # watched like the rest.
        self.values = {name: own(value) if name in buffer_names and name not in tables else value
                       for name, value in bound.items()}
        torch_arrays, torch_names, others = [], [], []
        for name in buffer_names:
            if name not in self.values:
                continue
            value = self.values[name]
            items = value if type(value) is tuple else (value,)
            for i, x in enumerate(items):
                label = f"{name}[{i}]" if type(value) is tuple else name
                if is_torch(x):
                    torch_arrays.append(x)
                    torch_names.append(label)
                elif hasattr(x, "__cuda_array_interface__") or hasattr(x, "__array_interface__"):
                    others.append((label, x, memory_of(x)))
        # Cache views (a prepared kv.copy) check their own buffers (CacheView.check_unchanged), over the
        # bound layers or, when each call picks them, over all of them.
        self._views = [(name, value) for name, value in self.values.items() if _is_view(value)]
        self._layers = bound.get("layers")
        self.tensors = tuple(torch_arrays)  # the fast path reads their data pointers itself
        self.pointers = [t.data_ptr() for t in torch_arrays]
        self._tensor_names = torch_names
        self._others = others
        self._tables = tables
        self._flagged = ()  # NumPy arrays behind the destinations (watch_destinations)
        self._refuse = None

    def watch_destinations(self, names, refuse):
        """Read the writable flags of the NumPy arrays behind the bound destinations ``names`` on every
        call; ``refuse()`` raises the plain call's error for one that turned read-only."""
        arrays = []
        for name in names:
            value = self.values.get(name)
            if value is None:
                continue
            if _is_view(value):
                arrays += value.flagged
            elif name in self._tables:
                arrays += getattr(value, "flagged_layers", ())
            else:
                arrays += flagged(value if type(value) is tuple else (value,))
        self._flagged = tuple(arrays)
        self._refuse = refuse

    @property
    def watches_others(self):
        """Whether anything but torch tensors' pointers is watched (``changed`` checks it)."""
        return bool(self._others or self._views or self._flagged)

    def changed(self):
        """True if any bound memory but the torch tensors' moved, or a destination turned read-only, since the
        snapshot (see the module docstring); the fast call compares ``tensors`` with ``pointers`` itself."""
        if not all(map(WRITEABLE, self._flagged)):
            return True
        if any(memory_of(x) != where for _, x, where in self._others):
            return True
        for name, view in self._views:
            try:
                view.check_unchanged(name, self._layers)
            except ValueError:
                return True
        return False

    def verify(self):
        """Raise ``BufferMovedError`` naming the first bound buffer whose memory moved, then the plain call's
        error if a destination turned read-only."""
        for name, tensor, pointer in zip(self._tensor_names, self.tensors, self.pointers):
            if tensor.data_ptr() != pointer:
                raise BufferMovedError(f"{name} moved since kv.prepare: its memory was reallocated (a torch "
                                       f"resize_ to more bytes?); prepare the transfer again; nothing was written")
        for name, x, where in self._others:
            now = memory_of(x)
            if now != where:
                raise BufferMovedError(f"{name} moved since kv.prepare: it was at 0x{where[0]:x} ({where[1]} bytes), "
                                       f"now at 0x{now[0]:x} ({now[1]} bytes) (resized in place?); prepare the "
                                       "transfer again; nothing was written")
        for name, view in self._views:
            view.check_unchanged(name, self._layers)
        if not all(map(WRITEABLE, self._flagged)):
            refuse = self._refuse
            if refuse is not None:
                refuse()  # raises: the plain call's checks, on the bound buffers as they are now
            raise ValueError("a destination of this prepared transfer is read-only; a destination must be "
                             "writable")  # pragma: no cover - refuse raised
