"""Token limits: how many token slots of a buffer a transfer may address without leaving it, and the host's
check of indices against them.

``token_limit`` is the exclusive bound ``T`` such that every byte the kernel touches for any token ``0 <= t < T``
lies in the buffer, by ``kernels.layouts``' own arithmetic: a layout's closed form where it declares one
(``LayoutParts.token_limit``; the tests check it against ``item_end``), else a binary search over the monotonic
``item_end``. The index check is compiled for the CPU (``compiled``): one loop where NumPy's ``min`` and ``max``
make two, each with its own fixed cost.
"""
import functools

import numpy as np

from ..arrays import compiled
from ..driver.pointers import HOST
from ..errors import IndexOutOfRangeError
from ..kernels.params import NO_LIMIT
from ..kernels.layouts import PARTS, Layout, LayoutParts


@compiled
def _first_outside(values, low, high):
    for i in range(values.shape[0]):
        if values[i] < low or values[i] >= high:
            return i
    return -1


def item_end(layout, token, *, item_size, layout_dim, first_layer, num_layers, page_size, heads):
    """One past the last byte (from the buffer's base; a layer's base for tables) that token ``token``
    touches, over all layers of the call and all heads, by ``kvnumba.kernels.layouts``' own functions."""
    parts = layout if isinstance(layout, LayoutParts) else PARTS[Layout(layout)]
    layer_base, token_offset, head_stride = parts.py
    last_layer = first_layer + num_layers - 1
    if parts.table:
        layer_part = 0  # the table holds each layer's base; offsets start there
    else:
        layer_part = layer_base(0, last_layer, layout_dim, item_size, heads, page_size)  # grows with the layer
    token_part = token_offset(token, layout_dim, item_size, heads, page_size)
    head_part = (heads - 1) * head_stride(layout_dim, item_size, heads, page_size)  # last head
    return layer_part + token_part + head_part + item_size // heads


def token_limit(layout, nbytes, item_size, layout_dim=0, first_layer=0, num_layers=1, page_size=1, heads=1):
    """Exclusive token bound for one side of a transfer; ``NO_LIMIT`` when every token maps to the same bytes
    (``layout_dim == 0`` on a page-first side) and they fit. ``layout``: a ``LayoutParts`` or a seed layout's name."""
    parts = layout if isinstance(layout, LayoutParts) else PARTS[Layout(layout)]
    if parts.token_limit is not None:
        return parts.token_limit(nbytes, item_size, layout_dim, first_layer + num_layers - 1, page_size, heads)
    return _searched_limit(parts, nbytes, item_size, layout_dim, first_layer, num_layers, page_size, heads)


@functools.lru_cache(maxsize=4096)
def _searched_limit(parts, nbytes, item_size, layout_dim, first_layer, num_layers, page_size, heads):
    def end(t):
        return item_end(parts, t, item_size=item_size, layout_dim=layout_dim, first_layer=first_layer,
                        num_layers=num_layers, page_size=page_size, heads=heads)

    if end(0) > nbytes:
        return 0
    high = nbytes + 1  # end(t) grows by >= 1 per token whenever it grows at all
    if end(high) <= nbytes:
        return NO_LIMIT  # end does not grow (layout_dim 0): every token addresses the same bytes
    low = 0  # end(low) <= nbytes < end(high)
    while high - low > 1:
        mid = (low + high) // 2
        if end(mid) <= nbytes:
            low = mid
        else:
            high = mid
    return high


def host_indices(info):
    """Indices as a host NumPy array; a synchronous device-to-host copy for indices in GPU memory."""
    obj = info.obj
    if info.is_torch:
        if info.device == HOST and not obj.requires_grad:
            return obj.numpy()  # a CPU tensor's own memory: no copy, ~2 us less than .detach().cpu()
        return obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "copy_to_host"):
        return obj.copy_to_host()
    if hasattr(obj, "get"):
        return obj.get()
    raise TypeError(f"cannot bring indices of type {type(obj).__name__} to the host")  # pragma: no cover


def first_outside(values, low, high):
    """Position of the first value outside ``[low, high)``, or None. int64 values: one compiled pass; anything
    else vectorised, min/max first."""
    if (type(values) is np.ndarray and values.dtype == _INT64 and type(low) is int and type(high) is int
            and _INT64_MIN <= low and high <= _INT64_MAX):
        where = _first_outside(values, low, high)
        return None if where < 0 else where
    if len(values) == 0:
        return None
    if int(values.min()) >= low and int(values.max()) < high:
        return None
    return int(np.flatnonzero((values < low) | (values >= high))[0])


_INT64 = np.dtype(np.int64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def check_indices(name, values, limit, what, positions=None):
    """Every value of ``values`` (host NumPy) lies in ``[0, limit)``, else ``IndexOutOfRangeError``
    naming ``name``, the first offending position (``positions`` maps it back when ``values`` is a
    subset) and value, and the valid range of ``what`` (a string, or a function making one)."""
    where = first_outside(values, 0, limit)
    if where is None:
        return
    position = where if positions is None else int(positions[where])
    what = what() if callable(what) else what
    bound = "any token >= 0" if limit >= NO_LIMIT else f"[0, {limit})"
    raise IndexOutOfRangeError(f"{name}[{position}] = {int(values[where])} is out of range for {what}: "
                               f"valid tokens are {bound}; nothing was written")
