"""The bytes ``Agent.export`` returns and ``Agent.connect`` reads.

    magic (16 B) | format version (u16) | header length (u32) | header (JSON, UTF-8)
    | blob count (u16) | per blob: length (u32) + NIXL metadata | SHA-256 of everything before (32 B)

The blobs are NIXL's metadata for the view's memory and, last, for the token slab (with the exporter's
connection information); ``kvnumba.remote.header`` checks the header's fields. The checksum catches damage
in transit, not a forgery: that is the token's job (``token_of``, read back before every copy).
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, NamedTuple

from ..errors import ExportError

MAGIC = b"kvnumba-export\x00\x01"
VERSION = 2  # 2: writable, token digests of the header, the connection information in the token blob
_DIGEST = 32


class Decoded(NamedTuple):
    """An export's parts: the header as read (``header``) and as its exact bytes (``text``), and the blobs."""

    header: Any
    text: bytes
    blobs: list[bytes]


def header_text(header: dict[str, Any]) -> bytes:
    """The header's bytes in an export (canonical JSON)."""
    return json.dumps(header, separators=(",", ":"), sort_keys=True).encode()


def token_of(text: bytes) -> int:
    """The 8-byte token an exporter writes for the header ``text`` (a digest of it; never 0, which
    marks a slot no export holds)."""
    value = int.from_bytes(hashlib.sha256(b"kvnumba export token\x00" + text).digest()[:8], "little")
    return value or 1


def encode(text: bytes, blobs: list[bytes]) -> bytes:
    body = [MAGIC, struct.pack("<HI", VERSION, len(text)), text, struct.pack("<H", len(blobs))]
    for blob in blobs:
        body += [struct.pack("<I", len(blob)), bytes(blob)]
    data = b"".join(body)
    return data + hashlib.sha256(data).digest()


def decode(exported: Any, name: str = "exported") -> Decoded:
    """An export's parts; ``TypeError`` / ``ExportError`` naming ``name`` (and the part) otherwise. Only the
    framing is checked here: the header's fields are ``kvnumba.remote.header``'s."""
    if isinstance(exported, (bytearray, memoryview)):
        exported = bytes(exported)
    if not isinstance(exported, bytes):
        raise TypeError(f"{name} must be the bytes Agent.export returned, got {type(exported).__name__}")
    if not exported.startswith(MAGIC):
        raise ExportError(f"{name} is not a kvnumba export: it does not start with kvnumba's marker "
                          f"({len(exported)} bytes starting {exported[:16]!r})")
    data, digest = exported[:-_DIGEST], exported[-_DIGEST:]
    if len(exported) < len(MAGIC) + 6 + _DIGEST or hashlib.sha256(data).digest() != digest:
        raise ExportError(f"{name} is damaged: its checksum does not match ({len(exported)} bytes; cut short or "
                          "altered on the way?)")
    reader = _Reader(data, len(MAGIC), name)
    version, length = reader.unpack("<HI", "the format version and header length")
    if version != VERSION:
        raise ExportError(f"{name} is export format version {version}; this kvnumba reads version {VERSION}: use "
                          "the same kvnumba version on both sides")
    text = reader.take(length, "the header")
    try:
        header = json.loads(text)
    except ValueError as error:
        raise ExportError(f"{name} has an unreadable header (not JSON: {error})") from None
    (count,) = reader.unpack("<H", "the blob count")
    blobs = []
    for i in range(count):
        (size,) = reader.unpack("<I", f"blob {i}'s length (of {count} blobs)")
        blobs.append(reader.take(size, f"blob {i} ({size} bytes, of {count} blobs)"))
    if reader.at != len(data):
        raise ExportError(f"{name} has {len(data) - reader.at} bytes after its {count} blobs: not an export "
                          "Agent.export wrote")
    return Decoded(header, text, blobs)


class _Reader:
    """Reads an export's parts in order; one that runs past the end is an ``ExportError`` naming it."""

    def __init__(self, data: bytes, at: int, name: str) -> None:
        self.data, self.at, self.name = data, at, name

    def take(self, size: int, what: str) -> bytes:
        if self.at + size > len(self.data):
            raise ExportError(f"{self.name}: {what} runs past its end ({len(self.data) - self.at} bytes left, "
                              f"{size} needed)")
        part = self.data[self.at:self.at + size]
        self.at += size
        return part

    def unpack(self, layout: str, what: str) -> tuple[int, ...]:
        return struct.unpack(layout, self.take(struct.calcsize(layout), what))
