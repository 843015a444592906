"""Loads and stores at raw integer addresses: the only place kvnumba touches memory in a kernel.

On the GPU these are inline-PTX intrinsics with the seed's cache hints: loads are
``ld.global.nc`` (read-only, non-coherent path: the source does not change during a copy) and
stores are ``st.global.cg`` (cache at L2 only: the destination is not read back by this kernel).
16-byte forms (``.v2.u64``) are used when addresses and sizes allow.

On Numba's CUDA simulator the same names are plain Python functions reading and writing through
ctypes (``kernels.simulator.memory``, chosen here once, at import), so the kernel bodies are identical in
both worlds.

Names:
    load_u64(addr) -> uint64            store_u64(addr, value)
    load_u128(addr) -> (lo, hi)         store_u128(addr, pair)
    load_i64(addr) -> int64             (indices and layer-table entries)
    load_i128(addr) -> (lo, hi)         16 bytes as two int64 (the FP8 kernels' arithmetic is on int64)
    make_loads(qualifier) -> (load_u64, load_u128) with other ld.global qualifiers
"""
from ..driver.target import SIMULATOR

__all__ = ["load_i64", "load_i128", "load_u64", "load_u128", "make_loads", "store_u64", "store_u128"]

# One world, chosen once: the Python twins on the simulator, else the inline PTX below.
if SIMULATOR:
    from .simulator.memory import load_i64, load_i128, load_u64, load_u128, make_loads, store_u64, store_u128  # noqa: F401
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)
    _I64_PTR = _I64.as_pointer()
    _PAIR = ir.LiteralStructType([_I64, _I64])

    def _pointer(builder, address):
        return builder.inttoptr(address, _I64_PTR)

    def _pair_load(instruction, element, side_effect):
        """An intrinsic ``load(addr) -> (lo, hi)``: 16 bytes by one ``instruction`` (``ld.global...v2...``), as two
        ``element`` values; ``side_effect``: volatile (see below)."""
        pair_type = types.UniTuple(element, 2)

        def typer(typingctx, addr):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(_PAIR, [_I64_PTR]), f"{instruction} {{$0, $1}}, [$2];", "=l,=l,l",
                                   side_effect=side_effect)
                both = builder.call(asm, [_pointer(builder, args[0])])
                parts = [builder.extract_value(both, 0), builder.extract_value(both, 1)]
                return context.make_tuple(builder, pair_type, parts)

            return pair_type(types.int64), codegen

        return intrinsic(typer)

    # Loads and stores are volatile: the compiler keeps them in program order, so the copy loop's
    # explicit batch of loads-then-stores is what decides the bytes in flight. Pure loads let it
    # hoist loads of unrolled iterations above earlier stores, which spilled registers.
    _loads: dict[str, tuple] = {}

    def make_loads(qualifier="nc"):
        """``(load_u64, load_u128)`` with PTX qualifiers ``qualifier`` (``ld.global.<qualifier>``).

        ``"nc"`` is the seed's read-only path; prefetch-size forms such as ``"nc.L2::256B"`` ask the
        memory system for whole 256-byte sectors, which suits streaming a large item.
        """
        if qualifier in _loads:
            return _loads[qualifier]

        @intrinsic
        def load_u64(typingctx, addr):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(_I64, [_I64_PTR]), f"ld.global.{qualifier}.b64 $0, [$1];",
                                   "=l,l", side_effect=True)
                return builder.call(asm, [_pointer(builder, args[0])])

            return types.uint64(types.int64), codegen

        load_u128 = _pair_load(f"ld.global.{qualifier}.v2.u64", types.uint64, side_effect=True)
        _loads[qualifier] = (load_u64, load_u128)
        return load_u64, load_u128

    load_u64, load_u128 = make_loads("nc")

    @intrinsic
    def store_u64(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [_I64_PTR, _I64]),
                "st.global.cg.b64 [$0], $1;",
                "l,l,~{memory}",
                side_effect=True,
            )
            builder.call(asm, [_pointer(builder, args[0]), args[1]])
            return context.get_dummy_value()

        return types.void(types.int64, types.uint64), codegen

    @intrinsic
    def store_u128(typingctx, addr, pair):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [_I64_PTR, _I64, _I64]),
                "st.global.cg.v2.u64 [$0], {$1, $2};",
                "l,l,l,~{memory}",
                side_effect=True,
            )
            lo = builder.extract_value(args[1], 0)
            hi = builder.extract_value(args[1], 1)
            builder.call(asm, [_pointer(builder, args[0]), lo, hi])
            return context.get_dummy_value()

        return types.void(types.int64, types.UniTuple(types.uint64, 2)), codegen

    @intrinsic
    def load_i64(typingctx, addr):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I64, [_I64_PTR]), "ld.global.nc.b64 $0, [$1];", "=l,l")
            return builder.call(asm, [_pointer(builder, args[0])])

        return types.int64(types.int64), codegen

    load_i128 = _pair_load("ld.global.nc.v2.b64", types.int64, side_effect=False)  # pure, as load_i64
