"""The bytes ``Agent.export`` returns and ``Agent.connect`` reads.

    magic (16 B) | format version (u16) | header length (u32) | header (JSON, UTF-8)
    | blob count (u16) | per blob: length (u32) + NIXL metadata | SHA-256 of everything before (32 B)

The header says who exported (agent name, the agent object's random instance id), which export
(``export``: a random id, also written in the exporter's token slot at ``token``), and the view (a
``kvnumba.remote.sides.Side`` header: class, layout, geometry, addresses, buffers, memory). The blobs are
NIXL's partial metadata for the view's memory and for the token slot. The checksum catches bytes
damaged or cut in transit; the magic and version, bytes that are not an export of this format.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from ..errors import ExportError

MAGIC = b"kvnumba-export\x00\x01"
VERSION = 1
_DIGEST = 32


def encode(header: dict[str, Any], blobs: list[bytes]) -> bytes:
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    body = [MAGIC, struct.pack("<HI", VERSION, len(text)), text, struct.pack("<H", len(blobs))]
    for blob in blobs:
        body += [struct.pack("<I", len(blob)), bytes(blob)]
    data = b"".join(body)
    return data + hashlib.sha256(data).digest()


def decode(exported: Any, name: str = "exported") -> tuple[dict[str, Any], list[bytes]]:
    """``(header, blobs)`` of an export; ``TypeError`` / ``ExportError`` naming ``name`` otherwise."""
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
    at = len(MAGIC)
    version, length = struct.unpack_from("<HI", data, at)
    if version != VERSION:
        raise ExportError(f"{name} is export format version {version}; this kvnumba reads version {VERSION}: use "
                          "the same kvnumba version on both sides")
    at += 6
    try:
        header = json.loads(data[at:at + length])
    except ValueError as error:  # pragma: no cover - the checksum matched: only a writer's bug gets here
        raise ExportError(f"{name} has an unreadable header: {error}") from None
    at += length
    (count,) = struct.unpack_from("<H", data, at)
    at += 2
    blobs = []
    for _ in range(count):
        (size,) = struct.unpack_from("<I", data, at)
        at += 4
        blobs.append(data[at:at + size])
        at += size
    return header, blobs
