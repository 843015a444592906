"""``kvnumba convert``: convert ``.npy`` files and ``.npz`` archives between cache layouts, in chunks.

- ``.npy``: the input is memory-mapped (``np.load(mmap_mode="r")``), the output is a memory-mapped
  ``.npy`` (``np.lib.format.open_memmap``) under a temporary name in the output's folder, filled chunk
  by chunk (blocks of pages, and of layers when one page of every layer is larger than a chunk);
  besides the mapped files, at most about one chunk is held in memory at once.
- ``.npz``: every array of the archive is converted (the same chunks); a member of a zip archive
  cannot be memory-mapped, so one input array and its output are in memory at a time. The new
  archive is written under a temporary name too, compressed if the input was.

Either way the output appears complete, by ``os.replace``, or not at all: on any error the
temporary file is removed and an existing output is left as it was.
"""
import math
import os
import sys
import time
import uuid
import zipfile

import numpy as np

from ..config import env_int
from ..convert import CacheLayout, _view_page_size, canonical_view, converted_shape, layout

DEFAULT_CHUNK_BYTES = 64 << 20
CHUNK_ENV = "KVNUMBA_CHUNK_BYTES"


def default_chunk_bytes():
    """``$KVNUMBA_CHUNK_BYTES`` if set (for tests and small machines), else 64 MiB; ``ValueError`` naming
    the variable if it is not an integer >= 1."""
    return env_int(CHUNK_ENV, DEFAULT_CHUNK_BYTES, minimum=1)


def _size(nbytes):
    if nbytes < 1000:
        return f"{nbytes} B"
    for unit in ("KB", "MB", "GB", "TB"):
        nbytes /= 1000
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.1f} {unit}"


class Progress:
    """A plain-text progress bar on a stream (stderr), redrawn at most ten times a second."""

    def __init__(self, label, total, stream=sys.stderr, width=30):
        self.label, self.total, self.stream, self.width = label, max(total, 1), stream, width
        self.done, self._drawn = 0, 0.0

    def advance(self, nbytes):
        self.done += nbytes
        now = time.monotonic()
        if self.stream is not None and (now - self._drawn >= 0.1 or self.done >= self.total):
            self._drawn = now
            filled = self.width * self.done // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                              f"{100 * self.done // self.total:3d}% {_size(self.done)} / {_size(self.total)}")
            self.stream.flush()

    def close(self):
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def chunks(shape, itemsize, chunk_bytes):
    """Slices ``(layers, pages)`` of the canonical index space ``(L, pages, P, *item)``, each at most
    about ``chunk_bytes`` (never less than one page of one layer)."""
    layers, pages = shape[0], shape[1]
    page_bytes = math.prod(shape[2:]) * itemsize  # one page of one layer
    column = layers * page_bytes  # one page of every layer
    if column <= chunk_bytes:
        layer_step, page_step = layers, max(1, chunk_bytes // max(column, 1))
    else:
        layer_step, page_step = max(1, chunk_bytes // max(page_bytes, 1)), 1
    for p0 in range(0, pages, page_step):
        for l0 in range(0, layers, layer_step):
            yield slice(l0, min(l0 + layer_step, layers)), slice(p0, min(p0 + page_step, pages))


def convert_array_into(array, out, src, dst, page_size, chunk_bytes, progress=None):
    """Fill ``out`` (layout ``dst``) from ``array`` (layout ``src``), chunk by chunk; both NumPy (or memmaps)."""
    p = _view_page_size(src, dst, page_size)
    src_view, dst_view = canonical_view(array, src, p), canonical_view(out, dst, p)
    for layers, pages in chunks(src_view.shape, array.itemsize, chunk_bytes):
        block = np.ascontiguousarray(src_view[layers, pages])  # read one chunk of the input
        dst_view[layers, pages] = block
        if progress is not None:
            progress.advance(block.nbytes)


def _temporary(path):
    """A fresh name beside ``path`` (same file system, so ``os.replace`` is atomic); the file is created
    by its writer, with the usual permissions."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")


def _checked_input(array, name):
    if array.dtype.hasobject:
        raise ValueError(f"{name}: object arrays cannot be converted (dtype {array.dtype})")
    return array


def _convert_npy(in_path, out_path, src, dst, page_size, chunk_bytes, progress_stream):
    array = _checked_input(np.load(in_path, mmap_mode="r", allow_pickle=False), in_path)
    out_shape = converted_shape(array.shape, src, dst, page_size)  # raises before any file is made
    tmp = _temporary(out_path)
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=array.dtype, shape=out_shape)
        progress = Progress(os.path.basename(in_path), array.nbytes, progress_stream)
        convert_array_into(array, out, src, dst, page_size, chunk_bytes, progress)
        progress.close()
        out.flush()
        del out
        os.replace(tmp, out_path)
    except BaseException:
        _remove(tmp)
        raise
    return {"": out_shape}


def _convert_npz(in_path, out_path, src, dst, page_size, chunk_bytes, progress_stream):
    shapes = {}
    with np.load(in_path, allow_pickle=False) as archive, zipfile.ZipFile(in_path) as zin:
        compressed = any(info.compress_type != zipfile.ZIP_STORED for info in zin.infolist())
        names = list(archive.files)
        for name in names:  # check every member's shape before writing anything
            header = _npz_member_shape(zin, name)
            if header is not None:
                shapes[name] = converted_shape(header, src, dst, page_size)
        tmp = _temporary(out_path)
        try:
            mode = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
            with zipfile.ZipFile(tmp, "w", compression=mode, allowZip64=True) as zout:
                for name in names:
                    array = _checked_input(archive[name], f"{in_path}[{name}]")
                    shapes[name] = converted_shape(array.shape, src, dst, page_size)
                    out = np.empty(shapes[name], dtype=array.dtype)
                    progress = Progress(f"{os.path.basename(in_path)}[{name}]", array.nbytes, progress_stream)
                    convert_array_into(array, out, src, dst, page_size, chunk_bytes, progress)
                    progress.close()
                    del array
                    with zout.open(f"{name}.npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, out, allow_pickle=False)
                    del out
            os.replace(tmp, out_path)
        except BaseException:
            _remove(tmp)
            raise
    return shapes


def _npz_member_shape(zin, name):
    """The shape in a member's .npy header, read without loading the data (None if unreadable)."""
    try:
        with zin.open(f"{name}.npy") as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            return None if read is None else read(f)[0]
    except Exception:  # noqa: BLE001 - the full load below reports real problems
        return None


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def convert_file(in_path, out_path, src, dst, page_size=None, *, chunk_bytes=None, progress=sys.stderr):
    """Convert a ``.npy`` file or every array of a ``.npz`` archive from layout ``src`` to ``dst``.

    Parameters
    ----------
    in_path, out_path : str or os.PathLike
        Input and output files; the kind (``.npy`` or ``.npz``) is read from the input's suffix, and
        the output is written to ``out_path`` exactly as named.
    src, dst : str or CacheLayout
        Layout names, as in ``kvnumba.convert``.
    page_size : int, optional
        Required when either layout pages tokens.
    chunk_bytes : int, optional
        Bytes per chunk (default ``$KVNUMBA_CHUNK_BYTES``, else 64 MiB).
    progress : text stream or None
        Where to draw the progress bar (stderr by default; None for none).

    Returns
    -------
    dict
        Output shape per array name (``""`` for a ``.npy`` file).

    Raises
    ------
    ValueError
        For an unknown layout, a shape that does not fit, or an input that is neither ``.npy`` nor
        ``.npz``. Nothing is written then, nor on any other error.
    """
    src, dst = layout(src, "--from"), layout(dst, "--to")
    in_path, out_path = os.fspath(in_path), os.fspath(out_path)
    chunk_bytes = default_chunk_bytes() if chunk_bytes is None else int(chunk_bytes)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    suffix = os.path.splitext(in_path)[1].lower()
    if suffix == ".npy":
        return _convert_npy(in_path, out_path, src, dst, page_size, chunk_bytes, progress)
    if suffix == ".npz":
        return _convert_npz(in_path, out_path, src, dst, page_size, chunk_bytes, progress)
    raise ValueError(f"input must be a .npy file or a .npz archive, got {in_path!r}")


__all__ = ["CacheLayout", "convert_file", "default_chunk_bytes"]
