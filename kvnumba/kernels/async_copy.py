"""Per-thread asynchronous copies from global into shared memory (``cp.async``, sm_80+), as the pipelined
FP8 load uses them (``kernels.dequantise_pipelined``): bytes in flight are held in shared memory, not capped
by a thread's registers. Shared addresses are shared-window addresses (``tma.shared_address``):

- ``copy4(shared, address)``, ``copy8(shared, address)``: one copy (``cp.async.ca``, aligned to its size);
- ``commit()`` closes the thread's copies since the last commit into a group; ``waiter(n)`` gives a
  ``wait()`` until at most the ``n`` newest groups are in flight;
- ``landed_arrive(bar)``: mbarrier ``bar``'s current phase waits for the thread's copies so far;
- ``load_shared_i64(shared)``, ``store_shared_i64(shared, value)``.

A wait covers the thread's own copies only: threads that read what another copied meet first. On the
simulator the names are twins (``kernels.simulator.async_copy``): a copy lands at once.
"""
import functools

from ..driver.target import SIMULATOR

__all__ = ["commit", "copy4", "copy8", "landed_arrive", "load_shared_i64", "store_shared_i64", "waiter"]

if SIMULATOR:
    from .simulator.async_copy import (commit, copy4, copy8, landed_arrive, load_shared_i64,  # noqa: F401
                                       store_shared_i64, waiter)
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .memory import _asm
    from .tma import _instruction, _u32

    _I64 = ir.IntType(64)

    def _copy(size):
        @intrinsic
        def copy(typingctx, shared, address):
            def codegen(context, builder, sig, args):
                _asm(builder, ir.VoidType(), [_u32(builder, args[0]), args[1]],
                     f"cp.async.ca.shared.global [$0], [$1], {size};", "r,l,~{memory}")
                return context.get_dummy_value()

            return types.void(types.int64, types.int64), codegen

        return copy

    copy4, copy8 = _copy(4), _copy(8)

    commit = _instruction("cp.async.commit_group;")
    landed_arrive = _instruction("cp.async.mbarrier.arrive.shared.b64 [$0];", 1)

    @functools.lru_cache(maxsize=None)
    def waiter(n):
        return _instruction(f"cp.async.wait_group {int(n)};")

    @intrinsic
    def load_shared_i64(typingctx, shared):
        def codegen(context, builder, sig, args):
            return _asm(builder, _I64, [_u32(builder, args[0])], "ld.shared.b64 $0, [$1];", "=l,r,~{memory}")

        return types.int64(types.int64), codegen

    @intrinsic
    def store_shared_i64(typingctx, shared, value):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_u32(builder, args[0]), args[1]], "st.shared.b64 [$0], $1;",
                 "r,l,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen
