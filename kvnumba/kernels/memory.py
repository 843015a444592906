"""Loads and stores at raw integer addresses: the only place kvnumba touches memory in a kernel.

On the GPU these are inline-PTX intrinsics with the seed's cache hints: loads are ``ld.global.nc``
(read-only path: the source does not change during a copy), stores ``st.global.cg`` (cache at L2 only:
the destination is not read back). On Numba's CUDA simulator the same names are Python twins
(``kernels.simulator.memory``), chosen here once, so kernel bodies are identical in both worlds.

    load_u64(addr) -> uint64            store_u64(addr, value)
    load_u128(addr) -> (lo, hi)         store_u128(addr, pair)
    load_i64(addr) -> int64             load_i128(addr) -> (lo, hi) as int64 (the FP8 kernels' arithmetic)
    make_loads(qualifier) -> (load_u64, load_u128) with other ld.global qualifiers
"""
from ..driver.target import SIMULATOR

__all__ = ["load_i64", "load_i128", "load_u64", "load_u128", "make_loads", "store_u64", "store_u128"]

if SIMULATOR:
    from .simulator.memory import load_i64, load_i128, load_u64, load_u128, make_loads, store_u64, store_u128  # noqa: F401
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)
    _PAIR = ir.LiteralStructType([_I64, _I64])

    def _asm(builder, ret, args, text, constraints, side_effect=True):
        """A call of the inline PTX ``text`` on ``args`` (LLVM values), returning ``ret``: every intrinsic's."""
        kind = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(kind, text, constraints, side_effect=side_effect), args)

    def _pointer(builder, address):
        return builder.inttoptr(address, _I64.as_pointer())

    def _load(instruction, element, pair, side_effect):
        """An intrinsic ``load(addr)``: 8 bytes by ``instruction`` as one ``element`` value, or, with ``pair``, 16
        bytes (a ``.v2`` instruction) as two; ``side_effect``: volatile (see below)."""
        result = types.UniTuple(element, 2) if pair else element

        def typer(typingctx, addr):
            def codegen(context, builder, sig, args):
                operands, constraints = ("{$0, $1}, [$2]", "=l,=l,l") if pair else ("$0, [$1]", "=l,l")
                value = _asm(builder, _PAIR if pair else _I64, [_pointer(builder, args[0])],
                             f"{instruction} {operands};", constraints, side_effect)
                if not pair:
                    return value
                return context.make_tuple(builder, result, [builder.extract_value(value, i) for i in (0, 1)])

            return result(types.int64), codegen

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
        if qualifier not in _loads:
            _loads[qualifier] = (_load(f"ld.global.{qualifier}.b64", types.uint64, False, True),
                                 _load(f"ld.global.{qualifier}.v2.u64", types.uint64, True, True))
        return _loads[qualifier]

    load_u64, load_u128 = make_loads("nc")
    load_i64 = _load("ld.global.nc.b64", types.int64, False, False)  # pure: indices and tables do not change
    load_i128 = _load("ld.global.nc.v2.b64", types.int64, True, False)

    @intrinsic
    def store_u64(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_pointer(builder, args[0]), args[1]], "st.global.cg.b64 [$0], $1;",
                 "l,l,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.uint64), codegen

    @intrinsic
    def store_u128(typingctx, addr, pair):
        def codegen(context, builder, sig, args):
            lo, hi = (builder.extract_value(args[1], i) for i in (0, 1))
            _asm(builder, ir.VoidType(), [_pointer(builder, args[0]), lo, hi], "st.global.cg.v2.u64 [$0], {$1, $2};",
                 "l,l,l,~{memory}")
            return context.get_dummy_value()

        return types.void(types.int64, types.UniTuple(types.uint64, 2)), codegen
