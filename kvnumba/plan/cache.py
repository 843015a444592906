"""A cache of validated plans, found by *value*: by what the kernel sees, not by which Python object carried it.

SGLang passes a fresh view (``pool[layer_id]``) and fresh index tensors on every call; a cache keyed on identity
would validate every call again. A key holds, per buffer, what its checks depend on: an array's pointer, size,
contiguity and (NumPy) writability; a ``__cuda_array_interface__`` array's pointer, flags, shape, type and
strides; a list of arrays' elements with their shapes and dtypes; a layer table or cache view by identity (held
weakly: a table's contents are read when its plan is built), with a table's pointer and size, and for a
destination whether the NumPy arrays behind it are writable; plus the sizes and their types (``True`` is not
``1``). Two calls with the same key touch the same bytes in the same way, so every check holds for both.

What a key cannot see is whether *host* memory is still pinned, so an entry with host buffers keeps a *witness*
per host buffer, checked on every hit: a torch tensor's owner (``t._base`` or ``t``, weakly: while it lives its
memory stays pinned), a Numba pinned or mapped allocation (weakly), and for any other NumPy host array (memory
registered with ``cuda.pinned(arr)``) the driver, asked again. A witness that fails is a miss.

Every memo that plans are found in or built from registers with ``remembered``; ``forget_plans`` clears them
all (``kv.clear_plan_caches()``, and every setting changed through ``kvnumba.config.override``).
"""
import itertools
import operator
import sys
import threading
import weakref
from typing import Any

import numpy as np

from .. import config
from ..arrays import WRITEABLE, is_torch, numpy_address
from ..driver.target import SIMULATOR

MAX_ENTRIES = 1024

_memos: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # id -> a plan memo


def remembered(memo):
    """Register ``memo`` (anything with ``clear()``, held weakly) with the plan memos; return it."""
    _memos[id(memo)] = memo  # by id: a memo may be a dict, which cannot be hashed
    return memo


def forget_plans():
    """Clear every plan memo: the next call builds its plan again, under the settings in force."""
    for memo in list(_memos.values()):
        memo.clear()


config.on_change(forget_plans)  # a setting changed through kvnumba.config.override: plans follow it


class Entry:
    """A cached plan and the witness its hits must pass (None: nothing to check beyond the key)."""

    __slots__ = ("plan", "witness")

    def __init__(self, plan, witness):
        self.plan, self.witness = plan, witness


class PlanCache:
    """``get(objects, scalars, build)``: the plan for these buffers (in argument order) and sizes, built by
    ``build()`` on a miss. ``identity``: the positions of layer tables (keyed by identity); ``destinations``:
    the positions of the buffers written."""

    def __init__(self, identity=(), destinations=()):
        self.identity = frozenset(identity)
        self.destinations = frozenset(destinations)
        self.entries: dict[tuple, Entry] = {}
        self.keyers: dict[tuple, Any] = {}  # argument types -> keyer
        self.misses = 0
        self._lock = threading.Lock()
        remembered(self)

    def find(self, objects, scalars):
        """The cached plan for these buffers and sizes, or None (not cached, or its witness failed)."""
        keyer = self.keyers.get(tuple(map(type, objects)))
        if keyer is None:
            return None
        try:
            entry = self.entries.get(keyer(objects, scalars))
        except TypeError:  # an unhashable scalar: never cached (validation says what is wrong with it)
            return None
        if entry is not None and (entry.witness is None or entry.witness(objects)):
            return entry.plan
        return None

    def get(self, objects, scalars, build):
        """``find``, else ``add``."""
        plan = self.find(objects, scalars)
        return self.add(objects, scalars, build) if plan is None else plan

    def add(self, objects, scalars, build):
        """A miss: the plan ``build()`` makes, stored under these buffers and sizes (unless a scalar is
        unhashable, or an object cannot be referenced weakly)."""
        self.misses += 1
        plan = build()
        kinds = tuple(map(type, objects))
        keyer = self.keyers.get(kinds)
        if keyer is None:
            keyer = self.keyers[kinds] = make_keyer(objects, self.identity, self.destinations)
        try:
            key = keyer(objects, scalars)
            hash(key)
            witness = make_witness(objects, self.identity)
        except TypeError:  # an unhashable scalar, or an object without weak references: not cached
            return plan
        with self._lock:
            if len(self.entries) >= MAX_ENTRIES:
                for old in list(self.entries)[: MAX_ENTRIES // 4]:
                    del self.entries[old]
            self.entries[key] = Entry(plan, witness)
        return plan

    def clear(self):
        with self._lock:
            self.entries.clear()


def make_keyer(objects, identity=frozenset(), destinations=frozenset()):
    """The keyer of arguments of these very types: ``keyer(objects, scalars)`` gives one flat tuple: the keyer
    itself (it stands for the argument types), the objects' value keys, the scalars and their types."""
    torch = sys.modules.get("torch")
    if torch is not None and not identity and all(type(o) is torch.Tensor for o in objects):
        # The hot case (SGLang): C-level loops over the tensors.
        data_ptr, nbytes, contiguous = torch.Tensor.data_ptr, operator.attrgetter("nbytes"), torch.Tensor.is_contiguous

        def torch_keys(objs, scalars):
            return (torch_keys, *map(data_ptr, objs), *map(nbytes, objs), *map(contiguous, objs), *scalars,
                    *map(type, scalars))

        return torch_keys
    generic = _generic_keyer(objects, identity, destinations)
    if torch is not None and not identity and objects and all(type(o) in (list, tuple) for o in objects):
        # The copy-engine entry points' lists of torch layers: _list_key's values, flat, by C-level loops.
        data_ptr, contiguous, chain = torch.Tensor.data_ptr, torch.Tensor.is_contiguous, itertools.chain.from_iterable

        def torch_list_keys(objs, scalars):
            flat = list(chain(objs))
            try:
                return (torch_list_keys, *map(len, objs), *map(data_ptr, flat), *map(contiguous, flat),
                        *map(_SHAPE, flat), *map(_DTYPE, flat), *scalars, *map(type, scalars))
            except TypeError:  # not a tensor (data_ptr is torch.Tensor's alone)
                return generic(objs, scalars)

        return torch_list_keys
    return generic


def _generic_keyer(objects, identity, destinations):
    """``make_keyer``'s keyer for any arguments: each object's key function, chosen by its type now."""
    parts = tuple(_identity_key_function(o, i in destinations) if i in identity else
                  _view_key if i in destinations and _is_view(o) else _value_key_function(o)
                  for i, o in enumerate(objects))

    def keys(objs, scalars):
        return (keys, *map(_call, parts, objs), *scalars, *map(type, scalars))

    return keys


_call = getattr(operator, "call", lambda function, obj: function(obj))  # operator.call is Python 3.11+


def _identity_key_function(obj, destination=False):
    """A table's key: its identity, pointer and size; for a destination, whether its layers are all writable."""
    if hasattr(obj, "__cuda_array_interface__") or _is_array(obj):
        value = _value_key_function(obj)
        if destination:
            return lambda o: (id(o), value(o), all(map(WRITEABLE, getattr(o, "flagged_layers", ()))))
        return lambda o: (id(o), value(o))
    return id


def _is_view(obj):
    return isinstance(getattr(obj, "flagged", None), tuple)


def _view_key(view):
    arrays = view.flagged
    return (id(view), all(map(WRITEABLE, arrays))) if arrays else id(view)


def _is_array(obj):
    return isinstance(obj, np.ndarray) or is_torch(obj)


def _value_key_function(obj):
    kind = type(obj)
    if kind in (list, tuple):
        return _list_key
    if is_torch(obj):
        return _torch_key
    if SIMULATOR and kind.__name__ == "FakeCUDAArray" and kind.__module__.startswith("numba"):
        return _fake_key
    if isinstance(obj, np.ndarray):
        return _numpy_key
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_key
    return id  # a cache view (a destination's: _view_key), or what validation will refuse: the witness holds it


def _torch_key(t):
    return t.data_ptr(), t.nbytes, t.is_contiguous()


def _numpy_key(a):
    flags = a.flags
    return numpy_address(a), a.nbytes, flags.c_contiguous, flags.writeable


def _fake_key(fake):  # the simulator's device arrays wrap a NumPy array
    return _numpy_key(fake._ary)


def _cai_key(obj):
    cai = obj.__cuda_array_interface__
    strides = cai.get("strides")
    return (*cai["data"], tuple(cai["shape"]), cai["typestr"], None if strides is None else tuple(strides))


def _list_key(items):  # SGLang's lists of torch layers have make_keyer's torch_list_keys
    return tuple(map(_layer_key, items))


def _layer_key(x):
    if type(x) is np.ndarray:
        flags = x.flags
        return numpy_address(x), flags.c_contiguous, flags.writeable, x.shape, x.dtype
    return _element_key(x), getattr(x, "shape", None), getattr(x, "dtype", None)


_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")


_key_functions: dict[type, Any] = {}  # element type -> its key function (lists of arrays)


def _element_key(x):
    function = _key_functions.get(type(x))
    if function is None:
        function = _key_functions[type(x)] = _value_key_function(x)
    return function(x)


def make_witness(objects, identity=frozenset()):
    """The function a hit must pass (True: the entry's plan holds for ``objects``), or None; ``TypeError`` when
    an object that needs one cannot be referenced weakly."""
    checks = []  # (position, element or None, test, reference)
    for i, obj in enumerate(objects):
        if i in identity or not _is_memory(obj):
            checks.append((i, None, _same, weakref.ref(obj)))
            continue
        elements = obj if type(obj) in (list, tuple) else (obj,)
        for j, x in enumerate(elements):
            test = _host_witness(x)
            if test is not None:
                checks.append((i, j if type(obj) in (list, tuple) else None, *test))
    if not checks:
        return None
    if all(test is _same_torch_owner for _, _, test, _ in checks):  # torch host tensors: unrolled, on every hit
        if all(j is None for _, j, _, _ in checks):  # the hot case: host tensors, no lists
            owners = [(i, reference) for i, _, _, reference in checks]

            def same_owners(objs):
                for i, reference in owners:
                    t = objs[i]
                    base = t._base
                    if (t if base is None else base) is not reference():
                        return False
                return True

            return same_owners
        torch_owners = [(i, j, reference) for i, j, _, reference in checks]

        def same_list_owners(objs):
            for i, j, reference in torch_owners:
                t = objs[i] if j is None else objs[i][j]
                base = t._base
                if (t if base is None else base) is not reference():
                    return False
            return True

        return same_list_owners

    def witness(objs):
        for i, j, test, reference in checks:
            obj = objs[i] if j is None else objs[i][j]
            if not test(obj, reference):
                return False
        return True

    return witness


def _is_memory(obj):
    kind = type(obj)
    return kind in (list, tuple) or _is_array(obj) or hasattr(obj, "__cuda_array_interface__")


def _same(obj, reference):
    return reference() is obj


def _host_witness(obj):
    """``(test, reference)`` for one host-memory array; None for device memory and on the simulator."""
    if SIMULATOR:
        return None
    if is_torch(obj):
        if obj.is_cuda:
            return None
        return _same_torch_owner, weakref.ref(_torch_owner(obj))
    if isinstance(obj, np.ndarray):
        owner = numpy_owner(obj)
        if type(owner).__name__ in ("PinnedMemory", "MappedMemory") and type(owner).__module__.startswith("numba"):
            return _same_numpy_owner, weakref.ref(owner)
        return _still_pinned, None  # registered memory (or unknown): ask the driver each call
    return None


def _torch_owner(t):
    base = t._base
    return t if base is None else base


def _same_torch_owner(t, reference):
    return _torch_owner(t) is reference()


def numpy_owner(a):
    """The object that owns a NumPy array's memory: its first base that is not an array, or the array itself."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def _same_numpy_owner(a, reference):
    return numpy_owner(a) is reference()


def _still_pinned(a, reference):
    from ..driver.pointers import is_pinned_host

    address = numpy_address(a)
    return a.nbytes == 0 or (is_pinned_host(address) and is_pinned_host(address + a.nbytes - 1))
