"""C functions called from compiled host code, and memory read there by address.

The copy-engine routes check a call's indices, write its copies and submit them in one ``numba.njit`` call
(``plan.direct_fill``), where a ctypes call costs about 1.5 us of argument conversion and each index tensor's
``.numpy()`` about 1 us. Two intrinsics make that possible without baking an address into the compiled code
(so it is cached on disk like any other pass):

- ``call_c(address, arguments)``: the C function at ``address`` (an int, as ``ctypes.cast(fn, c_void_p).value``
  gives it) called with ``arguments``, a tuple of 64-bit integers (pointers, sizes, handles: on x86-64 and
  AArch64 each goes in one integer register either way); its ``int`` result (``cudaError_t``, ``CUresult``),
  as int64;
- ``int64_view(address, count)``: ``count`` int64 values at ``address`` (a host tensor's ``data_ptr()``) as a
  NumPy array, valid while the memory is.
"""
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic


@intrinsic
def call_c(typingctx, address, arguments):
    if not (isinstance(address, types.Integer) and isinstance(arguments, types.BaseTuple)
            and all(isinstance(t, types.Integer) and t.bitwidth == 64 for t in arguments)):
        return None
    count = len(arguments)

    def codegen(context, builder, signature, args):
        word = ir.IntType(64)
        function_type = ir.FunctionType(ir.IntType(32), [word] * count)
        function = builder.inttoptr(args[0], function_type.as_pointer())
        result = builder.call(function, [builder.extract_value(args[1], i) for i in range(count)])
        return builder.sext(result, word)

    return types.int64(address, arguments), codegen


@intrinsic
def _int64_pointer(typingctx, address):
    if not isinstance(address, types.Integer):
        return None
    pointer = types.CPointer(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(address), codegen


@njit(inline="always")
def int64_view(address, count):
    return carray(_int64_pointer(address), count)
