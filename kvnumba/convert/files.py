"""Whole-cache files converted between layouts (``kv.convert`` of a path, ``kvnumba convert``): ``.npy``,
``.npz`` and ``.safetensors`` files, in and out in any mix, in chunks. What each format keeps, and holds in
memory, is described in docs/guides/convert.md.

The input is checked before anything is written (``kvnumba.convert.inputs``). The output is written under a
temporary name (``kvnumba.convert.outputs``) and appears complete, by ``os.replace``, or not at all: on any
error, and on SIGINT, SIGTERM or SIGHUP (``interrupt_on_signals``), the temporary file is removed and an
existing output is left as it was.
"""
import contextlib
import math
import os
import signal
import threading

import numpy as np

from .. import config
from ..checks import validate
from ..errors import Interrupted
from . import nvfp4_pages, pool_files, quantised, unified
from .inputs import SOURCES, checked_kind
from .outputs import WRITERS, checked_for, checked_output, removed_on_failure, temporary
from .shapes import canonical_view, converted_shape, layout, view_page_size


_CLEANUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_on_signals():
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``, so that the temporary output
    is removed (by default SIGTERM and SIGHUP end the process at once, leaving it behind). Only default
    handlers are replaced, and only on the main thread (the only one that may set them); they are restored
    afterwards."""
    replaced = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _CLEANUP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_DFL or previous is signal.default_int_handler:
                replaced[signum] = previous
                signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)


def chunks(shape, itemsize, chunk_bytes):
    """Slices ``(layers, pages)`` of the canonical index space ``(L, pages, P, *item)``, each at most
    about ``chunk_bytes`` (never less than one page of one layer)."""
    layers, pages = shape[0], shape[1]
    page_bytes = math.prod(shape[2:]) * itemsize  # one page of one layer
    column = layers * page_bytes  # one page of every layer
    if column <= chunk_bytes:
        layer_step, page_step = max(1, layers), max(1, chunk_bytes // max(column, 1))  # layers may be 0
    else:
        layer_step, page_step = max(1, chunk_bytes // max(page_bytes, 1)), 1
    for p0 in range(0, pages, page_step):
        for l0 in range(0, layers, layer_step):
            yield slice(l0, min(l0 + layer_step, layers)), slice(p0, min(p0 + page_step, pages))


def copy_views(src_view, dst_view, chunk_bytes, bar=None):
    """Fill ``dst_view`` from ``src_view``, two pictures ``(L, pages, P, *item)`` of the same elements (items
    in head order), chunk by chunk."""
    for layers, pages in chunks(src_view.shape, src_view.itemsize, chunk_bytes):
        block = np.ascontiguousarray(src_view[layers, pages])  # read one chunk of the input
        unified.put(block, dst_view[layers, pages])
        if bar is not None:
            bar.advance(block.nbytes)


def convert_array_into(array, out, src, dst, page_size, chunk_bytes, bar=None):
    """Fill ``out`` (layout ``dst``) from ``array`` (layout ``src``), chunk by chunk; both NumPy (or memmaps)."""
    p = view_page_size(src, dst, page_size)
    copy_views(canonical_view(array, src, p), canonical_view(out, dst, p), chunk_bytes, bar)


def _shape_in(item, kind, in_path, src, dst, page_size):
    """``item``'s shape in ``dst``; ``ValueError`` naming the file (and the array, in an archive)."""
    try:
        return converted_shape(item.shape, src, dst, page_size)
    except ValueError as err:
        where = in_path if kind == ".npy" else f"{in_path}[{item.name}]"
        raise ValueError(f"{where}: {err}") from None


def convert_file(in_path, out_path, src, dst, page_size=None, *, chunk_bytes=None, progress=None,
                 overwrite=False, dtype=None, head_groups=None):
    """Convert a ``.npy`` file, or every array of a ``.npz`` archive or a ``.safetensors`` file, from layout
    ``src`` to ``dst`` into ``out_path``; return the output shape per array name (``""`` for a ``.npy``
    output).

    ``src``, ``dst``, ``page_size``, ``overwrite``, ``dtype`` and ``head_groups`` are ``kv.convert``'s, whose
    docstring lists the errors. ``chunk_bytes``: bytes per chunk (default ``$KVNUMBA_CHUNK_BYTES``, else
    64 MiB). ``progress``: ``progress(label, nbytes)``, a context manager giving a bar whose ``advance(n)``
    is called after each chunk of ``n`` bytes (``kvnumba.tools.progress.progress`` with a stream bound, as
    ``kvnumba convert`` passes it); None: no progress. SIGINT, SIGTERM and SIGHUP meanwhile raise
    ``Interrupted``. Nothing is written on any error.
    """
    src = layout(src, "src", unified=True)
    dst = src if dtype == "nvfp4" else layout(dst, "dst", unified=True)  # nvfp4: vLLM's pages, whatever dst
    in_path, out_path = os.fspath(in_path), os.fspath(out_path)
    if page_size is not None:  # checked even where the layouts do not use it: 0 is a mistake, not "none"
        page_size = validate.integer("page_size", page_size, minimum=1)
    dtype = quantised.checked_dtype(dtype)
    pooled = src.kv_pool or dst.kv_pool
    if pooled and dtype is not None:
        raise ValueError(f"dtype={dtype!r} does not combine with page_unified: quantise or dequantise the file in "
                         "another layout, then convert it")
    if head_groups is not None:
        if not dst.kv_pool:
            raise ValueError("head_groups applies to dst='page_unified' (a pool's head groups); leave it out")
        head_groups = validate.integer("head_groups", head_groups, minimum=1)
    chunk_bytes = config.chunk_bytes() if chunk_bytes is None else int(chunk_bytes)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    kind = checked_kind(in_path)
    out_kind = checked_output(in_path, out_path, overwrite)
    with interrupt_on_signals(), SOURCES[kind](in_path) as read:
        if dtype == "nvfp4":  # already laid out: vLLM's pages (kvnumba.convert.nvfp4_pages)
            source = nvfp4_pages.paged(read, src, page_size, in_path)
            shapes = {item.name: item.shape for item in source.items}
        else:  # every array's shape and dtype is checked before anything is written
            source = quantised.transformed(read, dtype, in_path)  # as it is, quantised or dequantised
            if pooled:  # K and V paired by name with the pool (kvnumba.convert.pool_files)
                source, shapes, made_of = pool_files.outputs(source, kind, in_path, src, dst, page_size, head_groups)
            else:
                shapes = {item.name: _shape_in(item, kind, in_path, src, dst, page_size) for item in source.items}
        checked_for(out_kind, source, in_path, out_path)
        base = os.path.basename(in_path)

        def convert(item, out):
            label = base if kind == ".npy" else f"{base}[{item.name}]"
            array = None if pooled else item.load()
            with (contextlib.nullcontext() if progress is None
                  else progress(label, out.nbytes if array is None else array.nbytes)) as bar:
                if array is None:  # pooled
                    pool_files.fill(item, out, made_of, src, dst, page_size,
                                    lambda a, b: copy_views(a, b, chunk_bytes, bar))
                elif dtype == "nvfp4":
                    out[...] = array
                    if bar is not None:
                        bar.advance(array.nbytes)
                else:
                    convert_array_into(array, out, src, dst, page_size, chunk_bytes, bar)

        needed = sum(math.prod(item.shape) * item.dtype.itemsize for item in source.items)
        tmp = temporary(out_path)
        with removed_on_failure(tmp, out_path, needed=needed if out_kind == ".npy" else None):
            WRITERS[out_kind](tmp, out_path, source, shapes, convert, chunk_bytes)
            os.replace(tmp, out_path)
    if out_kind == ".npy":
        return {"": next(iter(shapes.values()))}
    return shapes


__all__ = ["Interrupted", "chunks", "convert_array_into", "convert_file", "copy_views", "interrupt_on_signals"]
