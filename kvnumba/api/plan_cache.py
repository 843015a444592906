"""A small cache of validated plans, keyed on the identity of the objects they were built from.

SGLang-style code passes the same pool tensors (and layer tables) on every call; validating them
each time is most of a plain call's host time. The cache keeps weak references only: an entry is
reused only while every object it was built from is alive and is the very object passed now, and
only if what can change in place cheaply (a torch tensor's data pointer and size in bytes, a NumPy
array's shape and dtype; ``kvnumba.arrays.fingerprint_function``) is as it was. Scalars are part of
the key, with their types (``True`` is not ``1`` here). Cache views are snapshots of their buffers
(``kvnumba.api.views.CacheView``): for them the objects' identity is all that is checked.

The plain kernel entry points look their plan up with this module's key and ``valid`` inlined in
their per-call function (``kvnumba.api.transfer.plain_caller``).
"""
import operator
import sys
import threading
import weakref
from typing import Any

from ..arrays import fingerprint_function

_call = getattr(operator, "call", lambda ref: ref())  # operator.call is Python 3.11+
_is = operator.is_

MAX_ENTRIES = 1024


class PlanCache:
    """``get(objects, scalars, build)``: the plan for these objects and scalar values, built by
    ``build()`` on a miss. ``objects``: the arrays (or lists of arrays, compared element by element)."""

    def __init__(self, max_entries=MAX_ENTRIES):
        self.max_entries = max_entries
        self.entries = {}
        self.misses = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(objects, scalars):
        ids = tuple(tuple(map(id, o)) if type(o) in (list, tuple) else id(o) for o in objects)
        return (*ids, *scalars, *map(type, scalars))

    def get(self, objects, scalars, build):
        try:
            key = self.key(objects, scalars)
            entry = self.entries.get(key)
        except TypeError:  # an unhashable scalar: let validation say what is wrong with it
            return build()
        if entry is not None:
            refs, plan, fingerprints, expected = entry
            if all(_same(ref, obj) for ref, obj in zip(refs, objects)) and fingerprints(objects) == expected:
                return plan
        self.misses += 1
        plan = build()
        refs = _refs(objects)
        if refs is not None:
            fingerprints = _fingerprints(objects)
            with self._lock:
                if len(self.entries) >= self.max_entries:
                    for old in list(self.entries)[: self.max_entries // 4]:
                        del self.entries[old]
                self.entries[key] = (refs, plan, fingerprints, fingerprints(objects))
        return plan

    def clear(self):
        with self._lock:
            self.entries.clear()


def valid(entry, objects):
    """Every object the very one the entry's plan was built from, and unchanged (C-level loops)."""
    refs, _, fingerprints, expected = entry
    return all(map(_is, map(_call, refs), objects)) and fingerprints(objects) == expected


def _same(ref, obj):
    if type(ref) is tuple:  # a list of arrays
        return type(obj) in (list, tuple) and len(ref) == len(obj) and all(r() is o for r, o in zip(ref, obj))
    return ref() is obj


def _refs(objects):
    """Weak references to ``objects`` (tuples of them for lists), or None if one cannot have one."""
    try:
        return tuple(tuple(weakref.ref(x) for x in o) if type(o) in (list, tuple) else weakref.ref(o)
                     for o in objects)
    except TypeError:
        return None


def _nothing(objects):
    return ()


def _fingerprints(objects):
    """One function giving the fingerprints of all ``objects`` (``kvnumba.arrays``) as one tuple:
    for torch tensors, data pointers and sizes read in C loops; lists element by element."""
    from .views import CacheView

    if all(isinstance(o, CacheView) for o in objects):  # views: snapshots, checked when made
        return _nothing
    torch = sys.modules.get("torch")
    if torch is not None and all(type(o) is torch.Tensor for o in objects):
        data_ptr, nbytes = torch.Tensor.data_ptr, operator.attrgetter("nbytes")
        return lambda objs: (*map(data_ptr, objs), *map(nbytes, objs))
    functions: list[Any]  # per object, its fingerprint function, or a list of them for a list
    functions = [[fingerprint_function(x) for x in o] if type(o) in (list, tuple) else fingerprint_function(o)
                 for o in objects]

    def fingerprints(objs):
        return tuple(tuple(f(x) for f, x in zip(fn, o)) if type(fn) is list else fn(o)
                     for fn, o in zip(functions, objs))

    return fingerprints
