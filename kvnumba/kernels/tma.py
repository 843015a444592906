"""Hopper's bulk-copy unit (TMA) and its barriers, as the staged kernels use them (``kernels.staged``).

On the GPU these are inline PTX (sm_90+); addresses are shared-window addresses (``shared_address(array)``):

- ``barrier_init(bar, count)``, ``barrier_fence()``: an ``mbarrier`` expecting ``count`` arrivals a phase,
  made visible to the bulk-copy unit; ``barrier_inval(bar)`` unmakes it (before ``barrier_init`` again);
- ``arrive(bar)``, ``arrive_expect_bytes(bar, nbytes)``: one arrival (the second also makes the phase wait for
  ``nbytes`` of bulk copies); ``expect_bytes(bar, nbytes)``: that wait with no arrival (``mbarrier.expect_tx``);
- ``try_wait(bar, parity)``: 1 once the phase of that parity has completed, else 0;
- ``tensor_load(dst, tensor_map, c0, c1, c2, c3, c4, bar)``: one 5-D box of a tensor map copied from global
  into shared memory at ``dst``, completing ``bar``'s bytes when it lands (``cp.async.bulk.tensor.5d``);
- ``bulk_store(dst, src, nbytes)``: the bulk-copy unit writes ``nbytes`` (a multiple of 16, both addresses
  16-byte aligned) of shared memory to global memory, in the thread's bulk group; ``bulk_commit()`` closes
  the group, ``bulk_wait_read()`` waits until its groups have read shared memory, ``bulk_wait()`` until they
  have written global memory;
- ``load_shared_u128(addr)``: 16 bytes of shared memory (two uint64; ``load_shared_i128``: two int64);
  ``load_shared_u32(addr)``: 4 bytes, zero-extended;
- ``sync_warp()`` (``__syncwarp``); ``release(bar, lane)``: a consumer warp is done with a stage (its lanes
  meet, then lane 0 arrives; ``ARRIVALS_PER_WARP`` is what a warp adds to the count);
- ``ballot(predicate)``, ``broadcast(value)`` (lane 0's), ``count_set(mask)`` (``popc``), ``first_set(mask)``
  (``ffs``: 1 + the lowest set bit, 0 if none): the warp's votes and shuffles, on 32-bit masks.

On Numba's CUDA simulator the same names are Python twins (``kernels.simulator.tma``), chosen here once.
"""
from ..driver.target import SIMULATOR

__all__ = ["ARRIVALS_PER_WARP", "arrive", "arrive_expect_bytes", "ballot", "barrier_fence", "barrier_init",
           "barrier_inval", "broadcast", "bulk_commit", "bulk_store", "bulk_wait", "bulk_wait_read", "count_set",
           "expect_bytes", "first_set", "load_shared_i128", "load_shared_u128", "load_shared_u32", "release",
           "shared_address", "sync_warp", "tensor_load", "try_wait"]

if SIMULATOR:
    from .simulator.tma import (ARRIVALS_PER_WARP, arrive, arrive_expect_bytes, ballot, barrier_fence,  # noqa: F401
                                barrier_init, barrier_inval, broadcast, bulk_commit, bulk_store, bulk_wait,
                                bulk_wait_read, count_set, expect_bytes, first_set, load_shared_i128,
                                load_shared_u128, load_shared_u32, release, shared_address, sync_warp,
                                tensor_load, try_wait)
else:
    from llvmlite import ir
    from numba import cuda, int64, types, uint32
    from numba.cuda.extending import intrinsic

    from .jit import device_function
    from .memory import _PAIR, _asm

    ARRIVALS_PER_WARP = 1

    _I32, _I64 = ir.IntType(32), ir.IntType(64)

    def _u32(builder, value):  # shared-window addresses fit 32 bits, as PTX's "r" operands want
        return builder.trunc(value, _I32)

    def _instruction(text, operands=0):
        """An intrinsic ``op(*values)``: the PTX ``text`` alone, on ``operands`` (0 to 2) int64 values as 32-bit
        operands (shared-window addresses, counts, bytes)."""
        signature = types.void(*[types.int64] * operands)

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_u32(builder, a) for a in args], text,
                 ",".join(["r"] * operands + ["~{memory}"]))
            return context.get_dummy_value()

        def none(typingctx):  # a typer per arity: Numba lowers no intrinsic of *args
            return signature, codegen

        def one(typingctx, a):
            return signature, codegen

        def two(typingctx, a, b):
            return signature, codegen

        return intrinsic((none, one, two)[operands])

    @intrinsic
    def shared_address(typingctx, array):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            generic = builder.ptrtoint(data, _I64)
            return _asm(builder, _I64, [generic], "cvta.to.shared.u64 $0, $1;", "=l,l")

        return types.int64(array), codegen

    barrier_init = _instruction("mbarrier.init.shared::cta.b64 [$0], $1;", 2)
    barrier_inval = _instruction("mbarrier.inval.shared::cta.b64 [$0];", 1)
    barrier_fence = _instruction("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;")
    arrive = _instruction("mbarrier.arrive.shared::cta.b64 _, [$0];", 1)
    arrive_expect_bytes = _instruction("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", 2)
    expect_bytes = _instruction("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$0], $1;", 2)
    bulk_commit = _instruction("cp.async.bulk.commit_group;")
    bulk_wait_read = _instruction("cp.async.bulk.wait_group.read 0;")
    bulk_wait = _instruction("cp.async.bulk.wait_group 0;")

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

    def _load_shared_pair(word_type):
        pair_type = types.UniTuple(word_type, 2)

        @intrinsic
        def load_pair(typingctx, addr):
            def codegen(context, builder, sig, args):
                both = _asm(builder, _PAIR, [_u32(builder, args[0])], "ld.shared.v2.u64 {$0, $1}, [$2];", "=l,=l,r")
                parts = [builder.extract_value(both, 0), builder.extract_value(both, 1)]
                return context.make_tuple(builder, pair_type, parts)

            return pair_type(types.int64), codegen

        return load_pair

    load_shared_u128 = _load_shared_pair(types.uint64)
    load_shared_i128 = _load_shared_pair(types.int64)  # the same 16 bytes as two int64 (for arithmetic)

    @intrinsic
    def load_shared_u32(typingctx, addr):
        def codegen(context, builder, sig, args):
            value = _asm(builder, _I32, [_u32(builder, args[0])], "ld.shared.b32 $0, [$1];", "=r,r,~{memory}")
            return builder.zext(value, _I64)

        return types.int64(types.int64), codegen

    @device_function
    def sync_warp():
        cuda.syncwarp()

    @device_function
    def ballot(predicate):
        return int64(cuda.ballot_sync(0xFFFFFFFF, predicate)) & 0xFFFFFFFF

    @device_function
    def first_set(mask):
        return int64(cuda.ffs(uint32(mask)))

    @device_function
    def count_set(mask):
        return int64(cuda.popc(uint32(mask)))

    @device_function
    def broadcast(value):
        return cuda.shfl_sync(0xFFFFFFFF, int64(value), 0)

    @device_function
    def release(bar, lane):
        cuda.syncwarp()
        if lane == 0:
            arrive(bar)
