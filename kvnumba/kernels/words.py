"""What the codec kernels need besides ``kernels.memory``: 4-byte loads and stores (codes move four to a word, a
scale is one float32), 8- and 16-byte stores, float32 bit casts and IEEE-rounded arithmetic on bits
(``f32_mul``, ``f32_div``), and a warp's shuffles and votes (``group_max`` over an aligned group of ``width``
lanes, ``lane_value``, ``warp_any``; every lane calls them, values below 2**31).

On the GPU: inline PTX (``ld.global.nc``, ``st.global.cg``, as ``kernels.memory``) and LLVM bit casts; on the
simulator their Python twins (``kernels.simulator.words``), chosen here once, at import. Integers are int64
throughout (a 4-byte load is zero-extended, a 4-byte store keeps the low 32 bits), so the kernels' arithmetic
never mixes signed and unsigned types. ``store_i128`` (16-byte aligned) writes whole 32-byte sectors where a
warp's 8-byte stores 16 or 32 bytes apart would write them in pieces; ``store_pair`` takes any 8-byte aligned
address.
"""
from ..driver.target import SIMULATOR
from .jit import device_function

__all__ = ["f32_bits", "f32_div", "f32_from_bits", "f32_mul", "group_max", "lane_value", "load_i32", "store_i32",
           "store_i64", "store_i128", "store_pair", "warp_any"]

if SIMULATOR:
    from .simulator.words import (f32_bits, f32_div, f32_from_bits, f32_mul, group_max,  # noqa: F401
                                       lane_value, load_i32, store_i32, store_i64, store_i128, warp_any)
else:
    from llvmlite import ir
    from numba import cuda, int32, int64, types
    from numba.cuda.extending import intrinsic

    _I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    @intrinsic
    def load_i32(typingctx, addr):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32.as_pointer()]), "ld.global.nc.b32 $0, [$1];", "=r,l")
            value = builder.call(asm, [builder.inttoptr(args[0], _I32.as_pointer())])
            return builder.zext(value, _I64)

        return types.int64(types.int64), codegen

    @intrinsic
    def store_i32(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32.as_pointer(), _I32]),
                               "st.global.cg.b32 [$0], $1;", "l,r,~{memory}", side_effect=True)
            builder.call(asm, [builder.inttoptr(args[0], _I32.as_pointer()), builder.trunc(args[1], _I32)])
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    @intrinsic
    def store_i64(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64.as_pointer(), _I64]),
                               "st.global.cg.b64 [$0], $1;", "l,l,~{memory}", side_effect=True)
            builder.call(asm, [builder.inttoptr(args[0], _I64.as_pointer()), args[1]])
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    @intrinsic
    def store_i128(typingctx, addr, low, high):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64.as_pointer(), _I64, _I64]),
                               "st.global.cg.v2.b64 [$0], {$1, $2};", "l,l,l,~{memory}", side_effect=True)
            builder.call(asm, [builder.inttoptr(args[0], _I64.as_pointer()), args[1], args[2]])
            return context.get_dummy_value()

        return types.void(types.int64, types.int64, types.int64), codegen

    @intrinsic
    def f32_bits(typingctx, x):
        def codegen(context, builder, sig, args):
            return builder.zext(builder.bitcast(args[0], _I32), _I64)

        return types.int64(types.float32), codegen

    @intrinsic
    def f32_from_bits(typingctx, bits):
        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.trunc(args[0], _I32), _F32)

        return types.float32(types.int64), codegen

    @device_function
    def group_max(lane, value, width):
        v = int32(value)  # one shuffle a step (an int64 takes two)
        step = width >> 1
        while step > 0:
            v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, step))
            step >>= 1
        return int64(v)

    @device_function
    def lane_value(lane, value, source):
        return int64(cuda.shfl_sync(0xFFFFFFFF, int32(value), source))

    @device_function
    def warp_any(lane, flag):
        return cuda.any_sync(0xFFFFFFFF, flag)

    @device_function
    def f32_mul(a_bits, b_bits):
        return f32_bits(f32_from_bits(a_bits) * f32_from_bits(b_bits))

    @device_function
    def f32_div(a_bits, b_bits):
        return f32_bits(f32_from_bits(a_bits) / f32_from_bits(b_bits))


@device_function
def store_pair(addr, low, high):
    """16 bytes at 8-byte aligned ``addr``, ``low`` first: one 16-byte store where ``addr`` allows."""
    if addr & 15 == 0:
        store_i128(addr, low, high)
    else:
        store_i64(addr, low)
        store_i64(addr + 8, high)
