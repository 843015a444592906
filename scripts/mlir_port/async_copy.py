# kvnumba.kernels.async_copy's GPU names on numba-cuda-mlir (cp.async through inline_ptx).
import functools as _functools

from numba_cuda_mlir import cuda as _cuda
from numba_cuda_mlir.cuda import experimental as _cx
from numba_cuda_mlir.numba_cuda.types import int64 as _int64

_device = _cuda.jit(device=True, inline="always")


def _copy(size):
    text = f"cp.async.ca.shared.global [%0], [%1], {size};"

    @_device
    def copy(shared, address):
        _cx.inline_ptx(text, "r", shared, "l", address)

    return copy


copy4, copy8 = _copy(4), _copy(8)


@_device
def commit():
    _cx.inline_ptx("cp.async.commit_group;")


@_functools.lru_cache(maxsize=None)
def waiter(n):
    text = f"cp.async.wait_group {int(n)};"

    @_device
    def wait():
        _cx.inline_ptx(text)

    return wait


@_device
def landed_arrive(bar):
    _cx.inline_ptx("cp.async.mbarrier.arrive.shared.b64 [%0];", "r", bar)


@_device
def load_shared_i64(shared):
    return _int64(_cx.inline_ptx("ld.shared.b64 %0, [%1];", "=l", 0, "r", shared))


@_device
def store_shared_i64(shared, value):
    _cx.inline_ptx("st.shared.b64 [%0], %1;", "r", shared, "l", value)
