"""The copy-engine routes' per-call pass: check the host indices, find the runs or pages, and write every copy's
destination, source and size into a prepared batch, in one compiled loop over the indices.

Why compiled: the same work in NumPy takes a dozen array operations, each with its own temporary and fixed
cost, which is the whole call at 64 to 512 tokens; a ``numba.njit`` function touches each index once. It is
compiled on first use and cached on disk (``kvnumba.checks.bounds.compiled``).

Each function returns the number of copies written, or ``BAD`` when an index is out of range; the caller then
runs the plain checks (``kvnumba.checks.bounds``), which raise the usual error, and submits nothing. Arrays are
int64; ``out`` is ``(3, room)``: destinations, sources, sizes.
"""
import numpy as np
from numba import njit
from numba.core.errors import NumbaError

from ..checks.bounds import compiled as _compiled

BAD = -1  # an index out of range: nothing to submit


def token_parts(function, tokens, layout_dim, item_size, heads, page_size):
    """``function(token, layout_dim, item_size, heads, page_size)`` for every token of ``tokens``, by a loop
    compiled for the host on first use of ``function`` (not cached on disk); None for tokens other than int64, or
    where Numba cannot compile ``function``: the caller evaluates it with NumPy (``plan.sides.elementwise``)."""
    if tokens.dtype != _INT64:  # Numba's integer promotions are NumPy's for int64 alone (uint64 * int64: float)
        return None
    loop = _loops.get(function, _UNSEEN)
    if loop is _UNSEEN:
        loop = _loops[function] = _token_loop(function)
    if loop is None:
        return None
    try:
        return loop(tokens, layout_dim, item_size, heads, page_size)
    except NumbaError:  # typed at the first call: not compilable; NumPy from now on
        _loops[function] = None
        return None


_UNSEEN = object()
_INT64 = np.dtype(np.int64)
_loops: dict = {}  # a layout's token function -> its compiled loop, or None


def _token_loop(function):
    try:
        part = njit(function)
    except (NumbaError, TypeError):
        return None

    @njit(nogil=True)
    def loop(tokens, layout_dim, item_size, heads, page_size):
        out = np.empty(tokens.shape[0], np.int64)
        for i in range(tokens.shape[0]):
            out[i] = part(tokens[i], layout_dim, item_size, heads, page_size)
        return out

    return loop


@_compiled
def fill_pages(lf_idx, pf_idx, params, bases, out):
    """Between layer-first and page-first-direct buffers: one copy per (page, layer, K/V), pages outer; only each
    page's first index is read (as SGLang's kernel does). ``params``: page size P, the layer-first limit (a page's
    first token ``< lf_tokens - P + 1``), the page-first limit (``pages * P``), bytes per token, bytes per page of
    every layer, bytes per copy, 1 for layer-first -> page-first. ``bases``: ``(2, layers, kinds)``, what a copy
    adds to its token offset (layer-first, ``[0]``) and to its page offset (page-first, ``[1]``)."""
    page, lf_limit, pf_limit, row, page_bytes, size, lf_to_pf = (params[0], params[1], params[2], params[3],
                                                                params[4], params[5], params[6])
    layers, kinds = bases.shape[1], bases.shape[2]
    k = 0
    for first in range(0, lf_idx.shape[0] - page + 1, page):
        token, slot = lf_idx[first], pf_idx[first]
        if token < 0 or token >= lf_limit or slot < 0 or slot >= pf_limit:
            return BAD
        lf_offset, pf_offset = token * row, slot // page * page_bytes
        for layer in range(layers):
            for kind in range(kinds):
                lf_address = bases[0, layer, kind] + lf_offset
                pf_address = bases[1, layer, kind] + pf_offset
                if lf_to_pf:
                    out[0, k], out[1, k] = pf_address, lf_address
                else:
                    out[0, k], out[1, k] = lf_address, pf_address
                out[2, k] = size
                k += 1
    return k


@_compiled
def fill_runs(s_idx, d_idx, limits, bases, out):
    """Between layer-first lists: one copy per run and layer, runs outer. A run goes on while both indices
    advance by one. ``limits``: the source's and the destination's rows; ``bases``: ``(3, layers)``, each
    layer's bytes per row, source base and destination base."""
    src_limit, dst_limit = limits[0], limits[1]
    layers = bases.shape[1]
    n = s_idx.shape[0]
    k = 0
    start = 0
    for i in range(n + 1):
        if i < n:
            a, b = s_idx[i], d_idx[i]
            if a < 0 or a >= src_limit or b < 0 or b >= dst_limit:
                return BAD
            if i == 0 or (a == s_idx[i - 1] + 1 and b == d_idx[i - 1] + 1):
                continue
        length = i - start
        a, b = s_idx[start], d_idx[start]
        for layer in range(layers):
            row = bases[0, layer]
            out[0, k] = bases[2, layer] + b * row
            out[1, k] = bases[1, layer] + a * row
            out[2, k] = length * row
            k += 1
        start = i
    return k


@_compiled
def fill_engine(s_off, d_off, chunk, bases, out):
    """``kv.copy``'s copy-engine copies: one per (K/V, layer, head, run), runs inner. A run goes on while both
    token offsets advance by ``chunk``; ``bases``: ``(2, copies per run)``, the source's and the destination's
    (K/V, layer, head) part, flattened in that order. Offsets are checked by the caller."""
    n = s_off.shape[0]
    parts = bases.shape[1]
    runs = 0
    for i in range(n):  # first the runs: their starts and lengths in out[2] (sizes are rewritten below)
        if i == 0 or s_off[i] != s_off[i - 1] + chunk or d_off[i] != d_off[i - 1] + chunk:
            out[2, runs] = i
            runs += 1
    # out[2, :runs] holds the starts. Copies are written runs from the last: copy (part, r) lands at
    # part * runs + r, which is r itself (already read) for part 0 and past every start for the others.
    end = n
    for r in range(runs - 1, -1, -1):
        start = out[2, r]
        size = (end - start) * chunk
        src, dst = s_off[start], d_off[start]
        for part in range(parts):
            k = part * runs + r
            out[0, k] = bases[1, part] + dst
            out[1, k] = bases[0, part] + src
            out[2, k] = size
        end = start
    return parts * runs
