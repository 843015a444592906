"""The input of the file converter (``kvnumba.convert.files``), checked before anything is written: its kind
by suffix and content, every array's header against the bytes the file holds; then every array described
(``Source``: name, shape, dtype and a way to read it) before any is read."""
import contextlib
import math
import os
import zipfile
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from . import safetensors
from ..units import format_bytes


def _exact_size(nbytes):
    """Bytes to the byte (sizes compared in a message may differ by a few), and rounded when large."""
    return f"{nbytes:,} B" + (f" = {format_bytes(nbytes)}" if nbytes >= 1000 else "")


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


def checked_kind(in_path):
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
    """``(shape, dtype)`` from the .npy header at the start of ``f``, refused if it claims more data than
    ``nbytes`` (the file's size) holds, before anything is mapped or allocated for it."""
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


class Source(NamedTuple):
    """The input's arrays (``Item``s, in file order), and what the output may keep of the file."""

    items: list
    compressed: bool = False  # a .npz whose members are compressed: so is a .npz output
    metadata: dict | None = None  # a .safetensors file's __metadata__: kept by a .safetensors output
    pooled: bool = False  # the outputs of a conversion from or to a page-unified pool (kvnumba.convert.pool_files)


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
            def loader(info):
                def load():
                    with zin.open(info) as f:
                        return np.lib.format.read_array(f, allow_pickle=False)
                return load

            items = []
            for info in zin.infolist():  # every member a readable .npy array (np.savez writes nothing else)
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"{in_path}: member {info.filename!r} is not a .npy array; a .npz archive to "
                                     f"convert must hold arrays only")
                name = info.filename[:-len(".npy")]
                with zin.open(info) as f:
                    shape, dtype = _npy_header(f, f"{in_path}[{name}]", info.file_size)
                items.append(Item(name, shape, dtype, loader(info)))
            yield Source(items, any(info.compress_type != zipfile.ZIP_STORED for info in zin.infolist()))
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


SOURCES = {".npy": _npy_source, ".npz": _npz_source, safetensors.SUFFIX: _safetensors_source}


__all__ = ["SOURCES", "Item", "Source", "checked_kind"]
