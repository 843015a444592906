"""What a prepared transfer holds of its bound buffers, and the check that they have not moved.

``kv.prepare`` validates its buffers once and writes their addresses into the kernel's parameters, so
the memory must stay where it was. A ``Snapshot``:

- *owns* what it points to: a bound list or tuple of arrays is copied (replacing an element of the
  caller's list later changes nothing), and a torch tensor is held through an alias of its own (the
  same memory): ``set_``, ``.data = ...`` or a shrinking ``resize_`` on the caller's tensor leave the
  alias, and the memory it keeps alive, as they were;
- *checks on every call* that the memory has not moved: a torch storage reallocated (``resize_`` to
  more bytes than it had) gives the alias a new data pointer; a NumPy array resized in place
  (``resize(..., refcheck=False)``) or any other array type gets a new pointer or size. Then the call
  raises ``BufferMovedError`` (a ``ValueError``) naming the argument, and writes nothing.

For torch tensors the check is one data-pointer read per buffer (~0.1 us).
"""
import sys

from ..arrays import array_info, is_torch
from ..errors import BufferMovedError


def _is_view(obj):
    from .views import CacheView

    return isinstance(obj, CacheView)


def _is_array(obj):
    return is_torch(obj) or hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__array_interface__")


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
                elif _is_array(x):
                    others.append((label, x, _where(x)))
        # Cache views (a prepared kv.copy) check their own buffers (CacheView.check_unchanged), over the
        # bound layers or, when each call picks them, over all of them.
        self._views = [(name, value) for name, value in self.values.items() if _is_view(value)]
        self._layers = bound.get("layers")
        self.tensors = tuple(torch_arrays)  # the fast path reads their data pointers itself
        self.pointers = [t.data_ptr() for t in torch_arrays]
        self._tensor_names = torch_names
        self._others = others

    @property
    def watches_others(self):
        """Whether bound buffers other than torch tensors are watched (``moved`` checks them)."""
        return bool(self._others or self._views)

    def moved(self):
        """True if any bound memory moved since the snapshot (see the module docstring)."""
        if self.tensors:
            data_ptr = sys.modules["torch"].Tensor.data_ptr
            if list(map(data_ptr, self.tensors)) != self.pointers:
                return True
        if any(_where(x) != where for _, x, where in self._others):
            return True
        for name, view in self._views:
            try:
                view.check_unchanged(name, self._layers)
            except ValueError:
                return True
        return False

    def verify(self):
        """Raise ``BufferMovedError`` naming the first bound buffer whose memory moved."""
        for name, tensor, pointer in zip(self._tensor_names, self.tensors, self.pointers):
            if tensor.data_ptr() != pointer:
                raise BufferMovedError(f"{name} moved since kv.prepare: its memory was reallocated (a torch "
                                       f"resize_ to more bytes?); prepare the transfer again; nothing was written")
        for name, x, where in self._others:
            now = _where(x)
            if now != where:
                raise BufferMovedError(f"{name} moved since kv.prepare: it was at 0x{where[0]:x} ({where[1]} bytes), "
                                       f"now at 0x{now[0]:x} ({now[1]} bytes) (resized in place?); prepare the "
                                       "transfer again; nothing was written")
        for name, view in self._views:
            view.check_unchanged(name, self._layers)


def _where(x):
    """``(address, bytes)`` of a non-torch array, as kvnumba describes it (``arrays.array_info``)."""
    info = array_info(x, "bound buffer")
    return info.ptr, info.nbytes
