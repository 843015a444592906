"""What a cache view holds, and what it checks: its buffers as one owned tuple, per-layer lists that
agree, the memory under each buffer, and a user layout's arithmetic against every byte it reaches.

- ``layers_alike(view, name, buffers)``: a per-layer list as a tuple the view owns, every layer the
  same shape and dtype as layer 0 (``TypeError``/``ValueError`` naming ``k[3]``, ``caches[2]``...).
- ``Held``: each buffer's memory, held or watched. A NumPy array (and the simulator's device arrays,
  which wrap one) cannot move: the view keeps a weak reference to the array that owns the memory, and
  NumPy refuses to resize an array that has one, even with ``refcheck=False``. A Numba device array's
  allocation is held. A torch tensor (CuPy, any ``__cuda_array_interface__`` array) can be given new
  memory in place (``resize_``, ``set_``, ``.data =``): its data pointer and size in bytes are
  recorded and compared on every ``kv.copy``, for the layers the call copies.
- ``check_arithmetic(view, heads)``: a user layout's three functions evaluated at every layer and
  every token (vectorised over NumPy arrays), with the first and last heads of a copy that goes by
  ``heads``: every byte the kernel can touch must lie in its buffer, K and V each against its own
  bytes, on 8-byte boundaries.
"""
from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..arrays import array_info, flagged, is_torch, shape_of
from ..driver.target import SIMULATOR

if TYPE_CHECKING:
    from .views import CacheView


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
    return (array.__array_interface__["data"][0], array.nbytes, owner.__array_interface__["data"][0],
            owner.nbytes)


def _cai_fingerprint(buffer: Any) -> tuple[int, int]:
    info = array_info(buffer, "buffer")
    return info.ptr, info.nbytes


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
    return _Watch(label, buffer, _cai_fingerprint, _cai_fingerprint(buffer))


class Held:
    """A view's buffers as they were when it was made (see the module docstring).

    ``unchanged(layers)`` is the per-call check, over the buffers of the layers ``layers`` picks (None:
    all; an int; a range with step 1; anything else: all): per torch tensor, its data pointer and size
    in bytes against the recorded ones; per other watched buffer, its ``_Watch``. ``changed(layers)``
    says which differ, in words."""

    __slots__ = ("labels", "by_layer", "every", "kept")

    def __init__(self, layers: Sequence[Sequence[tuple[str, Any]]]) -> None:
        """``layers``: per layer, its (label, buffer) pairs; one entry for a view whose buffers hold
        every layer."""
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


def hold(view: CacheView) -> tuple[Held | None, list[Any], tuple[np.ndarray, ...]]:
    """What ``view`` holds of its K (and V) buffers, by layer for a per-layer view (K and V of a
    vLLM/FlashInfer layer share one array): ``(Held, or None if nothing needs comparing per call;
    what keeps the other buffers' memory from moving; the NumPy arrays whose writable flag a copy into
    the view reads again, arrays.flagged: its buffers, or for raw tables the layers kv.layer_table
    recorded behind them)``."""
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


# --- a user layout's arithmetic ----------------------------------------------------------------------

SCALAR_TOKENS = 1 << 16  # an arithmetic NumPy cannot evaluate is evaluated token by token up to this many
CHUNK = 1 << 20  # tokens per vectorised evaluation


def _integer(value: Any, what: str, view: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{view}: its {what} gave {value!r} ({type(value).__name__}); the address arithmetic must "
                        "give integers (use // for division)")
    return int(value)


def _scalar(function: Callable[[Any], Any], x: int, what: str, view: str) -> int:
    """``function(x)`` as an int; ``TypeError`` naming ``what`` if it raises or gives something else."""
    try:
        value = function(x)
    except Exception as error:  # noqa: BLE001 - a user's function: say which one failed, and why
        raise TypeError(f"{view}: its {what} raised {type(error).__name__} ({error}) when kvnumba evaluated it on "
                        "the host to check the addresses it gives") from None
    return _integer(value, what, view)


def _over(view: str, what: str, function: Callable[[Any], Any], count: int) -> tuple[int, int, int, int, set[int]]:
    """``function(x)`` for every ``x`` in ``range(count)`` (``count >= 1``): ``(lowest, its x, highest,
    its x, residues mod 8)``. Vectorised over NumPy int64 arrays where ``function`` allows it (checked
    against plain integers at the ends and a few points between); else one value at a time, up to
    SCALAR_TOKENS values."""
    probes = sorted({0, count - 1, count // 2, count // 3, (2 * count) // 3, max(count - 2, 0)})
    exact = {x: _scalar(function, x, what, view) for x in probes}
    lo = hi = exact[0]
    lo_at = hi_at = 0
    residues: set[int] = set()
    try:
        with np.errstate(all="raise"):
            for start in range(0, count, CHUNK):
                xs = np.arange(start, min(start + CHUNK, count), dtype=np.int64)
                values = np.asarray(function(xs))
                if values.ndim == 0:  # it does not depend on x
                    values = np.full(len(xs), values)
                if values.shape != xs.shape or values.dtype.kind not in "iu":
                    raise TypeError(f"it gave {values.dtype} {values.shape}, not int64 ({len(xs)},)")
                for x in probes:
                    if start <= x < start + len(xs) and int(values[x - start]) != exact[x]:
                        raise TypeError(f"{int(values[x - start])} over NumPy, {exact[x]} on integers at {x}")
                low, high = int(np.argmin(values)), int(np.argmax(values))
                if int(values[low]) < lo:
                    lo, lo_at = int(values[low]), start + low
                if int(values[high]) > hi:
                    hi, hi_at = int(values[high]), start + high
                residues.update(int(r) for r in np.unique(values % 8))
        return lo, lo_at, hi, hi_at, residues
    except Exception as error:  # noqa: BLE001 - not vectorisable: evaluate value by value, or refuse
        if count > SCALAR_TOKENS:
            raise TypeError(f"{view}: its {what} cannot be evaluated over NumPy arrays ({error}), and {count} values "
                            f"are too many to check one by one (at most {SCALAR_TOKENS}): write it as integer "
                            "arithmetic (+, -, *, //, %) so that kvnumba can check every address") from None
    lo, lo_at, hi, hi_at, residues = exact[0], 0, exact[0], 0, set()
    for x in range(count):
        value = _scalar(function, x, what, view)
        if value < lo:
            lo, lo_at = value, x
        if value > hi:
            hi, hi_at = value, x
        residues.add(value % 8)
    return lo, lo_at, hi, hi_at, residues


def _layer_offset(layer_base: Callable[..., Any], base: int, dim: int, item: int, heads: int, page: int,
                  layer: Any) -> Any:
    return layer_base(base, layer, dim, item, heads, page) - base


def _bases(buffer: Any) -> list[int]:
    """Where to evaluate ``layer_base``: the buffer's own address, which the kernel will be given (it is
    re-checked on every call); for an array without one (a shape only), two others, which must agree."""
    try:
        return [array_info(buffer, "buffer").ptr]
    except (TypeError, ValueError):
        return [0, 1 << 40]


def check_arithmetic(view: CacheView, heads: int) -> None:
    """Refuse ``view`` (``ValueError``) if its address arithmetic, in a copy that goes by ``heads`` heads,
    puts any byte of any item of any layer, token and head outside its buffer (K and V each against
    its own bytes) or any 8-byte word off an 8-byte boundary; ``TypeError`` for an arithmetic that
    does not give integers or cannot be evaluated. Exact: the kernel's address is a layer part plus a
    token part plus ``head * head_stride``, so its extremes are the sums of the parts' extremes, and
    the parts are evaluated at every layer and every token."""
    assert view.parts is not None  # CacheView.__init__ checked it
    g = view.geometry
    if g.tokens <= 0 or g.layers <= 0:
        return  # no item to copy: every token index is refused
    name = type(view).__name__
    layer_base, token_offset, head_stride = view.parts.py
    dim, item, page = g.layout_dim, g.item_bytes, g.page_size
    chunk = item // heads
    stride = _scalar(lambda _: head_stride(dim, item, heads, page), 0, "head_stride", name)
    head_lo, head_hi = min(0, (heads - 1) * stride), max(0, (heads - 1) * stride)
    head_at = {head_lo: 0 if head_lo == 0 else heads - 1, head_hi: heads - 1 if head_hi > 0 else 0}
    t_lo, t_lo_at, t_hi, t_hi_at, t_res = _over(name, "token_offset", lambda t: token_offset(t, dim, item, heads, page),
                                                g.tokens)
    kinds: list[tuple[str, Any]] = [("k", view.k)] + ([] if view.v is None else [("v", view.v)])
    for which, buffer in kinds:  # V too where it shares K's arrays (vLLM): its addresses differ
        if view.per_layer:  # a table of layer addresses: layer l starts at its own array's address (+ an offset)
            addresses = view.layer_addresses(which) if hasattr(view, "layer_addresses") else None
            layers = []
            for i, layer in enumerate(buffer):
                label = f"{which}[{i}]"
                shape, itemsize, _ = shape_of(layer, label)
                offset = addresses[i] - array_info(layer, label).ptr if addresses else 0
                layers.append((label, offset, offset, i, i, math.prod(shape) * itemsize, {offset % 8}))
        else:
            shape, itemsize, _ = shape_of(buffer, which)
            found = [_over(name, "layer_base", functools.partial(_layer_offset, layer_base, base, dim, item, heads, page),
                           g.layers) for base in _bases(buffer)]
            if any(f[::2] != found[0][::2] for f in found[1:]):
                raise ValueError(f"{name}: its layer_base does more than add an offset to the buffer's address (its "
                                 f"layers span [{found[0][0]}, {found[0][2]}] at base 0, [{found[1][0]}, "
                                 f"{found[1][2]}] at base {1 << 40}): kvnumba cannot bound it")
            l_lo, l_lo_at, l_hi, l_hi_at, l_res = found[0]
            layers = [(which, l_lo, l_hi, l_lo_at, l_hi_at, math.prod(shape) * itemsize, l_res)]
        for label, l_lo, l_hi, l_lo_at, l_hi_at, nbytes, l_res in layers:
            low, high = l_lo + t_lo + head_lo, l_hi + t_hi + head_hi + chunk
            if high > nbytes or low < 0:
                over = high > nbytes
                layer, token, head = (l_hi_at, t_hi_at, head_at[head_hi]) if over else (l_lo_at, t_lo_at,
                                                                                         head_at[head_lo])
                start = high - chunk if over else low
                how = f"{heads} heads of {chunk} bytes" if heads > 1 else f"whole items of {chunk} bytes"
                raise ValueError(f"{name}: its address arithmetic puts token {token}, layer {layer}, head {head} "
                                 f"at bytes [{start}, {start + chunk}) outside {label} ({nbytes} bytes), copying {how}")
            if {(a + b) % 8 for a in l_res for b in t_res} != {0} or (heads > 1 and stride % 8):
                raise ValueError(f"{name}: its address arithmetic puts items of {label} off 8-byte boundaries "
                                 f"(layer offsets mod 8: {sorted(l_res)}, token offsets mod 8: {sorted(t_res)}, "
                                 f"head stride {stride}): the kernels move 8-byte words")
