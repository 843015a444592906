"""The staged load kernel: host -> device per-layer loads through Hopper's bulk-copy unit (TMA).

Why: a kernel that loads pinned host memory into registers keeps only so many bytes in flight per SM,
so its bandwidth is those bytes over the PCIe round trip. The bulk-copy unit moves a whole box of rows
into shared memory per instruction, holding no registers while it is in flight.

Per block (the items the register kernel's block would take), the warps have three roles:

- warp 0, the *loader*, finds *runs* of items whose source tokens are consecutive (inside one page for
  page-head), 32 items at a time by two warp votes. A run of ``min_run`` tokens or more is posted as
  tensor-map boxes (one per buffer, ``2**r`` tokens) into one of ``stages`` shared-memory buffers;
  shorter runs are batched ``direct_batch`` items to a *direct* post, which carries only the item range.
  Posts go through a ring of ``slots`` descriptors, more than there are buffers;
- the *store warps* write each landed piece out through the bulk unit too, and free the buffer once the
  unit has read it;
- every warp but the loader copies direct items through registers (``kernels.item_copy``'s body).

A block of few runs (random indices) would lose to the register kernel, so the loader first samples
32 places (``make_few_runs``); below ``StagedShape.fallback_runs`` runs it posts one *register* mark and
every warp copies its register-kernel share. The choice is made per block, inside the kernel: no host
read, no synchronisation. Every index is still bounded, as in the register kernel.

Parameters: the register kernel's (``params.KernelArgs``), then ``params.STAGED_EXTRA``: the device address
of the source's tensor maps (``plan.tensor_maps``: K's for box lengths ``1, 2, .. 2**max_run_log2``, then
V's), ``max_run_log2`` and ``min_run``.
"""
from typing import NamedTuple

from numba import cuda, int64

from .factory import MAX_REGISTERS, copy_shape_for, memoised
from .item_copy import make_items_copy
from .jit import WARP_SIZE, device_function, kernel
from .layouts import LAYER_FIRST, LAYER_TABLE, PAGE_FIRST, PAGE_HEAD
from .memory import load_i64, store_u64, store_u128
from .params import StagedArgs, check_parameters, signature
from .tma import (ARRIVALS_PER_WARP, arrive, arrive_expect_bytes, ballot, barrier_fence, barrier_init, barrier_inval,
                  broadcast, bulk_commit, bulk_store, bulk_wait, bulk_wait_read, count_set, first_set,
                  load_shared_u128, release, shared_address, sync_warp, tensor_load, try_wait)
from .warp_copy import warp_loop


class StagedShape(NamedTuple):
    """The rings in shared memory and the warps' roles."""

    stages: int = 3  # data buffers in flight: enough bytes for the PCIe round trip
    stage_bytes: int = 64 * 1024  # one piece: K and V of up to stage_bytes / (2 * item_size) tokens
    slots: int = 16  # posts in flight (bulk pieces and direct batches): a direct batch needs no buffer
    min_bulk_bytes: int = 8 * 1024  # a bulk operation below this (per buffer) is slower than registers
    store_warps: int = 16  # warps writing bulk pieces out (0: every warp but the loader)
    direct_batch: int = 128  # short-run items per direct post (copied by every warp but the loader)
    fallback_runs: int = 10  # fewer runs among a block's 32 samples: it copies as the register kernel (0: never)
    # A bulk piece is written out by the bulk unit (one warp, a lane per token), not through the store
    # warps' registers: its buffer is free as soon as the unit has read it.
    bulk_stores: bool = True
    leave_out: str = ""  # measurement only (scripts/tune_staged.py): "data" or "stores", see _build

    @property
    def shared_bytes(self):
        return HEADER_BYTES + 128 + self.stages * self.stage_bytes


MAX_STAGES = 8
MAX_SLOTS = 32
_FIELDS = 5  # a post's descriptor: first item, count, kind, first warp, data buffer
HEADER_BYTES = 8 * (3 + _FIELDS) * MAX_SLOTS  # barriers and descriptors, before the 128-byte-aligned stages
MAX_RUN = 32  # tokens per piece, at most (a box dimension may not exceed 256)
SHAPE = StagedShape()
MAP_BYTES = 128  # one CUtensorMap
TMA_ALIGN = 128  # a tensor load's destination in shared memory (cp.async.bulk.tensor, no swizzle)

DESTINATIONS = (LAYER_FIRST, LAYER_TABLE.one_layer())  # item t at base + t * item_size
SIGNATURE = signature(StagedArgs)


def stageable(parts):
    """A source the tensor maps can picture: its layout declares how (``LayoutParts.map_geometry``)."""
    return parts.map_geometry is not None


_END, _DIRECT, _BULK, _REGISTER = 0, 1, 2, 3  # a post's kind: the end mark, short-run items, a bulk piece, and
# the register mark (few runs: every warp copies its register-kernel share, and no other post follows)
LEAVE_OUT = ("", "data", "stores")


def second_offset(count, item_size):
    """Where a piece's second buffer (V's items) starts in its stage: after the first's ``count`` items of
    ``item_size`` bytes, rounded up to ``TMA_ALIGN``, as a tensor load's destination must be."""
    return (count * item_size + TMA_ALIGN - 1) & ~(TMA_ALIGN - 1)


second_buffer = device_function(second_offset)  # the same, in a kernel


def piece_bytes(count, item_size, mla, tail=0):
    """Bytes of a stage that a piece of ``count`` tokens fills: K's items, V's from ``second_offset`` on,
    then ``tail`` bytes a token a buffer (the FP8 kernel's scales)."""
    if mla:
        return count * (item_size + tail)
    return second_offset(count, item_size) + count * (item_size + 2 * tail)


def run_limits(item_size, mla, shape=None, tail=0):
    """``(max_run_log2, min_run)`` for items of ``item_size`` bytes (and ``tail`` more a token a buffer,
    ``piece_bytes``): the longest piece a stage holds (a power of two) and the shortest run worth a bulk
    operation; None when a stage cannot hold a piece of one token."""
    shape = shape or SHAPE
    if piece_bytes(1, item_size, mla, tail) > shape.stage_bytes:
        return None
    longest = 1
    while longest < MAX_RUN and piece_bytes(2 * longest, item_size, mla, tail) <= shape.stage_bytes:
        longest *= 2
    shortest = 1
    while shortest * (item_size + tail) < shape.min_bulk_bytes and shortest < longest:
        shortest *= 2
    return longest.bit_length() - 1, shortest


def make_few_runs(fallback_runs, head_major):
    """``few_runs(lane, begin, end, src_indices, src_limit, page, min_run)``, a warp's vote: whether the
    items ``[begin, end)`` hold fewer than ``fallback_runs`` runs in 32 samples (never, for 0). Lane ``l``
    takes the ``min_run`` items from place ``l * step``, a run if their source tokens run on (and,
    ``head_major``, stay in one page): a guess only; the loader still checks every item it moves. ``step``
    is odd, so the places fall at every offset within power-of-two pages (an even step can put every
    place on a page's last token)."""

    @device_function
    def few_runs(lane, begin, end, src_indices, src_limit, page, min_run):
        if fallback_runs == 0:
            return False
        holds = False
        span = end - begin - min_run + 1  # places a run of min_run items can start
        if span > 0:
            step = max(((span >> 5) - 1) | 1, 1)  # odd, and 32 places fit in span (1 below 32 places)
            j = begin + lane * step % span
            first = load_i64(src_indices + j * 8)
            last = load_i64(src_indices + (j + min_run - 1) * 8)
            holds = 0 <= first and last < src_limit and last - first == min_run - 1
            if head_major:
                holds = holds and first // page == last // page
        return count_set(ballot(holds)) < fallback_runs

    return few_runs


@device_function
def _no_fill(lane, stage, full, first, count, layer, args):
    pass  # make_ring without fill_piece: never called (its calls are compiled out)


@device_function
def wait_phase(bar, parity):
    """Until the phase of ``parity`` of barrier ``bar`` has completed."""
    while try_wait(bar, parity) == 0:
        pass


def make_ring(layout, mla, ring, fill_piece=None):
    """``make_block``: the ring every staged kernel's block runs (this one's and ``kernels.dequantise_staged``'s)
    over sources whose tensor maps picture ``layout`` (``stageable``: layer-first maps are one layer's).

    ``fill_piece(lane, stage, full, first, count, layer, args)``, where given: every lane of the loader warp
    calls it for each bulk piece once the piece's stage and slot are free and before its boxes are posted,
    to bring more of the piece into its stage (the FP8 kernel's scales, by copies tied to barrier ``full``
    with ``async_copy.landed_arrive``)."""
    fills = fill_piece is not None
    fill = fill_piece if fills else _no_fill
    head_major = layout.head_major  # the map has a head dimension, and a piece never crosses a page
    layered = layout is not LAYER_FIRST  # the layer is a coordinate of the map (a layer-first map is one layer)
    buffers = 1 if mla else 2
    bulk_stores = ring.bulk_stores
    few_runs = make_few_runs(ring.fallback_runs, head_major)
    load_data = ring.leave_out != "data"
    stages, stage_bytes, slots = ring.stages, ring.stage_bytes, ring.slots
    direct_batch, store_warps = ring.direct_batch, ring.store_warps
    # Barriers per slot: ``full`` (its data landed), ``empty`` (every consumer released it), ``posted`` (its
    # descriptor is written: warps that write no bulk items need not wait for data).
    full_at, empty_at, posted_at = 0, 8 * slots, 16 * slots
    descriptors = 3 * slots  # int64 index of slot 0's descriptor

    @device_function
    def wait_released(base, k):
        """Until every consumer warp has released the loader's ``k``-th post."""
        wait_phase(base + empty_at + (k % slots) * 8, (k // slots) & 1)

    @device_function
    def claim(smem, base, k, first, count, kind, rot, buffer):
        """Slot for the loader's ``k``-th post (free once the consumers released its last post), described."""
        s = k % slots
        if k >= slots:
            wait_released(base, k - slots)
        d = descriptors + _FIELDS * s
        smem[d] = first
        smem[d + 1] = count
        smem[d + 2] = kind
        smem[d + 3] = rot
        smem[d + 4] = buffer
        arrive(base + posted_at + s * 8)
        return s

    @device_function
    def send_boxes(base, data, s, first, count, log2, buffer, src_indices, layer, page, maps, max_run_log2, item_size):
        """The tensor loads of a claimed bulk piece (slot ``s``), completing its ``full`` barrier's phase."""
        full = base + full_at + s * 8
        if not load_data:
            arrive(full)
            return
        arrive_expect_bytes(full, count * item_size * buffers)
        token = load_i64(src_indices + first * 8)
        stage = data + buffer * stage_bytes
        k_map = maps + log2 * MAP_BYTES
        if head_major:
            c1, c2, c3, c4 = layer, 0, token % page, token // page
        else:
            c1, c2, c3, c4 = 0, layer if layered else 0, token, 0
        tensor_load(stage, k_map, 0, c1, c2, c3, c4, full)
        if not mla:
            v_map = k_map + (max_run_log2 + 1) * MAP_BYTES
            tensor_load(stage + second_buffer(count, item_size), v_map, 0, c1, c2, c3, c4, full)

    @device_function
    def post_plain(smem, base, k, first, count, kind, rot):  # a post without data: its `full` at once
        s = claim(smem, base, k, first, count, kind, rot, 0)
        arrive(base + full_at + s * 8)

    @device_function
    def turn(rot, count, n):
        """The warp after ``count`` more items go round ``n`` warps from warp ``rot``."""
        rot += count
        while rot >= n:
            rot -= n
        return rot

    @device_function
    def load(lane, smem, holder, base, data, begin, end, src_indices, dst_indices, layer, src_limit, dst_limit, page,
             maps, max_run_log2, min_run, item_size, stores, consumers, args):
        """The loader warp: the block's items as bulk pieces and direct batches, then the end mark; or, for a
        block of few runs, only the register mark (returns True: the loader then copies its share).

        Each lane reads one item's indices, and two votes give which of 32 items are in range and which
        continue their predecessor's run; all lanes walk the window alike, lane 0 posts. ``holder``:
        ``MAX_STAGES`` int64 of local memory (the post that last filled each buffer)."""
        if few_runs(lane, begin, end, src_indices, src_limit, page, min_run):
            if lane == 0:
                post_plain(smem, base, 0, 0, 0, _REGISTER, 0)
            return True
        longest = 1 << max_run_log2
        k = 0  # posts so far
        pieces = 0  # bulk posts so far (piece p fills data buffer p % stages)
        bulk_rot = 0  # the store warp the next bulk item goes to
        direct_rot = 0  # the consumer warp the next direct item goes to
        i = begin
        direct_from = begin
        while i < end:
            j = i + lane
            ok = False
            follows = False
            if j < end:
                s = load_i64(src_indices + j * 8)
                d = load_i64(dst_indices + j * 8)
                ok = 0 <= s < src_limit and 0 <= d < dst_limit
                if ok and lane > 0:
                    follows = s == load_i64(src_indices + (j - 1) * 8) + 1
                    if head_major:  # a piece never crosses a page
                        follows = follows and s % page != 0
            in_range = ballot(ok)
            breaks = ~ballot(follows) & 0xFFFFFFFF  # bit p: item i + p does not continue a run
            window = min(32, end - i)
            p = 0
            while p < window:
                n = 0
                if (in_range >> p) & 1:
                    rest = breaks >> (p + 1)
                    if rest == 0 and p > 0:  # the run may go on past the window: read from here again
                        break
                    n = first_set(rest) if rest != 0 else 32 - p
                    n = min(min(n, window - p), longest)  # two arguments a min(): numba-cuda-mlir lowers no more
                if n >= min_run:
                    if i + p > direct_from:
                        if lane == 0:
                            post_plain(smem, base, k, direct_from, i + p - direct_from, _DIRECT, direct_rot)
                        direct_rot = turn(direct_rot, i + p - direct_from, consumers)
                        k += 1
                    log2 = 0
                    while (2 << log2) <= n:
                        log2 += 1
                    buffer = pieces % stages
                    if lane == 0:
                        # the buffer's last piece must be written out (claiming a slot that came round waits too)
                        if pieces >= stages and k - holder[buffer] < slots:
                            wait_released(base, holder[buffer])
                        claim(smem, base, k, i + p, 1 << log2, _BULK, bulk_rot, buffer)
                    if fills:  # every lane brings its share of the piece into the stage before the boxes go
                        sync_warp()
                        fill(lane, data + buffer * stage_bytes, base + full_at + (k % slots) * 8, i + p, 1 << log2,
                             layer, args)
                        sync_warp()  # every lane's pending arrival is on the barrier before its phase can end
                    if lane == 0:
                        send_boxes(base, data, k % slots, i + p, 1 << log2, log2, buffer, src_indices, layer, page,
                                   maps, max_run_log2, item_size)
                    holder[buffer] = k
                    bulk_rot = turn(bulk_rot, 1 if bulk_stores else 1 << log2, stores)
                    pieces += 1
                    k += 1
                    p += 1 << log2
                    direct_from = i + p
                else:
                    p += max(n, 1)
                    if i + p - direct_from >= direct_batch:
                        if lane == 0:
                            post_plain(smem, base, k, direct_from, i + p - direct_from, _DIRECT, direct_rot)
                        direct_rot = turn(direct_rot, i + p - direct_from, consumers)
                        k += 1
                        direct_from = i + p
            i += p
        if lane == 0:
            if i > direct_from:
                post_plain(smem, base, k, direct_from, i - direct_from, _DIRECT, direct_rot)
                k += 1
            post_plain(smem, base, k, 0, 0, _END, 0)
        return False

    @device_function
    def set_up(smem, tid, threads):
        """Thread 0 makes the block's barriers (the kernel then synchronises the block)."""
        if tid == 0:
            base = shared_address(smem)
            consumers = (threads >> 5) - 1
            for s in range(slots):
                barrier_init(base + full_at + s * 8, 1)
                barrier_init(base + empty_at + s * 8, consumers * ARRIVALS_PER_WARP)
                barrier_init(base + posted_at + s * 8, 1)
            barrier_fence()

    def make_block(take_piece, take_direct):
        """``(set_up, run_block)``: a block's part of a staged kernel, which calls ``set_up(smem, tid, threads)``,
        synchronises the block, then ``run_block(...)`` (as ``transfer_kv_staged`` below: ``cuda``'s thread
        values are read in the kernel's own module, the only one the simulator gives them to). And

        - ``take_piece(lane, stage, full, parity, first, j, count, n, args)``: the warp's items ``first + j``,
          ``first + j + n``, .. below ``first + count`` of a bulk piece at ``stage`` (item t at ``stage + t *
          item_size``, V's after K's), not to be read before barrier ``full``'s phase of ``parity`` completes.
          A ring of ``bulk_stores`` gives each piece whole (``j == 0``, ``n == 1``) to one warp;
        - ``take_direct(lane, first, j, count, n, args)``: the same items, read from the source;
        - ``args``: the kernel's own values, a tuple handed to both."""

        @device_function
        def consume(lane, me, smem, base, data, stores, consumers, args):
            """A consumer warp: the posts in turn until the end mark (False) or the register mark (True)."""
            k = 0
            while True:
                s = k % slots
                parity = (k // slots) & 1
                wait_phase(base + posted_at + s * 8, parity)
                # Lane 0 alone reads the descriptor and hands it round: the slot's only reader is the lane
                # that releases it, so the loader's next write there is ordered by the barriers alone.
                d = descriptors + _FIELDS * s
                first = count = kind = rot = buffer = 0
                if lane == 0:
                    first, count, kind, rot, buffer = smem[d], smem[d + 1], smem[d + 2], smem[d + 3], smem[d + 4]
                first, count, kind = broadcast(first), broadcast(count), broadcast(kind)
                rot, buffer = broadcast(rot), broadcast(buffer)
                if kind == _END:
                    bulk_wait()  # this thread's bulk stores have written global memory
                    return False
                if kind == _REGISTER:
                    return True
                # bulk pieces go round the store warps, direct items round every consumer
                n = stores if kind == _BULK else consumers
                j = me - rot  # items go round the n warps from the post's first warp
                if j < 0:
                    j += n
                if kind != _BULK:
                    take_direct(lane, first, j, count, n, args)
                elif me < n and j < count and not (bulk_stores and j != 0):
                    take_piece(lane, data + buffer * stage_bytes, base + full_at + s * 8, parity, first, j, count,
                               n, args)
                release(base + empty_at + s * 8, lane)
                k += 1

        @device_function
        def run_block(smem, holder, tid, block, threads, num_items, items_per_warp, src_indices, dst_indices, layer,
                      src_limit, dst_limit, page, maps, max_run_log2, min_run, item_size, args):
            base = shared_address(smem)
            data = (base + HEADER_BYTES + 127) & ~127
            warp = tid >> 5
            lane = tid & (WARP_SIZE - 1)
            warps = threads >> 5
            consumers = warps - 1
            stores = consumers
            if store_warps != 0:
                stores = min(stores, store_warps)
            begin = block * items_per_warp * warps
            end = min(begin + items_per_warp * warps, num_items)
            if warp == 0:
                if not load(lane, smem, holder, base, data, begin, end, src_indices, dst_indices, layer, src_limit,
                            dst_limit, page, maps, max_run_log2, min_run, item_size, stores, consumers, args):
                    return
            elif not consume(lane, warp - 1, smem, base, data, stores, consumers, args):
                return
            # the register mark: each warp copies the items the register kernel's warp would
            share = begin + warp * items_per_warp
            take_direct(lane, share, 0, min(share + items_per_warp, end) - share, 1, args)

        return set_up, run_block

    return make_block


def make_reset(ring):
    """``reset(smem)``: the ring's ``3 * slots`` barriers invalidated, for ``set_up`` to make them again (a block
    that runs the ring once per layer: ``kernels.resident_staged``). One thread calls it, with nothing in flight."""
    barriers = 3 * ring.slots

    @device_function
    def reset(smem):
        base = shared_address(smem)
        for b in range(barriers):
            barrier_inval(base + 8 * b)

    return reset


def make_load_block(src, dst, mla, shape, ring):
    """``(set_up, run_block)`` of the staged load: one layer's load of a block, for this kernel and the resident
    loader's staged build (``kernels.resident_staged``)."""
    dst_layer_base, dst_token_offset = dst.layer_base, dst.token_offset
    copy_items = make_items_copy(src, dst, mla, shape)
    bulk_stores = ring.bulk_stores
    # Measurement variants (scripts/tune_staged.py) that leave a stage out to time the others: "data" posts
    # pieces without loading them, "stores" never writes them out. Both copy wrong bytes.
    write_out = ring.leave_out != "stores"

    store_chunk = warp_loop(load_shared_u128, store_u128, 16, 2)

    @device_function
    def store_item(lane, src, dst, nbytes):
        """The warp writes one item from shared memory to ``dst``: 16-byte stores, or 8-byte ones where
        ``dst`` is only 8-byte aligned (a per-layer table's arrays are checked for 8)."""
        if (dst & 15) == 0:
            store_chunk(lane, src, dst, nbytes)
            return
        offset = lane * 16
        while offset < nbytes:
            lo, hi = load_shared_u128(src + offset)
            store_u64(dst + offset, lo)
            store_u64(dst + offset + 8, hi)
            offset += WARP_SIZE * 16

    @device_function
    def destinations(dst_token, layer, dst_k, dst_v, item_size, dst_layout_dim, dst_page_size):
        """Where a token's K and V go (V's is 0 for MLA)."""
        offset = dst_token_offset(dst_token, dst_layout_dim, item_size, 1, dst_page_size)
        dk = dst_layer_base(dst_k, layer, dst_layout_dim, item_size, 1, dst_page_size) + offset
        dv = 0
        if not mla:
            dv = dst_layer_base(dst_v, layer, dst_layout_dim, item_size, 1, dst_page_size) + offset
        return dk, dv

    @device_function
    def store_token(lane, stage, count, t, dst_token, layer, dst_k, dst_v, item_size, dst_layout_dim, dst_page_size):
        """The warp writes token ``t`` of a landed piece (K, then V's after all K's) out through its registers."""
        dk, dv = destinations(dst_token, layer, dst_k, dst_v, item_size, dst_layout_dim, dst_page_size)
        store_item(lane, stage + t * item_size, dk, item_size)
        if not mla:
            store_item(lane, stage + second_buffer(count, item_size) + t * item_size, dv, item_size)

    @device_function
    def write_piece(lane, stage, first, count, dst_indices, layer, dst_k, dst_v, item_size, dst_layout_dim,
                    dst_page_size):
        """One warp writes a landed piece out through the bulk unit, lane ``t`` token ``t``, and waits
        only until the unit has read the stage. Destinations that are not 16-byte aligned (a user's
        offset view) go through the warp's loads and stores instead."""
        dk = 0
        dv = 0
        if lane < count:
            dk, dv = destinations(load_i64(dst_indices + (first + lane) * 8), layer, dst_k, dst_v, item_size,
                                  dst_layout_dim, dst_page_size)
        if ballot(((dk | dv) & 15) == 0) == 0xFFFFFFFF:
            if lane < count:
                bulk_store(dk, stage + lane * item_size, item_size)
                if not mla:
                    bulk_store(dv, stage + second_buffer(count, item_size) + lane * item_size, item_size)
                bulk_commit()
                bulk_wait_read()
            return
        for t in range(count):
            store_token(lane, stage, count, t, load_i64(dst_indices + (first + t) * 8), layer, dst_k, dst_v,
                        item_size, dst_layout_dim, dst_page_size)

    @device_function
    def take_piece(lane, stage, full, parity, first, j, count, n, args):
        (src_indices, dst_indices, layer, src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v, item_size,
         src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag) = args
        wait_phase(full, parity)
        if not write_out:
            return
        if bulk_stores:
            write_piece(lane, stage, first, count, dst_indices, layer, dst_k, dst_v, item_size, dst_layout_dim,
                        dst_page_size)
            return
        while j < count:  # the store warps' path (bulk_stores=False)
            store_token(lane, stage, count, j, load_i64(dst_indices + (first + j) * 8), layer, dst_k, dst_v,
                        item_size, dst_layout_dim, dst_page_size)
            j += n

    @device_function
    def take_direct(lane, first, j, count, n, args):  # through registers
        (src_indices, dst_indices, layer, src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v, item_size,
         src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag) = args
        copy_items(lane, first, j, count, n, src_indices, dst_indices, layer, 1, src_token_limit, dst_token_limit,
                   src_k, dst_k, src_v, dst_v, item_size, src_layout_dim, dst_layout_dim, src_page_size,
                   dst_page_size, head_num, error_flag)

    return make_ring(src, mla, ring)(take_piece, take_direct)


def _build(src, dst, mla, shape, ring):
    set_up, run_block = make_load_block(src, dst, mla, shape, ring)

    def transfer_kv_staged(src_indices, dst_indices, num_items, items_per_warp, first_layer, src_token_limit,
                           dst_token_limit, src_k, dst_k, src_v, dst_v, num_layers, item_size, src_layout_dim,
                           dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag, maps, max_run_log2,
                           min_run):
        args = (src_indices, dst_indices, first_layer, src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v,
                item_size, src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num, error_flag)
        smem = cuda.shared.array(0, int64)
        set_up(smem, cuda.threadIdx.x, cuda.blockDim.x)
        cuda.syncthreads()
        run_block(smem, cuda.local.array(MAX_STAGES, int64), cuda.threadIdx.x, cuda.blockIdx.x, cuda.blockDim.x,
                  num_items, items_per_warp, src_indices, dst_indices, first_layer, src_token_limit, dst_token_limit,
                  src_page_size, maps, max_run_log2, min_run, item_size, args)

    check_parameters(transfer_kv_staged, StagedArgs)
    name = f"transfer_kv_staged_{src.name}_{dst.name}{'_mla' if mla else ''}"
    transfer_kv_staged.__name__ = transfer_kv_staged.__qualname__ = name
    return kernel(transfer_kv_staged, max_registers=MAX_REGISTERS)


def check_ring(ring):
    """``ring`` (a ``StagedShape``), or ``ValueError`` when no staged kernel can be built with it."""
    if (not 1 <= ring.stages <= MAX_STAGES or not ring.stages <= ring.slots <= MAX_SLOTS or ring.stage_bytes % 128
            or not 0 <= ring.fallback_runs <= WARP_SIZE or ring.leave_out not in LEAVE_OUT):
        raise ValueError(f"bad staged ring {ring}")
    return ring


def get_staged_kernel(src, dst, mla, ring=None):
    """The staged kernel for source layout ``src`` (``stageable``) and destination ``dst`` (one of
    ``DESTINATIONS``) with ring ``ring`` (default ``SHAPE``), built on first request and memoised."""
    if not stageable(src) or dst not in DESTINATIONS:
        raise ValueError(f"no staged kernel from {src.name} to {dst.name}")
    # the direct items' inner loop is part of the kernel, so of its key
    return memoised(_build, src, dst, bool(mla), copy_shape_for(src, dst, mla), check_ring(ring or SHAPE))
