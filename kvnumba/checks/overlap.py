"""A destination must not overlap what the same call reads to find its way (layer tables, index
arrays): the kernel would overwrite them mid-transfer and then follow garbage addresses."""
from ..errors import OverlapError


def check_disjoint(destinations, guides):
    """``destinations`` and ``guides``: lists of ``(name, start, end)`` byte ranges. Raises
    ``OverlapError`` naming the first destination that overlaps a guide."""
    for dst_name, dst_start, dst_end in destinations:
        for name, start, end in guides:
            if dst_start < end and start < dst_end and dst_start < dst_end and start < end:
                raise OverlapError(f"{dst_name} overlaps {name} (bytes 0x{max(dst_start, start):x} to "
                                   f"0x{min(dst_end, end):x}): the copy would overwrite {name} while reading it; "
                                   "use separate buffers")


def hull(ranges):
    """``(lowest start, highest end)`` of ``(name, start, end)`` ranges; ``(0, 0)`` for none."""
    ranges = [r for r in ranges if r[2] > r[1]]
    if not ranges:
        return 0, 0
    return min(r[1] for r in ranges), max(r[2] for r in ranges)
