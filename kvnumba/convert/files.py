"""Whole-cache files converted between layouts: ``.npy`` files, ``.npz`` archives and ``.safetensors`` files,
in chunks (``kv.convert`` given a path, and ``kvnumba convert``, which adds the progress bar). Layouts are
the views' (``kvnumba.convert.shapes``). The input is read as its suffix says, the output written in the format
its suffix names (any mix: a ``.npy`` input's array is named after its file's stem in a ``.npz`` or
``.safetensors`` output); the output must not be the input, nor an existing file unless ``overwrite=True``.

- ``.npy``: the input is memory-mapped (``np.load(mmap_mode="r")``), the output is a memory-mapped
  ``.npy`` (``np.lib.format.open_memmap``) under a temporary name in the output's folder, filled chunk
  by chunk (blocks of pages, and of layers when one page of every layer is larger than a chunk);
  besides the mapped files, at most about one chunk is held in memory at once.
- ``.npz``: every array of the archive is converted (the same chunks); a member of a zip archive
  cannot be memory-mapped, so one input array and its output are in memory at a time. The new
  archive is written under a temporary name too, compressed if the input was.
- ``.safetensors``: every tensor of the file is converted (the same chunks), one input tensor in memory
  at a time (bf16 and fp8 ones are memory-mapped); the ``safetensors`` package writes the new file in
  one go, so every converted tensor is held until then (for any input). The file's ``__metadata__`` is
  kept in a ``.safetensors`` output, and bf16 and fp8 tensors keep their dtype (``kvnumba.convert.safetensors``);
  ``.npy`` and ``.npz`` files cannot hold those, and are refused as their output.
- ``dtype=``: bfloat16/float16 tensors quantised into FP8 codes and float32 scales, or a quantised file
  dequantised (``kvnumba.convert.quantised``, which gives the file format); ``"nvfp4"``: ``k`` and ``v``
  quantised into vLLM's NVFP4 pages (``kvnumba.convert.nvfp4_pages``).

Either way the output appears complete, by ``os.replace``, or not at all: on any error, and on
SIGINT, SIGTERM or SIGHUP, the temporary file is removed and an existing output is left as it was.
The input is checked before anything is written: its content must match its suffix, and every array
header must fit the bytes the file holds (every tensor's byte range, for a ``.safetensors`` file). The
``.npy`` output's disk space is reserved before it is mapped, so a full disk is an ``OSError`` rather
than a SIGBUS on a write into the map.
"""
import contextlib
import math
import os

import numpy as np

from .. import config
from ..checks import validate
from ..errors import Interrupted
from . import nvfp4_pages, pool_files, quantised, unified
from .inputs import SOURCES, checked_kind
from .outputs import WRITERS, checked_for, checked_output, removed_on_failure, temporary
from .shapes import canonical_view, converted_shape, layout, view_page_size
from .signals import interrupt_on_signals


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
    in head order: a pool's ``(G, H/G, D)`` against ``(H, D)``), chunk by chunk."""
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
    """``item``'s shape in ``dst``; a shape that does not fit ``src`` is a ``ValueError`` naming the file
    (and the array, in an archive)."""
    try:
        return converted_shape(item.shape, src, dst, page_size)
    except ValueError as err:
        where = in_path if kind == ".npy" else f"{in_path}[{item.name}]"
        raise ValueError(f"{where}: {err}") from None


def convert_file(in_path, out_path, src, dst, page_size=None, *, chunk_bytes=None, progress=None,
                 overwrite=False, dtype=None, head_groups=None):
    """Convert a ``.npy`` file, or every array of a ``.npz`` archive or a ``.safetensors`` file, from layout
    ``src`` to ``dst``.

    Parameters
    ----------
    in_path, out_path : str or os.PathLike
        Input and output files, each ``.npy``, ``.npz`` or ``.safetensors`` by its suffix (any mix): the
        input is read as its suffix says (and its content must agree), the output is written in the format
        its suffix names. A ``.npy`` output holds one array (a ``.npy`` input's array is named after its
        file's stem in the others); a ``.safetensors`` output keeps a ``.safetensors`` input's metadata;
        bfloat16 and float8 tensors can only be written to ``.safetensors``. ``out_path`` must not be the
        input (links included) nor, unless ``overwrite``, an existing file.
    src, dst : CacheView subclass or str
        Layouts, as in ``kvnumba.convert``: a view class (a user-defined layout too), its string name, or
        ``"module:Class"`` naming one.
    page_size : int, optional
        Required when either layout pages tokens; unused (but checked) when neither does (the command
        line refuses ``--page-size`` there).
    chunk_bytes : int, optional
        Bytes per chunk (default ``$KVNUMBA_CHUNK_BYTES``, else 64 MiB).
    progress : callable, optional
        ``progress(label, nbytes)``: a context manager giving a bar whose ``advance(n)`` is called after
        each chunk of ``n`` bytes (``kvnumba.tools.progress.progress`` with a stream bound, as ``kvnumba
        convert`` passes it). None (the default): no progress.
    overwrite : bool
        Replace an existing ``out_path`` (default False: ``FileExistsError``).
    dtype : {"fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"}, optional
        Quantise every bfloat16/float16 tensor into FP8 codes and float32 scales (a ``.safetensors`` output),
        or dequantise a quantised file; the file format is ``kvnumba.convert.quantised``'s. None (the
        default): every tensor as it is (a quantised file stays quantised). Not with page_unified.
    head_groups : int, optional
        The head groups of a page_unified output's pools (default 1); ``dst`` must be page_unified. K and V
        are paired with a pool by name (``kvnumba.convert.pool_files``): ``k`` and ``v`` make the pool ``kv``,
        and back.

    Returns
    -------
    dict
        Output shape per array (or tensor) name (``""`` for a ``.npy`` file).

    Raises
    ------
    ValueError
        For an unknown layout, a shape that does not fit, an input that is not ``.npy``, ``.npz`` or
        ``.safetensors`` by suffix and content, an array header that claims more data than the file
        holds, a ``.npz`` member that is not an array, a damaged ``.safetensors`` header or a dtype it
        cannot convert, a bad ``chunk_bytes`` / ``$KVNUMBA_CHUNK_BYTES``, an output named otherwise than
        ``.npy``, ``.npz`` or ``.safetensors``, an output that is the input, arrays the output's format
        cannot hold, or an unknown ``dtype`` or tensors it cannot quantise or dequantise (named).
    FileExistsError
        For an existing ``out_path`` without ``overwrite=True``.
    ModuleNotFoundError
        For a ``.safetensors`` file when the ``safetensors`` package is not installed (the message
        names the extra: ``pip install -e ".[safetensors]"``).
    OSError
        For a file that cannot be read or written, or a full disk (the ``.npy`` output's space is
        reserved before any data is written).
    Interrupted
        For SIGINT, SIGTERM or SIGHUP during the conversion (their default handlers are replaced
        meanwhile; see ``kvnumba.convert.signals``).

    Nothing is written on any error: the temporary output is removed, an existing output is kept.
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
        else:
            source = quantised.transformed(read, dtype, in_path)  # as it is, quantised or dequantised
        # every array's shape and dtype is checked before anything is written
        if dtype == "nvfp4":
            shapes = {item.name: item.shape for item in source.items}
        elif pooled:  # K and V paired by name with the pool (kvnumba.convert.pool_files)
            source, shapes, made_of = pool_files.outputs(source, kind, in_path, src, dst, page_size, head_groups)
        else:
            shapes = {item.name: _shape_in(item, kind, in_path, src, dst, page_size) for item in source.items}
        checked_for(out_kind, source, in_path, out_path)
        base = os.path.basename(in_path)

        def convert(item, out):
            label = base if kind == ".npy" else f"{base}[{item.name}]"
            if pooled:
                with (contextlib.nullcontext() if progress is None else progress(label, out.nbytes)) as bar:
                    pool_files.fill(item, out, made_of, src, dst, page_size,
                                    lambda a, b: copy_views(a, b, chunk_bytes, bar))
                return
            array = item.load()
            with (contextlib.nullcontext() if progress is None else progress(label, array.nbytes)) as bar:
                if dtype == "nvfp4":
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


__all__ = ["Interrupted", "chunks", "convert_array_into", "convert_file", "copy_views"]
