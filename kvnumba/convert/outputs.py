"""The output of the file converter (``kvnumba.convert.files``): its format from its name, checked against
what the input holds; written under a temporary name beside it (a ``.npy`` output's disk space reserved
first), which is removed on any failure, with an ``OSError`` that names the output."""
import contextlib
import errno
import os
import shutil
import uuid
import zipfile

import numpy as np

from . import safetensors
from ..units import format_bytes


def temporary(path):
    """A fresh name beside ``path`` (same file system, so ``os.replace`` is atomic)."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")


def checked_output(in_path, out_path, overwrite):
    """The output's kind (its suffix), once ``out_path`` can be written: ``ValueError`` for another suffix, a
    folder, a missing folder or the input itself (links too); ``FileExistsError`` unless ``overwrite``."""
    suffix = os.path.splitext(out_path)[1].lower()
    if suffix not in WRITERS:
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
    """An OSError for ``err`` (raised while writing ``tmp``) that names ``out_path``, never the temporary
    file, with the space needed and free when the disk is full; None when ``err`` says it well enough."""
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
def removed_on_failure(tmp, out_path, needed=None):
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


def checked_for(kind, source, in_path, out_path):
    """``ValueError`` if the output format ``kind`` cannot hold the source's arrays: several for a .npy file,
    or a dtype the format has no name for (bfloat16 and float8 in .npy/.npz, NumPy-only ones in .safetensors)."""
    if kind == ".npy" and len(source.items) != 1:
        names = ", ".join(item.name for item in source.items[:4]) + (", ..." if len(source.items) > 4 else "")
        raise ValueError(f"output {out_path!r} is a .npy file, which holds one array, but {in_path} "
                         f"{'converts into' if source.pooled else 'holds'} {len(source.items)}"
                         + (f" ({names})" if names else "") + ": name the output .npz or .safetensors")
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
    umask = os.umask(0)  # the umask is read by setting it: put it back at once
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # the library creates its file private (0600); the others get the usual mode


WRITERS = {".npy": _write_npy, ".npz": _write_npz, safetensors.SUFFIX: _write_safetensors}


def _remove(path):
    """Remove a temporary file if it is there, without raising: the error that led here is the one to report."""
    try:
        os.remove(path)
    except OSError:
        pass


__all__ = ["WRITERS", "checked_for", "checked_output", "removed_on_failure", "temporary"]
