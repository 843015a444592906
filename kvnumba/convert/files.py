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

Either way the output appears complete, by ``os.replace``, or not at all: on any error, and on
SIGINT, SIGTERM or SIGHUP, the temporary file is removed and an existing output is left as it was.
The input is checked before anything is written: its content must match its suffix, and every array
header must fit the bytes the file holds (every tensor's byte range, for a ``.safetensors`` file). The
``.npy`` output's disk space is reserved before it is mapped, so a full disk is an ``OSError`` rather
than a SIGBUS on a write into the map.
"""
import contextlib
import errno
import math
import os
import shutil
import signal
import threading
import uuid
import zipfile
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..checks import validate
from .. import config
from ..errors import Interrupted
from .shapes import canonical_view, converted_shape, layout, view_page_size
from . import safetensors
from ..units import format_bytes

def _exact_size(nbytes):
    """Bytes to the byte (sizes compared in a message may differ by a few), and rounded when large."""
    return f"{nbytes:,} B" + (f" = {format_bytes(nbytes)}" if nbytes >= 1000 else "")


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


def convert_array_into(array, out, src, dst, page_size, chunk_bytes, bar=None):
    """Fill ``out`` (layout ``dst``) from ``array`` (layout ``src``), chunk by chunk; both NumPy (or memmaps)."""
    p = view_page_size(src, dst, page_size)
    src_view, dst_view = canonical_view(array, src, p), canonical_view(out, dst, p)
    for layers, pages in chunks(src_view.shape, array.itemsize, chunk_bytes):
        block = np.ascontiguousarray(src_view[layers, pages])  # read one chunk of the input
        dst_view[layers, pages] = block
        if bar is not None:
            bar.advance(block.nbytes)


def _temporary(path):
    """A fresh name beside ``path`` (same file system, so ``os.replace`` is atomic); the file is created
    by its writer, with the usual permissions."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")


# --- Checking the input before anything is written ------------------------------------------------------

_MAGIC = {".npy": b"\x93NUMPY", ".npz": b"PK\x03\x04"}
_EMPTY_ZIP = b"PK\x05\x06"  # a zip with no members starts with its end record (np.savez() of nothing)
_KINDS = {".npy": "a .npy file", ".npz": "a .npz (zip) archive", safetensors.SUFFIX: "a .safetensors file"}


def _kind_by_content(head):
    """``.npy``, ``.npz`` or ``.safetensors`` from a file's first bytes, or None for none of them."""
    if head.startswith(_MAGIC[".npy"]):
        return ".npy"
    if head.startswith(_MAGIC[".npz"]) or head.startswith(_EMPTY_ZIP):
        return ".npz"
    if safetensors.looks_like_safetensors(head):
        return safetensors.SUFFIX
    return None


def _checked_kind(in_path):
    """The input's kind, from its suffix, once its first bytes confirm it; ``ValueError`` otherwise."""
    suffix = os.path.splitext(in_path)[1].lower()
    if suffix not in _KINDS:
        raise ValueError(f"input must be a .npy file, a .npz archive or a .safetensors file, got {in_path!r}")
    with open(in_path, "rb") as f:
        head = f.read(16)
    if not head:
        raise ValueError(f"{in_path}: the file is empty (0 bytes), not a {suffix} file")
    kind = _kind_by_content(head)
    if kind is None:
        if suffix == safetensors.SUFFIX:
            expected = "an 8-byte header size and then '{'"
        else:
            head, expected = head[:len(_MAGIC[suffix])], repr(_MAGIC[suffix])
        raise ValueError(f"{in_path}: not a {suffix} file: it starts with {head!r}, expected {expected}")
    if kind != suffix:
        raise ValueError(f"{in_path}: named {suffix} but its content is {_KINDS[kind]}; rename it to {kind}")
    if kind == safetensors.SUFFIX:
        safetensors.library()  # not installed: say so before anything else
    return kind


def _npy_header(f, name, nbytes):
    """``(shape, dtype)`` from the .npy header at the start of ``f``, checked against ``nbytes``, the
    file's size: a header that claims more data than the file holds is refused here, before anything
    is mapped or allocated for it."""
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
        # A 3.0 header differs from 2.0 only in encoding field names as UTF-8, which shape and size ignore.
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(f)
    except ValueError as err:
        raise ValueError(f"{name}: not a readable .npy array: {err}") from None
    if dtype.hasobject:
        raise ValueError(f"{name}: object arrays cannot be converted (dtype {dtype})")
    claimed, held = math.prod(shape) * dtype.itemsize, nbytes - f.tell()
    if claimed > held:
        raise ValueError(f"{name}: truncated or corrupt: its header claims shape {shape} of {dtype} "
                         f"({_exact_size(claimed)}), but the file holds {_exact_size(max(held, 0))} after the header")
    return shape, dtype


def _npz_members(zin, in_path):
    """Every member of the archive as ``(name, ZipInfo, shape, dtype)``; ``ValueError`` for one that is not
    a readable .npy array (np.savez writes nothing else)."""
    members = []
    for info in zin.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"{in_path}: member {info.filename!r} is not a .npy array; a .npz archive to "
                             f"convert must hold arrays only")
        name = info.filename[:-len(".npy")]
        with zin.open(info) as f:
            shape, dtype = _npy_header(f, f"{in_path}[{name}]", info.file_size)
        members.append((name, info, shape, dtype))
    return members


def _checked_output(in_path, out_path, overwrite):
    """The output's kind (``.npy``, ``.npz`` or ``.safetensors``, from its suffix), once ``out_path`` can be
    written: ``ValueError`` for another suffix, a folder, a folder that does not exist, or the input itself
    (through links too); ``FileExistsError`` for an existing file unless ``overwrite``."""
    suffix = os.path.splitext(out_path)[1].lower()
    if suffix not in _KINDS:
        raise ValueError(f"output must be named .npy, .npz or .safetensors (the format it is written in), "
                         f"got {out_path!r}")
    folder = os.path.dirname(os.path.abspath(out_path))
    if os.path.isdir(out_path):
        raise ValueError(f"output {out_path!r} is a folder, expected a file name")
    if not os.path.isdir(folder):
        raise ValueError(f"output {out_path!r}: folder {folder!r} does not exist")
    if os.path.lexists(out_path):
        if os.path.exists(out_path) and os.path.samefile(in_path, out_path):
            how = "" if os.path.abspath(in_path) == os.path.abspath(out_path) else " (through a link)"
            raise ValueError(f"output {out_path!r} is the input file{how}: write the conversion to another file")
        if not overwrite:
            raise FileExistsError(errno.EEXIST, f"output {out_path!r} exists: pass overwrite=True to replace it",
                                  out_path)
    return suffix


# --- Writing ----------------------------------------------------------------------------------------------

_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}  # the file system cannot reserve: write instead
_OUT_OF_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _reserve_disk_space(path, offset, chunk_bytes):
    """Allocate every block of ``path`` from ``offset`` to its end now. The file is created sparse, and a
    write into the memory map of a sparse file on a full disk is a SIGBUS that kills the process; once
    its blocks are allocated, running out of space is an OSError (ENOSPC) here instead."""
    size = os.path.getsize(path)
    if size <= offset:  # an empty array: nothing to reserve
        return
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), offset, size - offset)
            return
        except AttributeError:  # no posix_fallocate on this platform
            pass
        except OSError as err:
            if err.errno not in _NO_FALLOCATE:
                raise
        f.seek(offset)  # the data is all zeros so far: writing zeros allocates it and changes nothing
        block = memoryview(bytes(max(1, min(chunk_bytes, 1 << 24))))
        for start in range(offset, size, len(block)):
            f.write(block[:size - start])
        f.flush()


def _create_npy(path, dtype, shape, chunk_bytes):
    """An all-zero ``.npy`` file at ``path``, its disk space reserved, memory-mapped for writing."""
    blank = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)  # nothing is written into it
    offset = blank.offset
    del blank
    _reserve_disk_space(path, offset, chunk_bytes)
    return np.lib.format.open_memmap(path, mode="r+")


def _explained(err, out_path, tmp, needed=None):
    """A clearer OSError for ``err`` (raised while writing ``tmp``) that names ``out_path``, never the
    temporary file: with the space needed and free when the disk is full; None when ``err`` says it well
    enough."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if err.errno in _OUT_OF_SPACE:
        try:
            free = f", {format_bytes(shutil.disk_usage(folder).free)} free"
        except OSError:
            free = ""
        need = "" if needed is None else f": it needs {format_bytes(needed)}"
        return OSError(err.errno, f"not enough disk space to write {out_path}{need} (in {folder}{free})")
    if err.filename == tmp:
        if err.errno in (errno.EACCES, errno.EPERM):
            return OSError(err.errno, f"cannot write {out_path}: no permission to create a file in {folder}")
        if err.errno == errno.EROFS:
            return OSError(err.errno, f"cannot write {out_path}: {folder} is on a read-only file system")
        return OSError(err.errno, f"cannot write {out_path}: {err.strerror}")
    return None


@contextlib.contextmanager
def _removed_on_failure(tmp, out_path, needed=None):
    """Remove ``tmp`` if the block fails in any way, or is interrupted; OSErrors reworded to name ``out_path``.
    The block's error is the one raised: a clean-up that fails too does not replace it."""
    try:
        yield
    except OSError as err:
        _remove(tmp)
        clearer = _explained(err, out_path, tmp, needed)
        if clearer is None:
            raise
        raise clearer from err
    except BaseException:
        _remove(tmp)
        raise


# --- Reading: every array of the input, described before any is read ----------------------------------

class Source(NamedTuple):
    """The input's arrays (``Item``s, in file order), and what the output may keep of the file."""

    items: list
    compressed: bool = False  # a .npz whose members are compressed: so is a .npz output
    metadata: dict | None = None  # a .safetensors file's __metadata__: kept by a .safetensors output


class Item(NamedTuple):
    """One array of the input: its name (a .npy file's is its file name's stem), shape, dtype and a way to
    read it (a memory map where the format allows)."""

    name: str
    shape: tuple
    dtype: np.dtype
    load: Callable


@contextlib.contextmanager
def _npy_source(in_path):
    with open(in_path, "rb") as f:
        shape, dtype = _npy_header(f, in_path, os.fstat(f.fileno()).st_size)
    name = os.path.splitext(os.path.basename(in_path))[0]
    yield Source([Item(name, shape, dtype, lambda: np.load(in_path, mmap_mode="r", allow_pickle=False))])


@contextlib.contextmanager
def _npz_source(in_path):
    try:
        with zipfile.ZipFile(in_path) as zin:
            members = _npz_members(zin, in_path)
            compressed = any(info.compress_type != zipfile.ZIP_STORED for info in zin.infolist())

            def loader(info):
                def load():
                    with zin.open(info) as f:
                        return np.lib.format.read_array(f, allow_pickle=False)
                return load

            yield Source([Item(name, shape, dtype, loader(info)) for name, info, shape, dtype in members], compressed)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # a damaged archive (the output is removed by now)
        raise ValueError(f"{in_path}: not a readable .npz (zip) archive: {err}") from None


@contextlib.contextmanager
def _safetensors_source(in_path):
    header = safetensors.read_header(in_path)
    dtypes = {t.name: safetensors.numpy_dtype(t.dtype) for t in header.tensors}
    with safetensors.open_reader(in_path) as reader:
        def loader(tensor):
            return lambda: safetensors.read_tensor(reader, in_path, header, tensor)

        yield Source([Item(t.name, t.shape, dtypes[t.name], loader(t)) for t in header.tensors],
                     metadata=header.metadata)


_SOURCES = {".npy": _npy_source, ".npz": _npz_source, safetensors.SUFFIX: _safetensors_source}


# --- Writing: the output's format, from its name ---------------------------------------------------------

def _checked_for(kind, source, in_path, out_path):
    """``ValueError`` if the output format ``kind`` cannot hold the source's arrays: several for a .npy file,
    or a dtype the format has no name for (bfloat16 and float8 in .npy/.npz, NumPy-only ones in .safetensors)."""
    if kind == ".npy" and len(source.items) != 1:
        names = ", ".join(item.name for item in source.items[:4]) + (", ..." if len(source.items) > 4 else "")
        raise ValueError(f"output {out_path!r} is a .npy file, which holds one array, but {in_path} holds "
                         f"{len(source.items)}" + (f" ({names})" if names else "") + ": name the output .npz or "
                         ".safetensors")
    for item in source.items:
        where = f"{in_path}[{item.name}]" if kind != ".npy" or len(source.items) > 1 else in_path
        if kind == safetensors.SUFFIX:
            if safetensors.code_for(item.dtype) is None:
                raise ValueError(f"{where}: dtype {item.dtype} cannot be written to a .safetensors file (it holds "
                                 f"{', '.join(safetensors.DTYPES)}): name the output .npy or .npz")
        elif item.dtype.kind == "V" and item.dtype.names is None:  # ml_dtypes' bfloat16 and float8
            raise ValueError(f"{where}: {item.dtype} cannot be stored in a {kind} file (NumPy has no {item.dtype} "
                             "dtype; it would come back as raw bytes): name the output .safetensors")


def _write_npy(tmp, out_path, source, shapes, convert, chunk_bytes):
    [item] = source.items
    out = _create_npy(tmp, item.dtype, shapes[item.name], chunk_bytes)
    convert(item, out)
    out.flush()
    del out


def _write_npz(tmp, out_path, source, shapes, convert, chunk_bytes):
    mode = zipfile.ZIP_DEFLATED if source.compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(tmp, "w", compression=mode, allowZip64=True) as zout:
        for item in source.items:
            out = np.empty(shapes[item.name], dtype=item.dtype)
            convert(item, out)
            with zout.open(f"{item.name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, out, allow_pickle=False)
            del out


def _write_safetensors(tmp, out_path, source, shapes, convert, chunk_bytes):
    converted = {}  # the library writes the whole file at once: every output is held until then
    for item in source.items:
        out = converted[item.name] = np.empty(shapes[item.name], dtype=item.dtype)
        convert(item, out)
    safetensors.write(tmp, converted, source.metadata, name=out_path)
    os.chmod(tmp, _file_mode())  # the library creates its file private (0600); the others get the usual mode


_WRITERS = {".npy": _write_npy, ".npz": _write_npz, safetensors.SUFFIX: _write_safetensors}


def _file_mode():
    """The mode a new file gets here (0666 less the umask), as ``open`` gives the .npy and .npz outputs."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _remove(path):
    """Remove a temporary file, if it is there; a failure is not raised (the error that led here is the one
    to report; a temporary file left behind is named ``.<output>.<random>.tmp``)."""
    try:
        os.remove(path)
    except OSError:
        pass


# --- Signals -------------------------------------------------------------------------------------------

_CLEANUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_on_signals():
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``, so that the converters'
    ``except`` clauses remove their temporary file (by default SIGTERM and SIGHUP end the process at
    once, leaving it behind). Only default handlers are replaced, and only on the main thread (the only
    one that may set them): an ignored signal or someone's own handler is left alone. The previous
    handlers are restored afterwards."""
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


def convert_file(in_path, out_path, src, dst, page_size=None, *, chunk_bytes=None, progress=None,
                 overwrite=False):
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
        ``.npy``, ``.npz`` or ``.safetensors``, an output that is the input, or arrays the output's format
        cannot hold.
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
        meanwhile; see ``interrupt_on_signals``).

    Nothing is written on any error: the temporary output is removed, an existing output is kept.
    """
    src, dst = layout(src, "src"), layout(dst, "dst")
    in_path, out_path = os.fspath(in_path), os.fspath(out_path)
    if page_size is not None:  # checked even where the layouts do not use it: 0 is a mistake, not "none"
        page_size = validate.integer("page_size", page_size, minimum=1)
    chunk_bytes = config.chunk_bytes() if chunk_bytes is None else int(chunk_bytes)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    kind = _checked_kind(in_path)
    out_kind = _checked_output(in_path, out_path, overwrite)
    with interrupt_on_signals(), _SOURCES[kind](in_path) as source:
        # every array's shape and dtype is checked before anything is written
        shapes = {item.name: converted_shape(item.shape, src, dst, page_size) for item in source.items}
        _checked_for(out_kind, source, in_path, out_path)
        base = os.path.basename(in_path)

        def convert(item, out):
            array = item.load()
            label = base if kind == ".npy" else f"{base}[{item.name}]"
            with (contextlib.nullcontext() if progress is None else progress(label, array.nbytes)) as bar:
                convert_array_into(array, out, src, dst, page_size, chunk_bytes, bar)

        needed = sum(math.prod(item.shape) * item.dtype.itemsize for item in source.items)
        tmp = _temporary(out_path)
        with _removed_on_failure(tmp, out_path, needed=needed if out_kind == ".npy" else None):
            _WRITERS[out_kind](tmp, out_path, source, shapes, convert, chunk_bytes)
            os.replace(tmp, out_path)
    if out_kind == ".npy":
        return {"": next(iter(shapes.values()))}
    return shapes


__all__ = ["Interrupted", "convert_file", "interrupt_on_signals"]
