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
    """``(starts, ends)``: the byte ranges of ``(name, start, end)`` triples merged into sorted,
    disjoint runs, for ``overlaps_any``."""
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
    """Whether ``[start, end)`` overlaps one of the merged runs ``starts``/``ends`` (a binary search:
    an all-layer call has one destination range per layer)."""
    i = bisect_right(starts, start) - 1
    if i >= 0 and ends[i] > start:
        return True
    return i + 1 < len(starts) and starts[i + 1] < end


def hull(ranges):
    """``(lowest start, highest end)`` of ``(name, start, end)`` ranges; ``(0, 0)`` for none."""
    ranges = [r for r in ranges if r[2] > r[1]]
    if not ranges:
        return 0, 0
    return min(r[1] for r in ranges), max(r[2] for r in ranges)


class Clearance:
    """A plan's destination ranges (``(name, start, end)``), for the test of every call's index arrays:
    ``check(name, start, end)`` raises as ``check_disjoint(destinations, [(name, start, end)])`` does, in a
    binary search's time (a one-layer load into per-layer arrays has a destination per layer).
    ``KernelPlan`` and the FP8 ``Fp8Plan`` keep one; ``plan.per_call``'s fast path reads its runs directly."""

    def __init__(self, destinations):
        self.destinations = destinations
        self.low, self.high = hull(destinations)
        self.starts, self.ends = merged(destinations)

    def check(self, name, start, end):
        if start < self.high and end > self.low and overlaps_any(self.starts, self.ends, start, end):
            check_disjoint(self.destinations, [(name, start, end)])  # raises, naming the destination
