"""A kernel's signals to other streams, at raw addresses of uint32 words (the resident loader's):

- ``arrive_u32(addr) -> old``: ``atom.global.add.u32`` of 1 (relaxed: the caller fences first);
- ``publish_u32(addr, value)``: ``atom.global.max.u32`` with release semantics at system scope. A maximum, not a
  store: the word only grows within a load, whichever block publishes last;
- ``acquire_u32(addr) -> value``: ``ld.acquire.sys.global.u32`` (what ``layer_wait`` polls); ``backoff()``: a
  short ``nanosleep`` between two polls;
- ``fence_system()``: ``__threadfence_system``, the thread's stores before it seen before its stores after it,
  by every observer (host memory too).

On the simulator the names are twins (``kernels.simulator.signals``), chosen here once.
"""
from ..driver.target import SIMULATOR

__all__ = ["acquire_u32", "arrive_u32", "backoff", "fence_system", "publish_u32"]

if SIMULATOR:
    from .simulator.signals import acquire_u32, arrive_u32, backoff, fence_system, publish_u32  # noqa: F401
else:
    from llvmlite import ir
    from numba import cuda, types
    from numba.cuda.extending import intrinsic

    _I32, _I64 = ir.IntType(32), ir.IntType(64)
    _U32_PTR = _I32.as_pointer()

    @intrinsic
    def arrive_u32(typingctx, addr):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_U32_PTR, _I32]), "atom.global.add.u32 $0, [$1], $2;",
                               "=r,l,r,~{memory}", side_effect=True)
            old = builder.call(asm, [builder.inttoptr(args[0], _U32_PTR), ir.Constant(_I32, 1)])
            return builder.zext(old, _I64)

        return types.int64(types.int64), codegen

    @intrinsic
    def publish_u32(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_U32_PTR, _I32]),
                               "red.release.sys.global.max.u32 [$0], $1;", "l,r,~{memory}", side_effect=True)
            builder.call(asm, [builder.inttoptr(args[0], _U32_PTR), builder.trunc(args[1], _I32)])
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    @intrinsic
    def acquire_u32(typingctx, addr):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_U32_PTR]), "ld.acquire.sys.global.u32 $0, [$1];",
                               "=r,l,~{memory}", side_effect=True)
            value = builder.call(asm, [builder.inttoptr(args[0], _U32_PTR)])
            return builder.zext(value, _I64)

        return types.int64(types.int64), codegen

    from .jit import device_function

    @device_function
    def backoff():
        cuda.nanosleep(500)  # a poll every ~0.5 us: a layer lands every ~tens of us

    @device_function
    def fence_system():
        cuda.threadfence_system()
