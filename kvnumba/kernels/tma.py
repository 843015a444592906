"""Hopper's bulk-copy unit (TMA) and its barriers, as the staged kernels use them (``kernels.staged``).

On the GPU these are inline PTX (sm_90+):

- ``shared_address(array)``: the shared-window address of a shared array (what PTX's
  ``[addr]`` operands of ``.shared`` instructions take);
- ``barrier_init(bar, count)``, ``barrier_fence()``: an ``mbarrier`` expecting ``count`` arrivals a
  phase, made visible to the bulk-copy unit;
- ``arrive(bar)``, ``arrive_expect_bytes(bar, nbytes)``: one arrival (the second also tells the
  barrier to wait for ``nbytes`` of bulk copies before its phase completes);
- ``try_wait(bar, parity)``: 1 once the phase of that parity has completed, else 0 (after the
  hardware's own short wait);
- ``tensor_load(dst, tensor_map, c0, c1, c2, c3, c4, bar)``: one 5-D box of a tensor map (the box
  shape is in the map) copied from global memory into shared memory at ``dst``, completing
  ``bar``'s bytes when it lands: ``cp.async.bulk.tensor.5d``;
- ``load_shared_u128(addr)``: 16 bytes of shared memory;
- ``bulk_store(dst, src, nbytes)``: the bulk-copy unit writes ``nbytes`` (a multiple of 16, both
  addresses 16-byte aligned) of shared memory at ``src`` to global memory at ``dst``, asynchronously
  (``cp.async.bulk``, one bulk group per thread); ``bulk_commit()`` closes the thread's group,
  ``bulk_wait_read()`` waits until its groups have read their shared memory (it may be reused), and
  ``bulk_wait()`` until they have written global memory;
- ``release(bar, lane)``: a consumer warp is done with a stage: its lanes agree
  (``__syncwarp``), then lane 0 arrives; ``ARRIVALS_PER_WARP`` is what a warp adds to the count;
- ``ballot(predicate)``: the 32 lanes' predicates as the bits of one int (``ballot_sync``, all lanes);
- ``first_set(mask)``: 1 + the position of the lowest set bit of a 32-bit mask, 0 if none (``ffs``).

On Numba's CUDA simulator the same names are Python twins: barriers are condition variables keyed by
address, and ``tensor_load`` walks a tensor map of kvnumba's own format (``plan.tensor_maps``) row
by row. A simulated warp's threads are independent Python threads with no ``__syncwarp``, so every
thread of a consumer warp arrives (``ARRIVALS_PER_WARP = 32``): the stage is released only when all
of them are done reading it, as on the GPU. The simulator has no warp votes: ``ballot``'s twin meets
the warp's 32 threads at a barrier kept on the simulator's block manager.
"""
from ..driver.target import SIMULATOR

if SIMULATOR:
    import ctypes
    import threading
    from typing import Any

    ARRIVALS_PER_WARP = 32
    SIM_MAP_WORDS = 16  # the simulator's tensor map: base, 5 sizes, 4 byte strides, 5 box sizes

    _barriers: dict[int, Any] = {}  # shared address -> _Barrier
    _barriers_lock = threading.Lock()

    class _Barrier:
        def __init__(self, count):
            self.count, self.pending, self.bytes, self.phase = count, count, 0, 0
            self.cond = threading.Condition()

        def _complete_if_done(self):
            if self.pending == 0 and self.bytes == 0:
                self.phase += 1
                self.pending = self.count
                self.cond.notify_all()

    def _barrier(address):
        with _barriers_lock:
            return _barriers[address]

    def shared_address(array):
        return array.ctypes.data

    def barrier_init(bar, count):
        with _barriers_lock:
            _barriers[bar] = _Barrier(count)

    def barrier_fence():
        pass

    def arrive(bar):
        b = _barrier(bar)
        with b.cond:
            b.pending -= 1
            b._complete_if_done()

    def arrive_expect_bytes(bar, nbytes):
        b = _barrier(bar)
        with b.cond:
            b.bytes += nbytes
            b.pending -= 1
            b._complete_if_done()

    def try_wait(bar, parity):
        b = _barrier(bar)
        with b.cond:
            if (b.phase & 1) == parity:  # the phase of this parity is still running
                b.cond.wait(0.01)
            return 1 if (b.phase & 1) != parity else 0

    def release(bar, lane):
        arrive(bar)

    def _words(address, count):
        return (ctypes.c_int64 * count).from_address(address)

    def tensor_load(dst, tensor_map, c0, c1, c2, c3, c4, bar):
        words = _words(tensor_map, SIM_MAP_WORDS)
        base, dims, strides, box = words[0], words[1:6], (8, *words[6:10]), words[10:15]
        row_bytes = box[0] * 8
        out = dst
        for i4 in range(box[4]):
            for i3 in range(box[3]):
                for i2 in range(box[2]):
                    for i1 in range(box[1]):
                        at = (c0, c1 + i1, c2 + i2, c3 + i3, c4 + i4)
                        if all(0 <= a < d for a, d in zip(at[1:], dims[1:])) and c0 + box[0] <= dims[0]:
                            src = base + sum(a * s for a, s in zip(at, strides))
                            ctypes.memmove(out, src, row_bytes)
                        else:  # outside the tensor: zeros, as the hardware fills
                            ctypes.memset(out, 0, row_bytes)
                        out += row_bytes
        b = _barrier(bar)
        with b.cond:
            b.bytes -= out - dst
            b._complete_if_done()

    def bulk_store(dst, src, nbytes):
        ctypes.memmove(int(dst), int(src), int(nbytes))

    def bulk_commit():
        pass

    def bulk_wait_read():
        pass

    def bulk_wait():
        pass

    def load_shared_u128(addr):
        addr = int(addr)
        return (ctypes.c_uint64.from_address(addr).value, ctypes.c_uint64.from_address(addr + 8).value)

    class _Vote:
        def __init__(self):
            self.meet = threading.Barrier(32)
            self.bits = [0] * 32

    def ballot(predicate):
        thread: Any = threading.current_thread()  # the simulator's BlockThread
        block = thread._manager  # the simulator's BlockManager: one per block while it runs
        warp, lane = thread.thread_id >> 5, thread.thread_id & 31
        with _barriers_lock:
            votes = block.__dict__.setdefault("_kvnumba_votes", {})
            vote = votes.setdefault(warp, _Vote())
        vote.bits[lane] = 1 if predicate else 0
        vote.meet.wait()
        mask = sum(bit << i for i, bit in enumerate(vote.bits))
        vote.meet.wait()  # nobody votes again before every lane has read this vote
        return mask

    def first_set(mask):
        mask = int(mask) & 0xFFFFFFFF
        return (mask & -mask).bit_length()

else:
    from llvmlite import ir
    from numba import cuda, int64, types, uint32
    from numba.cuda.extending import intrinsic

    from .jit import device_function

    ARRIVALS_PER_WARP = 1

    _I32, _I64 = ir.IntType(32), ir.IntType(64)
    _PAIR = ir.LiteralStructType([_I64, _I64])

    def _asm(builder, ret, args, text, constraints):
        kind = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(kind, text, constraints, side_effect=True), args)

    def _u32(builder, value):  # shared-window addresses fit 32 bits, as PTX's "r" operands want
        return builder.trunc(value, _I32)

    @intrinsic
    def shared_address(typingctx, array):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            generic = builder.ptrtoint(data, _I64)
            return _asm(builder, _I64, [generic], "cvta.to.shared.u64 $0, $1;", "=l,l")

        return types.int64(array), codegen

    @intrinsic
    def barrier_init(typingctx, bar, count):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_u32(builder, args[0]), _u32(builder, args[1])],
                 "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    @intrinsic
    def barrier_fence(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;",
                 "~{memory}")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def arrive(typingctx, bar):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_u32(builder, args[0])], "mbarrier.arrive.shared::cta.b64 _, [$0];",
                 "r,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64), codegen

    @intrinsic
    def arrive_expect_bytes(typingctx, bar, nbytes):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_u32(builder, args[0]), _u32(builder, args[1])],
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    @intrinsic
    def try_wait(typingctx, bar, parity):
        def codegen(context, builder, sig, args):
            done = _asm(builder, _I32, [_u32(builder, args[0]), _u32(builder, args[1])],
                        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n\t"
                        "selp.b32 $0, 1, 0, p;\n\t}", "=r,r,r,~{memory}")
            return builder.sext(done, _I64)

        return types.int64(types.int64, types.int64), codegen

    @intrinsic
    def tensor_load(typingctx, dst, tensor_map, c0, c1, c2, c3, c4, bar):
        def codegen(context, builder, sig, args):
            dst_, map_, *coords, bar_ = args
            operands = [_u32(builder, dst_), map_, *[_u32(builder, c) for c in coords], _u32(builder, bar_)]
            _asm(builder, ir.VoidType(), operands,
                 "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[$0], [$1, {$2, $3, $4, $5, $6}], [$7];", "r,l,r,r,r,r,r,r,~{memory}")
            return context.get_dummy_value()

        return types.void(*([types.int64] * 8)), codegen

    @intrinsic
    def bulk_store(typingctx, dst, src, nbytes):
        def codegen(context, builder, sig, args):
            # The shared memory was written by the bulk unit (a tensor load), in the async proxy as
            # this read: no proxy fence is needed, but one costs nothing next to the copy.
            _asm(builder, ir.VoidType(), [args[0], _u32(builder, args[1]), _u32(builder, args[2])],
                 "fence.proxy.async.shared::cta;\n\tcp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
                 "l,r,r,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.int64, types.int64), codegen

    def _no_operands(text):
        @intrinsic
        def instruction(typingctx):
            def codegen(context, builder, sig, args):
                _asm(builder, ir.VoidType(), [], text, "~{memory}")
                return context.get_dummy_value()

            return types.void(), codegen

        return instruction

    bulk_commit = _no_operands("cp.async.bulk.commit_group;")
    bulk_wait_read = _no_operands("cp.async.bulk.wait_group.read 0;")
    bulk_wait = _no_operands("cp.async.bulk.wait_group 0;")

    @intrinsic
    def load_shared_u128(typingctx, addr):
        pair_type = types.UniTuple(types.uint64, 2)

        def codegen(context, builder, sig, args):
            both = _asm(builder, _PAIR, [_u32(builder, args[0])], "ld.shared.v2.u64 {$0, $1}, [$2];", "=l,=l,r")
            parts = [builder.extract_value(both, 0), builder.extract_value(both, 1)]
            return context.make_tuple(builder, pair_type, parts)

        return pair_type(types.int64), codegen

    @device_function
    def ballot(predicate):
        return int64(cuda.ballot_sync(0xFFFFFFFF, predicate)) & 0xFFFFFFFF

    @device_function
    def first_set(mask):
        return int64(cuda.ffs(uint32(mask)))

    @device_function
    def release(bar, lane):
        cuda.syncwarp()
        if lane == 0:
            arrive(bar)
