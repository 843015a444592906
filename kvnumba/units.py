"""Sizes for people: ``format_bytes``, shared by the file converter's messages and the progress bars."""


def format_bytes(nbytes):
    """``1536`` -> ``"1.5 KB"`` (powers of 1000, as disks and links are sold)."""
    if nbytes < 1000:
        return f"{nbytes} B"
    for unit in ("KB", "MB", "GB", "TB"):
        nbytes /= 1000
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.1f} {unit}"


__all__ = ["format_bytes"]
