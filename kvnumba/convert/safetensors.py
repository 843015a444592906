"""``.safetensors`` files for the file converter (``kvnumba.convert.files``), through the optional
``safetensors`` package (``pip install -e ".[safetensors]"``).

The header is read and checked here first, so that a damaged or truncated file gets a message saying what
is wrong; the library then reads the tensors NumPy has dtypes for (``safe_open(framework="np")``) and writes
the output (``serialize_file``). bfloat16 and float8 tensors, which NumPy lacks (and the library's NumPy
reader refuses), are memory-mapped at the header's offsets as ``ml_dtypes`` arrays and written back under
their own dtype: a layout conversion moves whole elements, so they convert byte for byte.
"""
import importlib
import json
import math
import os
import re
import struct
from typing import NamedTuple

import numpy as np

SUFFIX = ".safetensors"
INSTALL_HINT = 'pip install -e ".[safetensors]" (from kvnumba\'s checkout)'
HEADER_LIMIT = 100_000_000  # the library refuses larger headers (safetensors' MAX_HEADER_SIZE)
DEPTH_LIMIT = 64  # arrays and objects nested deeper are refused (a header needs 3; Python's parser recurses)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")

# dtype code in the header -> (NumPy dtype that holds it, the name the library's writer takes)
NUMPY_DTYPES = {
    "F64": ("<f8", "float64"), "F32": ("<f4", "float32"), "F16": ("<f2", "float16"),
    "I64": ("<i8", "int64"), "U64": ("<u8", "uint64"), "I32": ("<i4", "int32"), "U32": ("<u4", "uint32"),
    "I16": ("<i2", "int16"), "U16": ("<u2", "uint16"), "I8": ("i1", "int8"), "U8": ("u1", "uint8"),
    "BOOL": ("?", "bool"), "C64": ("<c8", "complex64"),
}
ML_DTYPES = {  # no NumPy dtype: (an unsigned integer of its width, its ml_dtypes name = the library's writer name)
    "BF16": ("<u2", "bfloat16"), "F8_E4M3": ("u1", "float8_e4m3fn"), "F8_E5M2": ("u1", "float8_e5m2"),
    "F8_E4M3FNUZ": ("u1", "float8_e4m3fnuz"), "F8_E5M2FNUZ": ("u1", "float8_e5m2fnuz"),
    "F8_E8M0": ("u1", "float8_e8m0fnu"),
}
DTYPES = {**NUMPY_DTYPES, **ML_DTYPES}
ML_DTYPES_HINT = 'pip install -e ".[safetensors]" (from kvnumba\'s checkout; it brings ml_dtypes)'


class Tensor(NamedTuple):
    """One tensor's header entry; ``begin``/``end`` are byte offsets into the data (after the header)."""

    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int


class Header(NamedTuple):
    data_start: int  # file offset of the data: 8 + the header's size
    tensors: list  # Tensor, in the order of their data
    metadata: dict  # the __metadata__ strings (empty if none)


def _optional(name, needed_by, hint):
    """The optional module ``name``; ``ModuleNotFoundError`` saying what needs it and which extra to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ModuleNotFoundError(f"{needed_by} need the {name} package: {hint}", name=name) from None


def library():
    """The ``safetensors`` module; ``ModuleNotFoundError`` saying which extra to install."""
    return _optional("safetensors", ".safetensors files", INSTALL_HINT)


def ml_dtypes():
    """The ``ml_dtypes`` module (bfloat16, float8); ``ModuleNotFoundError`` saying which extra to install."""
    return _optional("ml_dtypes", "bf16 and fp8 tensors", ML_DTYPES_HINT)


def numpy_dtype(code):
    """The NumPy dtype of safetensors dtype ``code`` (an ``ml_dtypes`` one for bf16 and fp8)."""
    if code in NUMPY_DTYPES:
        return np.dtype(NUMPY_DTYPES[code][0])
    return np.dtype(getattr(ml_dtypes(), ML_DTYPES[code][1]))


def code_for(dtype):
    """The safetensors dtype code of NumPy ``dtype`` (``ml_dtypes``' included), or None if the format has none."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">":  # written little-endian (``write`` swaps the bytes)
        dtype = dtype.newbyteorder("<")
    for code, (holder, _) in NUMPY_DTYPES.items():
        if dtype == np.dtype(holder):
            return code
    for code, (_, name) in ML_DTYPES.items():
        if dtype.name == name:
            return code
    return None


def looks_like_safetensors(head):
    """True if ``head`` (a file's first 9 bytes or more) starts as a safetensors file: a header size, then '{'."""
    return len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] >= 2


def read_header(path):
    """The checked header of the file at ``path`` (which starts with a header size and '{', see
    ``looks_like_safetensors``); ``ValueError`` saying what is wrong with it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > HEADER_LIMIT:
            raise ValueError(f"{path}: not a readable .safetensors file: its header size says {length:,} B, "
                             f"more than the {HEADER_LIMIT:,} B safetensors allows")
        if length > size - 8:
            raise ValueError(f"{path}: truncated or corrupt: its header size says {length:,} B, but the file holds "
                             f"{size - 8:,} B after the header size")
        text = f.read(length)
    depth = nesting(text)
    if depth > DEPTH_LIMIT:
        raise ValueError(f"{path}: not a readable .safetensors file: its header nests arrays and objects {depth:,} "
                         f"levels deep (a header needs 3; kvnumba reads at most {DEPTH_LIMIT})")
    try:
        header = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path}: not a readable .safetensors file: its header nests arrays and objects too deeply "
                         "to parse") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable .safetensors file: its header is not JSON ({err})") from None
    metadata = header.pop("__metadata__", None) or {}
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ValueError(f"{path}: not a readable .safetensors file: its __metadata__ is not a map of strings")
    data_bytes = size - 8 - length
    tensors = sorted((_tensor(path, name, entry, data_bytes) for name, entry in header.items()),
                     key=lambda t: (t.begin, t.end))
    return Header(8 + length, tensors, metadata)


def nesting(text):
    """How deep the arrays and objects of JSON ``text`` (bytes) nest, without parsing it: brackets
    outside strings, counted with NumPy (no recursion, whatever the depth)."""
    brackets = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _tensor(path, name, entry, data_bytes):
    where = f"{path}[{name}]"
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        readable = isinstance(dtype, str) and all(type(n) is int and n >= 0 for n in (*shape, begin, end))
    except (TypeError, KeyError, ValueError):
        readable = False
    if not readable:
        raise ValueError(f"{where}: not a readable .safetensors entry: {json.dumps(entry)[:200]}")
    if dtype not in DTYPES:
        raise ValueError(f"{where}: dtype {dtype} cannot be converted: kvnumba converts "
                         f"{', '.join(DTYPES)} (whole bytes per element)")
    nbytes = math.prod(shape) * np.dtype(DTYPES[dtype][0]).itemsize
    if end - begin != nbytes:
        raise ValueError(f"{where}: corrupt: shape {list(shape)} of {dtype} is {nbytes:,} B, but its data_offsets "
                         f"[{begin}, {end}] span {end - begin:,} B")
    if end > data_bytes:
        raise ValueError(f"{where}: truncated or corrupt: its data ends at byte {end:,} of the data, but the file "
                         f"holds {data_bytes:,} B of data after the header")
    return Tensor(name, dtype, shape, begin, end)


def open_reader(path):
    """``safe_open(path, framework="np")``, checked by the library too; ``ValueError`` if it refuses the file."""
    st = library()
    try:
        return st.safe_open(os.fspath(path), framework="np")
    except st.SafetensorError as err:
        raise ValueError(f"{path}: not a readable .safetensors file: {err}") from None


def read_tensor(reader, path, header, tensor):
    """One tensor as a NumPy array: through the library when NumPy has its dtype, else memory-mapped
    (read-only) as an ``ml_dtypes`` array (bfloat16, float8)."""
    if tensor.dtype in NUMPY_DTYPES:
        return reader.get_tensor(tensor.name)
    dtype = numpy_dtype(tensor.dtype)
    if tensor.end == tensor.begin:  # nothing to map
        return np.empty(tensor.shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=header.data_start + tensor.begin, shape=tensor.shape)


def write(path, tensors, metadata, name=None):
    """Write ``{name: array}`` to ``path`` with the library (each under its dtype's code, ``code_for``), with
    ``metadata`` (a dict of strings, or None). An I/O failure is an ``OSError`` (so that a full disk is
    reported as one); other failures a ``ValueError`` naming ``name`` (the file the user asked for; default
    ``path``)."""
    st = library()
    arrays = {name: np.ascontiguousarray(array, array.dtype.newbyteorder("<") if array.dtype.byteorder == ">"
                                         else None)
              for name, array in tensors.items()}  # kept alive during the write
    names = {name: DTYPES[code_for(a.dtype)][1] for name, a in arrays.items()}
    spec = getattr(st, "TensorSpec", None)
    if spec is not None:  # safetensors >= 0.8: the writer reads the arrays' memory directly
        flat = {name: spec(dtype=names[name], shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
                for name, a in arrays.items()}
    else:  # safetensors < 0.8 takes each tensor's bytes
        flat = {name: {"dtype": names[name], "shape": list(a.shape), "data": a.tobytes()} for name, a in arrays.items()}
    try:
        st.serialize_file(flat, os.fspath(path), metadata=metadata or None)
    except st.SafetensorError as err:
        code = re.search(r"os error (\d+)", str(err))
        if code:
            errno = int(code.group(1))
            raise OSError(errno, os.strerror(errno), os.fspath(path)) from err
        raise ValueError(f"safetensors cannot write {name or path}: {err}") from err
