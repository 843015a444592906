# kvnumba.kernels.memory's GPU names as numba-cuda-mlir device functions around its inline_ptx (operands
# %0.. in pair order, "=" outputs returned). llvmlite's InlineAsm has no place on the MLIR path.
from numba_cuda_mlir import cuda as _cuda
from numba_cuda_mlir.cuda import experimental as _cx
from numba_cuda_mlir.numba_cuda.types import int64 as _int64, uint64 as _uint64

_device = _cuda.jit(device=True, inline="always")
_loads: dict = {}


def make_loads(qualifier="nc"):
    if qualifier in _loads:
        return _loads[qualifier]
    one = f"ld.global.{qualifier}.b64 %0, [%1];"
    two = f"ld.global.{qualifier}.v2.u64 {{%0, %1}}, [%2];"

    @_device
    def load_u64(addr):
        return _uint64(_cx.inline_ptx(one, "=l", 0, "l", addr))

    @_device
    def load_u128(addr):
        lo, hi = _cx.inline_ptx(two, "=l", 0, "=l", 0, "l", addr)
        return _uint64(lo), _uint64(hi)

    _loads[qualifier] = (load_u64, load_u128)
    return load_u64, load_u128


load_u64, load_u128 = make_loads("nc")


@_device
def store_u64(addr, value):
    _cx.inline_ptx("st.global.cg.b64 [%0], %1;", "l", addr, "l", _int64(value))


@_device
def store_u128(addr, pair):
    _cx.inline_ptx("st.global.cg.v2.u64 [%0], {%1, %2};", "l", addr, "l", _int64(pair[0]), "l", _int64(pair[1]))


@_device
def load_i64(addr):
    return _int64(_cx.inline_ptx("ld.global.nc.b64 %0, [%1];", "=l", 0, "l", addr))


@_device
def load_i128(addr):
    lo, hi = _cx.inline_ptx("ld.global.nc.v2.b64 {%0, %1}, [%2];", "=l", 0, "=l", 0, "l", addr)
    return _int64(lo), _int64(hi)
