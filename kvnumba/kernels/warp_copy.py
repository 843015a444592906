"""Warp-cooperative copies of one item (or one head's chunk of it): the kernels' inner loop.

Lane ``i`` moves the words at byte offsets ``i * word + k * 32 * word``: 16-byte words when every address
and the size allow, else the seed's 8-byte words. Each round loads ``words`` words per lane before storing
any, so more bytes are in flight over PCIe; the paired form moves K and V together. Loops are ``while`` loops
over byte offsets: a stepped ``range`` and Python's signed ``//`` and ``%`` cost registers.
"""
from typing import NamedTuple

from .jit import WARP_SIZE, device_function
from .memory import make_loads, store_u64, store_u128


class CopyShape(NamedTuple):
    """How the inner loop is unrolled (chosen by measurement: scripts/RESULTS.md)."""

    words: int = 2  # words per lane (per buffer) loaded before storing: 1, 2 or 4
    wide: bool = True  # use 16-byte words when alignment allows
    paired: bool = True  # copy K and V in one loop
    load: str = "nc"  # ld.global qualifiers of the loads (memory.make_loads)


def warp_loop(load, store, word, words):
    """``copy(lane, src, dst, nbytes)``: the warp moves ``nbytes`` with ``load``/``store`` of ``word``-byte
    words, ``words`` of them a lane loaded before any is stored (1, 2 or 4). The staged kernel uses it
    with a shared-memory load."""
    step = WARP_SIZE * word

    if words == 1:

        @device_function
        def copy(lane, src, dst, nbytes):
            offset = lane * word
            while offset < nbytes:
                store(dst + offset, load(src + offset))
                offset += step

    elif words == 2:

        @device_function
        def copy(lane, src, dst, nbytes):
            offset = lane * word
            while offset < nbytes:
                o1 = offset + step
                a = load(src + offset)
                b = a
                if o1 < nbytes:
                    b = load(src + o1)
                store(dst + offset, a)
                if o1 < nbytes:
                    store(dst + o1, b)
                offset = o1 + step

    else:

        @device_function
        def copy(lane, src, dst, nbytes):
            offset = lane * word
            while offset < nbytes:
                o1 = offset + step
                o2 = o1 + step
                o3 = o2 + step
                a = load(src + offset)
                b = a
                c = a
                d = a
                if o1 < nbytes:
                    b = load(src + o1)
                if o2 < nbytes:
                    c = load(src + o2)
                if o3 < nbytes:
                    d = load(src + o3)
                store(dst + offset, a)
                if o1 < nbytes:
                    store(dst + o1, b)
                if o2 < nbytes:
                    store(dst + o2, c)
                if o3 < nbytes:
                    store(dst + o3, d)
                offset = o3 + step

    return copy


def _paired(load, store, word, words):
    step = WARP_SIZE * word

    if words == 1:

        @device_function
        def copy(lane, src_a, dst_a, src_b, dst_b, nbytes):
            offset = lane * word
            while offset < nbytes:
                a = load(src_a + offset)
                b = load(src_b + offset)
                store(dst_a + offset, a)
                store(dst_b + offset, b)
                offset += step

    else:

        @device_function
        def copy(lane, src_a, dst_a, src_b, dst_b, nbytes):
            offset = lane * word
            while offset < nbytes:
                o1 = offset + step
                a0 = load(src_a + offset)
                b0 = load(src_b + offset)
                a1 = a0
                b1 = b0
                if o1 < nbytes:
                    a1 = load(src_a + o1)
                    b1 = load(src_b + o1)
                store(dst_a + offset, a0)
                store(dst_b + offset, b0)
                if o1 < nbytes:
                    store(dst_a + o1, a1)
                    store(dst_b + o1, b1)
                offset = o1 + step

    return copy


def make_copies(shape):
    """``(copy_item, copy_pair)`` device functions for one ``CopyShape``.

    ``copy_item(lane, src, dst, nbytes)`` and ``copy_pair(lane, src_a, dst_a, src_b, dst_b, nbytes)``:
    the whole warp copies ``nbytes`` (a multiple of 8) per buffer.
    """
    load_u64, load_u128 = make_loads(shape.load)
    narrow = warp_loop(load_u64, store_u64, 8, shape.words)
    narrow_pair = _paired(load_u64, store_u64, 8, min(shape.words, 2))
    if not shape.wide:
        return narrow, narrow_pair
    wide = warp_loop(load_u128, store_u128, 16, shape.words)
    wide_pair = _paired(load_u128, store_u128, 16, min(shape.words, 2))

    @device_function
    def copy_item(lane, src, dst, nbytes):
        if (src | dst | nbytes) & 15 == 0:
            wide(lane, src, dst, nbytes)
        else:
            narrow(lane, src, dst, nbytes)

    @device_function
    def copy_pair(lane, src_a, dst_a, src_b, dst_b, nbytes):
        if (src_a | dst_a | src_b | dst_b | nbytes) & 15 == 0:
            wide_pair(lane, src_a, dst_a, src_b, dst_b, nbytes)
        else:
            narrow_pair(lane, src_a, dst_a, src_b, dst_b, nbytes)

    return copy_item, copy_pair
