# kvnumba.kernels.words's GPU names on numba-cuda-mlir: 4-, 8- and 16-byte PTX accesses through inline_ptx,
# float32 bit casts through mov.b32 (llvmlite's bitcast has no place on the MLIR path), shuffles as before.
from numba_cuda_mlir import cuda
from numba_cuda_mlir.cuda import experimental as _cx
from numba_cuda_mlir.numba_cuda.types import float32 as _float32, int32, int64

_device = cuda.jit(device=True, inline="always")


@_device
def load_i32(addr):
    return int64(_cx.inline_ptx("ld.global.nc.b32 %0, [%1];", "=r", 0, "l", addr)) & 0xFFFFFFFF


@_device
def store_i32(addr, value):
    _cx.inline_ptx("st.global.cg.b32 [%0], %1;", "l", addr, "r", value)


@_device
def store_i64(addr, value):
    _cx.inline_ptx("st.global.cg.b64 [%0], %1;", "l", addr, "l", int64(value))


@_device
def store_i128(addr, low, high):
    _cx.inline_ptx("st.global.cg.v2.b64 [%0], {%1, %2};", "l", addr, "l", int64(low), "l", int64(high))


@_device
def f32_bits(x):
    return int64(_cx.inline_ptx("mov.b32 %0, %1;", "=r", 0, "f", _float32(x))) & 0xFFFFFFFF


@_device
def f32_from_bits(bits):
    return _cx.inline_ptx("mov.b32 %0, %1;", "=f", 0.0, "r", bits)


@_device
def group_max(lane, value, width):
    v = int32(value)
    step = width >> 1
    while step > 0:
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, step))
        step >>= 1
    return int64(v)


@_device
def lane_value(lane, value, source):
    return int64(cuda.shfl_sync(0xFFFFFFFF, int32(value), source))


@_device
def warp_any(lane, flag):
    return cuda.any_sync(0xFFFFFFFF, flag)


@_device
def f32_mul(a_bits, b_bits):
    return f32_bits(f32_from_bits(a_bits) * f32_from_bits(b_bits))


@_device
def f32_div(a_bits, b_bits):
    return f32_bits(f32_from_bits(a_bits) / f32_from_bits(b_bits))
