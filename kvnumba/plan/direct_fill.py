"""The copy-engine routes' per-call pass: check the host indices, find the runs or pages, and write every copy's
destination, source and size into a prepared batch, in one compiled loop over the indices.

Why compiled: the same work in NumPy takes a dozen array operations, each with its own temporary and fixed
cost, which is the whole call at 64 to 512 tokens; a ``numba.njit`` function touches each index once. It is
compiled on first use and cached on disk (``kvnumba.arrays.compiled``).

``engine_pass`` is ``kv.copy``'s whole copy-engine pass for one pair of layouts: bounds check, both sides' token
arithmetic, runs and copies in one loop, compiled for that pair on first use.

Each function returns the number of copies written, or ``BAD`` when an index is out of range; the caller then
runs the plain checks (``kvnumba.checks.bounds``), which raise the usual error, and submits nothing. Arrays are
int64; ``out`` is ``(3, room)``: destinations, sources, sizes.

``submit_pages`` and ``submit_runs`` go one step further on a GPU: they read the host indices by address, ask
whether the stream captures and which context is current, fill, and call ``cudaMemcpyBatchAsync``, all in one
compiled call (``kvnumba.driver.c_calls``; the addresses and shared arguments in a prepared batch's ``native``
array). They answer ``NOT_HERE`` (nothing done: the caller takes the plain path, which refuses a capture and
makes the buffers' context current), ``BAD``, ``FAILED`` or the count submitted, for ``PreparedBatch.settle``.
"""
import numpy as np
from numba import njit
from numba.core.errors import NumbaError

from ..arrays import compiled as _compiled
from ..driver.batch_copy import (ATTRIBUTES, ATTRIBUTES_INDEX, BATCH_FUNCTION, CAPTURING_FUNCTION, CONTEXT,
                                 CONTEXT_FUNCTION, COUNT, CURRENT, ERROR, FAIL, FAILED, HAS_FAIL_INDEX, NOT_HERE,
                                 STATUS)
from ..driver.c_calls import call_c, int64_view

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
    runs = 0
    for i in range(n):
        if i == 0 or s_off[i] != s_off[i - 1] + chunk or d_off[i] != d_off[i - 1] + chunk:
            out[0, runs], out[1, runs], out[2, runs] = s_off[i], d_off[i], i
            runs += 1
    return write_runs(out, runs, n, chunk, bases)


@_compiled
def write_runs(out, runs, n, chunk, bases):
    """The copies of ``runs`` runs over ``n`` tokens whose source offset, destination offset and first position
    are in ``out[:, :runs]``: one per (part of ``bases``, run), runs inner. Copy (part, r) lands at ``part * runs +
    r``: run r's own slot for part 0 (read first), past every run's for the others; so runs go from the last."""
    parts = bases.shape[1]
    end = n
    for r in range(runs - 1, -1, -1):
        s_off, d_off, start = out[0, r], out[1, r], out[2, r]
        size = (end - start) * chunk
        for part in range(parts):
            k = part * runs + r
            out[0, k] = bases[1, part] + d_off
            out[1, k] = bases[0, part] + s_off
            out[2, k] = size
        end = start
    return parts * runs


def engine_pass(src_function, dst_function):
    """``kv.copy``'s copy-engine pass for two of kvnumba's layouts, whose token arithmetic is ``src_function`` and
    ``dst_function`` (``token_offset(token, layout_dim, item_size, heads, page_size)``), compiled for the host on
    its first call and memoised.

    ``scan(s_idx, d_idx, s_limit, d_limit, s_shape, d_shape, item_size, heads, bases, out)`` checks every index
    against its side's exclusive limit (``BAD`` at the first one outside), computes both token offsets, finds the
    runs (both offsets advance by one chunk, ``item_size // heads``) and writes them (``write_runs``), as
    ``fill_engine`` does from the same offsets. ``s_shape``/``d_shape``: a side's ``(layout_dim, page_size)``."""
    key = (src_function, dst_function)
    found = _passes.get(key)
    if found is None:
        found = _passes[key] = _engine_pass(njit(src_function), njit(dst_function))
    return found


_passes: dict = {}  # (src token function, dst token function) -> its compiled pass


def _engine_pass(src_part, dst_part):
    @njit(nogil=True)
    def scan(s_idx, d_idx, s_limit, d_limit, s_shape, d_shape, item_size, heads, bases, out):
        n = s_idx.shape[0]
        chunk = item_size // heads
        s_dim, s_page, d_dim, d_page = s_shape[0], s_shape[1], d_shape[0], d_shape[1]
        runs = 0
        last_s = last_d = 0
        for i in range(n):  # each run's token offsets and first position, in out[:, :runs]
            a, b = s_idx[i], d_idx[i]
            if a < 0 or a >= s_limit or b < 0 or b >= d_limit:
                return BAD
            s_off = src_part(a, s_dim, item_size, heads, s_page)
            d_off = dst_part(b, d_dim, item_size, heads, d_page)
            if i == 0 or s_off != last_s + chunk or d_off != last_d + chunk:
                out[0, runs], out[1, runs], out[2, runs] = s_off, d_off, i
                runs += 1
            last_s, last_d = s_off, d_off
        return write_runs(out, runs, n, chunk, bases)

    return scan


@_compiled
def stream_ready(native, stream):
    """Whether the compiled submission may go on: ``stream`` is not capturing (nor unable to say) and the
    context current on this thread is the plan's."""
    words = native.ctypes.data
    native[STATUS] = 0  # cudaStreamCaptureStatus is 4 bytes: the word's high half stays 0
    if call_c(native[CAPTURING_FUNCTION], (stream, words + 8 * STATUS)) != 0 or native[STATUS] != 0:
        return False
    native[CURRENT] = 0
    return call_c(native[CONTEXT_FUNCTION], (words + 8 * CURRENT,)) == 0 and native[CURRENT] == native[CONTEXT]


@_compiled
def submit_batch(native, out, count, stream):
    """``cudaMemcpyBatchAsync`` of ``out[:, :count]`` on ``stream``: ``count``, or ``FAILED`` with the error in
    ``native[ERROR]`` (and the failing copy in ``native[FAIL]`` where the runtime reports it); a fill's ``BAD``
    is passed on, nothing submitted."""
    native[COUNT] = count
    if count <= 0:
        return count
    room = out.shape[1]
    dsts = out.ctypes.data
    shared = (dsts, dsts + 8 * room, dsts + 16 * room, count, native[ATTRIBUTES], native[ATTRIBUTES_INDEX], np.int64(1))
    native[FAIL] = -1
    if native[HAS_FAIL_INDEX]:  # CUDA 12's signature: size_t* failIdx before the stream
        error = call_c(native[BATCH_FUNCTION], shared + (native.ctypes.data + 8 * FAIL, stream))
    else:
        error = call_c(native[BATCH_FUNCTION], shared + (stream,))
    native[ERROR] = error
    return count if error == 0 else FAILED


@_compiled
def submit_pages(lf_address, pf_address, n, params, bases, out, native, stream):
    """``fill_pages`` of the ``n`` host indices at ``lf_address`` and ``pf_address``, then its copies submitted
    (see the module docstring for the answers)."""
    if not stream_ready(native, stream):
        return NOT_HERE
    count = fill_pages(int64_view(lf_address, n), int64_view(pf_address, n), params, bases, out)
    return submit_batch(native, out, count, stream)


@_compiled
def submit_runs(s_address, d_address, n, limits, bases, out, native, stream):
    """``fill_runs`` of the ``n`` host indices at ``s_address`` and ``d_address``, then its copies submitted."""
    if not stream_ready(native, stream):
        return NOT_HERE
    count = fill_runs(int64_view(s_address, n), int64_view(d_address, n), limits, bases, out)
    return submit_batch(native, out, count, stream)
