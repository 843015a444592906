"""Forged kvnumba.remote exports, as anyone can make them: a genuine export's header edited, or its framing
cut, and its checksum (and its blobs' digests) recomputed. ``FIELD_CASES`` breaks one field (or the
framing) each: ``connect`` must name it; ``CONSISTENT`` forgeries pass every field check but are not what
the exporter wrote: its token refuses them. Both are made from an export of a PageFirst view of
``remote_support.SHAPE`` (32 tokens, 3 layers, items of 16 bytes: K and V of 1536 bytes each).
"""
import copy
import hashlib
import struct

from kvnumba.remote import export


def reseal(data):
    """Export bytes (without their checksum) sealed with a fresh one, as anyone can."""
    return data + hashlib.sha256(data).digest()


def forge(exported, edit=None, blobs=None, digests=True):
    """``exported`` with ``edit(header)`` applied to its header (a dict, in place) and ``blobs`` for its
    blobs; the blobs' digests (``digests``) and the checksum recomputed."""
    decoded = export.decode(exported)
    header = copy.deepcopy(decoded.header)
    blobs = decoded.blobs if blobs is None else blobs
    if digests:
        header["blobs"] = [hashlib.sha256(b).hexdigest() for b in blobs]
    if edit is not None:
        edit(header)
    return export.encode(export.header_text(header), blobs)


def put(*path, value=None, remove=False):
    """An edit: set (or remove) the header field at ``path``."""
    def edit(header):
        where = header
        for key in path[:-1]:
            where = where[key]
        if remove:
            del where[path[-1]]
        else:
            where[path[-1]] = value
    return edit


def frame(exported, mutate):
    """The raw parts ``(header text, blobs)`` of ``exported`` re-framed by ``mutate(parts) -> bytes`` (the
    body before the checksum), then resealed."""
    decoded = export.decode(exported)
    return reseal(mutate(decoded.text, decoded.blobs))


def body(text, blobs, count=None, lengths=None, tail=b""):
    out = [export.MAGIC, struct.pack("<HI", export.VERSION, len(text)), text,
           struct.pack("<H", len(blobs) if count is None else count)]
    for i, blob in enumerate(blobs):
        out += [struct.pack("<I", len(blob) if lengths is None else lengths[i]), blob]
    return b"".join(out) + tail


GEOMETRY = ("layers", "tokens", "page_size", "heads", "item_bytes", "layout_dim", "dtype")
SIDE = ("class", "options", "parts", "mla", "geometry", "bases", "buffer_of", "buffers", "mem", "device")
TOP = ("agent", "instance", "export", "token", "writable", "regions", "side", "blobs", "nixl")
BIG = 2**64

# (case, forgery of a genuine export of the exporter's PageFirst [T=32, L=3, H=2, D=4] uint16 view, error match)
FIELD_CASES = [
    ("a blob count past the end", lambda e: frame(e, lambda t, b: body(t, b, count=len(b) + 1)),
     r"blob 3's length \(of 4 blobs\) runs past its end"),
    ("a blob length past the end", lambda e: frame(e, lambda t, b: body(t, b, lengths=[len(x) for x in b[:-1]]
                                                                          + [len(b[-1]) + 9])),
     r"blob 2 \(\d+ bytes, of 3 blobs\) runs past its end"),
    ("bytes after the blobs", lambda e: frame(e, lambda t, b: body(t, b, tail=b"\0")), "1 bytes after its 3 blobs"),
    ("a header length past the end", lambda e: reseal(export.MAGIC + struct.pack("<HI", export.VERSION, 10**6) + b"{}"),
     "the header runs past its end"),
    ("a header that is not JSON", lambda e: frame(e, lambda t, b: body(b"{" + t, b)), "unreadable header"),
    ("a header that is a list", lambda e: frame(e, lambda t, b: body(b"[" + t + b"]", b)),
     "its header must be a JSON object, got list"),
    ("a header {}", lambda e: forge(e, lambda h: h.clear()), "its header has no agent"),
    *[(f"no {key}", lambda e, key=key: forge(e, put(key, remove=True)), f"its header has no {key}$") for key in TOP],
    *[(f"no side.{key}", lambda e, key=key: forge(e, put("side", key, remove=True)), f"its header has no side.{key}$")
      for key in SIDE],
    *[(f"no side.geometry.{key}", lambda e, key=key: forge(e, put("side", "geometry", key, remove=True)),
       f"its header has no side.geometry.{key}$") for key in GEOMETRY],
    ("instance a string", lambda e: forge(e, put("instance", value="7")), "instance must be an integer, got str"),
    ("writable 1", lambda e: forge(e, put("writable", value=1)), "writable must be true or false, got int 1"),
    ("options a list", lambda e: forge(e, put("side", "options", value=["layout"])),
     r"side.options must be a JSON object, got list"),
    ("an option a list", lambda e: forge(e, put("side", "options", value={"layout": []})),
     r"side.options\['layout'\] must be an integer, a string, a boolean or null, got list"),
    ("mla 'no'", lambda e: forge(e, put("side", "mla", value="no")), "side.mla must be true or false, got str"),
    ("page_size 2**64", lambda e: forge(e, put("side", "geometry", "page_size", value=BIG)),
     rf"side.geometry.page_size = {BIG} is out of range"),
    ("layout_dim 2**64", lambda e: forge(e, put("side", "geometry", "layout_dim", value=BIG)),
     rf"side.geometry.layout_dim = {BIG} is out of range"),
    ("token 2**64", lambda e: forge(e, put("token", value=BIG)), rf"token = {BIG} is out of range"),
    ("bases 2**64", lambda e: forge(e, lambda h: h["side"]["bases"][0].__setitem__(0, BIG)),
     rf"side.bases\[0\]\[0\] = {BIG} is out of range"),
    ("a region's address 2**64", lambda e: forge(e, lambda h: h["regions"][0].__setitem__(2, BIG)),
     r"regions\[0\]\[2\] \(address\) = \d+ is out of range"),
    ("a buffer's size 2**64", lambda e: forge(e, lambda h: h["side"]["buffers"][0].__setitem__(1, BIG)),
     rf"side.buffers\[0\]\[1\] = {BIG} is out of range"),
    ("instance 0", lambda e: forge(e, put("instance", value=0)), r"instance = 0 is out of range"),
    ("layers=0", lambda e: forge(e, put("side", "geometry", "layers", value=0)),
     r"side.geometry.layers = 0 is out of range"),
    ("bases shorter than the layers", lambda e: forge(e, lambda h: h["side"]["bases"][0].pop()),
     r"side.bases\[0\] must hold 3 entries, got 2"),
    ("bases of K only", lambda e: forge(e, lambda h: h["side"]["bases"].pop()), r"side.bases must hold 2 entries"),
    ("buffer_of past the buffers", lambda e: forge(e, lambda h: h["side"]["buffer_of"][1].__setitem__(2, 2)),
     r"side.buffer_of\[1\]\[2\] = 2 is out of range"),
    ("heads that split an item unevenly", lambda e: forge(e, put("side", "geometry", "heads", value=3)),
     "item_bytes = 16 is not a multiple of 8 bytes split into side.geometry.heads = 3 heads"),
    ("a page longer than the view", lambda e: forge(e, put("side", "geometry", "page_size", value=2**22)),
     r"side.geometry.page_size = 4194304 is out of range: expected 1 <= side.geometry.page_size < 33"),
    ("more tokens than the buffers hold", lambda e: forge(e, put("side", "geometry", "tokens", value=33)),
     r"side.geometry says 3 layers x 33 tokens x 16 bytes = 1584 bytes of K, but its buffers .* hold 1536"),
    ("a buffer outside what was registered", lambda e: forge(e, lambda h: h["side"]["buffers"][0].__setitem__(
        0, h["side"]["buffers"][0][0] + 8)), r"side.buffers\[0\] .* is not in memory the export registered"),
    ("bases past the end of their buffer", lambda e: forge(e, lambda h: h["side"]["bases"].__setitem__(
        0, [b + 8 for b in h["side"]["bases"][0]])), r"token 31 of layer 2 \(K\) would lie outside side.buffers\[0\]"),
    ("a token outside what was registered", lambda e: forge(e, put("token", value=8)),
     "token = 0x8 is not in memory the export registered"),
    ("a token not 8-byte aligned", lambda e: forge(e, lambda h: h.__setitem__("token", h["token"] + 4)),
     "is not 8-byte aligned"),
    ("no NIXL metadata", lambda e: forge(e, blobs=[]), "it has 0 blobs of NIXL metadata for 3 registered regions"),
    ("a blob less", lambda e: forge(e, blobs=export.decode(e).blobs[:2]), "it has 2 blobs of NIXL metadata for 3"),
    ("a blob that is not the exporter's", lambda e: forge(e, blobs=[b"nixl"] + export.decode(e).blobs[1:],
                                                          digests=False), r"blob 0 does not match its digest"),
    ("memory 'HBM'", lambda e: forge(e, put("side", "mem", value="HBM")), "side.mem must be one of DRAM, VRAM"),
    ("a region in 'HBM'", lambda e: forge(e, lambda h: h["regions"][1].__setitem__(0, "HBM")),
     r"regions\[1\]\[0\] \(memory\) must be one of DRAM, VRAM"),
    ("a region of 4 fields", lambda e: forge(e, lambda h: h["regions"][1].pop()), r"regions\[1\] must hold 5 entries"),
    ("an empty dtype", lambda e: forge(e, put("side", "geometry", "dtype", value="")),
     "side.geometry.dtype must be a non-empty string"),
    ("a layout unknown here", lambda e: forge(e, put("side", "parts", value="mymodule.Nope")),
     "the export's layout 'mymodule.Nope' is not known here"),
]




def swap_memory(other_export):
    """An edit giving a header the other export's memory (addresses, regions, metadata), keeping its own
    token and id: consistent, but not what the exporter wrote."""
    theirs = export.decode(other_export).header

    def edit(header):
        for key in ("regions", "blobs"):
            header[key] = theirs[key]
        header["side"] = theirs["side"]
    return edit


CONSISTENT = {
    "bases at another exported view": lambda e, other: forge(e, swap_memory(other), blobs=export.decode(other).blobs,
                                                             digests=False),
    "writable claimed for a read-only export": lambda e, other: forge(other, put("writable", value=True)),
    "another page size": lambda e, other: forge(e, put("side", "geometry", "page_size", value=4)),
    "fewer tokens": lambda e, other: forge(e, put("side", "geometry", "tokens", value=16)),
    "another export id": lambda e, other: forge(e, lambda h: h.__setitem__("export", h["export"] + 1)),
    "another token slot": lambda e, other: forge(e, lambda h: h.__setitem__("token", h["token"] + 8)),
}
