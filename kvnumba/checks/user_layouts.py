"""The bytes a view's address arithmetic reaches, checked before any kernel runs it.

A layout of the user's (``check_user_layout``, run when ``kv.CacheView`` makes a view and by ``kv.copy``'s plan
for the heads a copy goes by): its three address functions evaluated at every layer and every token
(vectorised over NumPy arrays), with the first and last heads of the copy: every byte the kernel can touch must
lie in its buffer, K and V each against its own bytes, on 8-byte boundaries. kvnumba's own views (their
arithmetic follows their shapes) and raw tables (their layers' bytes bound them) pass at once.

Every view, on every plan and export (``kind_offset``): a plan adds ``view.kind_offset(which)`` to a buffer's
address and lets the kernel (or the copy engine) reach ``layer part + token part + head part`` beyond it, so the
offset must be a non-negative integer and ``offset + hull`` lie within the buffer, the hull being the span of
the arithmetic over every layer, token and head: from its corners for kvnumba's own view classes, whose parts
grow with each; from the evaluation at every layer and token for any other. What is found is remembered per view
(weakly); the offset is checked on every plan, since the pointers get it.
"""
from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import array_info, shape_of
from ..kernels import layouts

_checked: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()  # view -> heads checked


def check_user_layout(view: Any, heads: int | None = None) -> None:
    """Refuse a view of the user's if the kernel could touch a byte outside a buffer in a copy by ``heads``
    heads (None: every count of heads a copy of this view can go by)."""
    if view.built_in or view.raw_tables:
        return
    if view.per_layer and not view.parts.table:
        raise TypeError(f"{type(view).__name__}: a layout with its own address arithmetic takes one buffer "
                        "for K (and one for V), not per-layer lists")
    checked = _checked.setdefault(view, set())
    g = view.geometry
    wanted = {heads} if heads is not None else (
        ({1} if not view.head_split or g.heads == 1 else set()) | ({g.heads} if g.heads > 1 else set()))
    for h in sorted(wanted - checked):
        check_arithmetic(view, h)
        checked.add(h)


SCALAR_TOKENS = 1 << 16  # an arithmetic NumPy cannot evaluate is evaluated token by token up to this many
CHUNK = 1 << 20  # tokens per vectorised evaluation


def _integer(value: Any, what: str, view: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{view}: its {what} gave {value!r} ({type(value).__name__}); the address arithmetic must "
                        "give integers (use // for division)")
    return int(value)


def _scalar(function: Callable[[Any], Any], x: int, what: str, view: str) -> int:
    try:
        value = function(x)
    except Exception as error:  # noqa: BLE001 - a user's function: say which one failed, and why
        raise TypeError(f"{view}: its {what} raised {type(error).__name__} ({error}) when kvnumba evaluated it on "
                        "the host to check the addresses it gives") from None
    return _integer(value, what, view)


def _over(view: str, what: str, function: Callable[[Any], Any], count: int) -> tuple[int, int, int, int, set[int]]:
    """``function(x)`` for every ``x`` in ``range(count)``: ``(lowest, its x, highest, its x, residues mod 8)``.
    Vectorised over NumPy int64 arrays where ``function`` allows it (checked against plain integers at a few
    points); else one value at a time, up to SCALAR_TOKENS values."""
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
    found = [_scalar(function, x, what, view) for x in range(count)]
    lo, hi = min(found), max(found)
    return lo, found.index(lo), hi, found.index(hi), {value % 8 for value in found}


def _layer_offset(layer_base: Callable[..., Any], base: int, dim: int, item: int, heads: int, page: int,
                  layer: Any) -> Any:
    return layer_base(base, layer, dim, item, heads, page) - base


def _bases(buffer: Any) -> list[int]:
    """Where to evaluate ``layer_base``: the buffer's own address; for an array without one, two others, which
    must agree."""
    try:
        return [array_info(buffer, "buffer").ptr]
    except (TypeError, ValueError):
        return [0, 1 << 40]


# view -> {(part, heads, base): what _over found}: the parts' extremes, shared by the check at construction and
# the hull every plan checks (hull), so that a plan does not evaluate them again
_spans: weakref.WeakKeyDictionary[Any, dict[tuple[str, int, int], Any]] = weakref.WeakKeyDictionary()


def head_stride_of(view: Any, heads: int) -> int:
    g = view.geometry
    head_stride = view.parts.py[2]
    return _scalar(lambda _: head_stride(g.layout_dim, g.item_bytes, heads, g.page_size), 0, "head_stride",
                   type(view).__name__)


def token_span(view: Any, heads: int) -> tuple[int, int, int, int, set[int]]:
    memo = _spans.setdefault(view, {})
    found = memo.get(("token", heads, 0))
    if found is None:
        g = view.geometry
        token_offset = view.parts.py[1]
        found = memo[("token", heads, 0)] = _over(
            type(view).__name__, "token_offset",
            lambda t: token_offset(t, g.layout_dim, g.item_bytes, heads, g.page_size), g.tokens)
    return found


def layer_span(view: Any, heads: int, base: int) -> tuple[int, int, int, int, set[int]]:
    memo = _spans.setdefault(view, {})
    found = memo.get(("layer", heads, base))
    if found is None:
        g = view.geometry
        found = memo[("layer", heads, base)] = _over(
            type(view).__name__, "layer_base",
            functools.partial(_layer_offset, view.parts.py[0], base, g.layout_dim, g.item_bytes, heads, g.page_size),
            g.layers)
    return found


def check_arithmetic(view: Any, heads: int) -> None:
    """Refuse ``view`` (``ValueError``) if its arithmetic, in a copy by ``heads`` heads, puts any byte outside its
    buffer or any word off an 8-byte boundary; ``TypeError`` for one that does not give integers. Exact: an
    address is a layer part plus a token part plus ``head * head_stride``, so its extremes are the sums of the
    parts' extremes, evaluated at every layer and every token."""
    assert view.parts is not None  # CacheView.__init__ checked it
    g = view.geometry
    if g.tokens <= 0 or g.layers <= 0:
        return  # no item to copy: every token index is refused
    name = type(view).__name__
    chunk = g.item_bytes // heads
    stride = head_stride_of(view, heads)
    head_lo, head_hi = min(0, (heads - 1) * stride), max(0, (heads - 1) * stride)
    head_at = {head_lo: 0 if head_lo == 0 else heads - 1, head_hi: heads - 1 if head_hi > 0 else 0}
    t_lo, t_lo_at, t_hi, t_hi_at, t_res = token_span(view, heads)
    kinds: list[tuple[str, Any]] = [("k", view.k)] + ([] if view.v is None else [("v", view.v)])
    for which, buffer in kinds:  # V too where it shares K's arrays (vLLM): its addresses differ
        offset = _integer(view.kind_offset(which), f"kind_offset({which!r})", name)
        if view.per_layer:  # a table of layer addresses: layer l starts at its own array's address (+ an offset)
            layers = []
            for i, layer in enumerate(buffer):
                label = f"{which}[{i}]"
                shape, itemsize, _ = shape_of(layer, label)
                layers.append((label, offset, offset, i, i, math.prod(shape) * itemsize, {offset % 8}))
        else:
            shape, itemsize, _ = shape_of(buffer, which)
            found = [layer_span(view, heads, base) for base in _bases(buffer)]
            if any(f[::2] != found[0][::2] for f in found[1:]):
                raise ValueError(f"{name}: its layer_base does more than add an offset to the buffer's address (its "
                                 f"layers span [{found[0][0]}, {found[0][2]}] at base 0, [{found[1][0]}, "
                                 f"{found[1][2]}] at base {1 << 40}): kvnumba cannot bound it")
            l_lo, l_lo_at, l_hi, l_hi_at, l_res = found[0]
            layers = [(which, l_lo + offset, l_hi + offset, l_lo_at, l_hi_at, math.prod(shape) * itemsize,
                       {(r + offset) % 8 for r in l_res})]
        for label, l_lo, l_hi, l_lo_at, l_hi_at, nbytes, l_res in layers:
            low, high = l_lo + t_lo + head_lo, l_hi + t_hi + head_hi + chunk
            if high > nbytes or low < 0:
                over = high > nbytes
                layer, token, head = (l_hi_at, t_hi_at, head_at[head_hi]) if over else (l_lo_at, t_lo_at,
                                                                                         head_at[head_lo])
                start = high - chunk if over else low
                how = f"{heads} heads of {chunk} bytes" if heads > 1 else f"whole items of {chunk} bytes"
                raise ValueError(f"{name}: its address arithmetic puts token {token}, layer {layer}, head {head} "
                                 f"at bytes [{start}, {start + chunk}) outside {label} ({nbytes} bytes), copying {how}"
                                 + (f"; its kind_offset({which!r}) is {offset}" if offset else ""))
            if {(a + b) % 8 for a in l_res for b in t_res} != {0} or (heads > 1 and stride % 8):
                raise ValueError(f"{name}: its address arithmetic puts items of {label} off 8-byte boundaries "
                                 f"(layer offsets mod 8: {sorted(l_res)}, token offsets mod 8: {sorted(t_res)}, "
                                 f"head stride {stride}): the kernels move 8-byte words"
                                 + (f"; its kind_offset({which!r}) is {offset}" if offset else ""))


# view -> (heads, lo, hi): bytes [lo, hi) from a buffer's address (a table layout: from each layer's own)
_hulls: weakref.WeakKeyDictionary[Any, tuple[int, int, int]] = weakref.WeakKeyDictionary()


def copy_heads_of(view: Any) -> int:
    """The runs a copy of ``view`` cuts a token's item into (``layouts.head_runs``): a copy by more runs of a
    layout that keeps a token's heads together touches the same bytes."""
    return layouts.head_runs(view.parts, view.geometry.heads)


def hull(view: Any) -> tuple[int, int]:
    """``[lo, hi)``: the bytes a copy of ``view`` can touch, from its buffer's (or layer's) address."""
    heads = copy_heads_of(view)
    known = _hulls.get(view)
    if known is not None and known[0] == heads:
        return known[1], known[2]
    lo, hi = (_corners if type(view).built_in else _everywhere)(view, heads)
    _hulls[view] = (heads, lo, hi)
    return lo, hi


def _corners(view: Any, heads: int) -> tuple[int, int]:
    g = view.geometry
    layer_base, token_offset, head_stride = view.parts.py
    dim, item, page = g.layout_dim, g.item_bytes, g.page_size
    stride = int(head_stride(dim, item, heads, page))
    first = int(token_offset(0, dim, item, heads, page))
    last = int(token_offset(g.tokens - 1, dim, item, heads, page)) + (heads - 1) * stride + item // heads
    if not view.parts.table:
        first += int(layer_base(0, 0, dim, item, heads, page))
        last += int(layer_base(0, g.layers - 1, dim, item, heads, page))
    return first, last


def _everywhere(view: Any, heads: int) -> tuple[int, int]:
    """The parts' extremes as the check at construction found them (every layer and token), summed."""
    stride = head_stride_of(view, heads)
    t_lo, _, t_hi, _, _ = token_span(view, heads)
    chunk = view.geometry.item_bytes // heads
    lo, hi = t_lo + min(0, (heads - 1) * stride), t_hi + max(0, (heads - 1) * stride) + chunk
    if not view.parts.table:
        l_lo, _, l_hi, _, _ = layer_span(view, heads, _bases(view.k)[0])
        lo, hi = lo + l_lo, hi + l_hi
    return lo, hi


def kind_offset(view: Any, which: str, nbytes: list[int], label: str) -> int:
    """``view.kind_offset(which)``, checked: an integer >= 0 that keeps every byte a copy can touch inside each of
    the kind's buffers (``nbytes``: one per layer for a per-layer view); else an error naming ``label``."""
    name = type(view).__name__
    offset = view.kind_offset(which)
    if isinstance(offset, bool) or not hasattr(offset, "__index__"):
        raise TypeError(f"{label}: {name}.kind_offset({which!r}) gave {offset!r} ({type(offset).__name__}); it must "
                        "be an integer number of bytes")
    offset = int(offset.__index__())
    if offset < 0 or offset % 8:
        raise ValueError(f"{label}: {name}.kind_offset({which!r}) gave {offset}; it must be a non-negative multiple "
                         "of 8 bytes")
    lo, hi = hull(view)
    for i, size in enumerate(nbytes):
        if offset + lo < 0 or offset + hi > size:
            where = f"{which}[{i}]" if len(nbytes) > 1 else which
            raise ValueError(f"{label}: {name} with kind_offset({which!r}) = {offset} reaches bytes "
                             f"[{offset + lo}, {offset + hi}) of {where}, which holds {size} bytes: a copy would "
                             "touch memory outside the buffer")
    return offset
