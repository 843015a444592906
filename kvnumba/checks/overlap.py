"""A destination must not overlap what the same call reads to find its way (layer tables, index
arrays): the kernel would overwrite them mid-transfer and then follow garbage addresses."""
from bisect import bisect_right

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


def merged(ranges):
    """``(starts, ends)``: ``(name, start, end)`` ranges merged into sorted, disjoint runs."""
    runs: list[list[int]] = []
    for _, start, end in sorted(ranges, key=lambda r: r[1]):
        if end <= start:
            continue
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [r[0] for r in runs], [r[1] for r in runs]


def overlaps_any(starts, ends, start, end):
    """Whether ``[start, end)`` overlaps one of the merged runs (a binary search: an all-layer call has one
    destination range per layer)."""
    i = bisect_right(starts, start) - 1
    if i >= 0 and ends[i] > start:
        return True
    return i + 1 < len(starts) and starts[i + 1] < end


class Clearance:
    """A plan's destination ranges (``(name, start, end)``), for the test of every call's index arrays:
    ``check(name, start, end)`` raises as ``check_disjoint(destinations, [(name, start, end)])`` does, in a
    binary search's time. ``plan.per_call``'s fast path reads its runs directly."""

    def __init__(self, destinations):
        self.destinations = destinations
        self.starts, self.ends = merged(destinations)
        self.low = self.starts[0] if self.starts else 0  # the runs' hull
        self.high = self.ends[-1] if self.ends else 0

    def check(self, name, start, end):
        if start < self.high and end > self.low and overlaps_any(self.starts, self.ends, start, end):
            check_disjoint(self.destinations, [(name, start, end)])  # raises, naming the destination
