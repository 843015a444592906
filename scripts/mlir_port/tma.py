# kvnumba.kernels.tma's GPU names on numba-cuda-mlir: the same PTX through inline_ptx; a shared array's
# address through numba_cuda_mlir.types.ptr (there is no llvmlite array model to take .data from).
from numba_cuda_mlir import cuda as _cuda
from numba_cuda_mlir import types as _mtypes
from numba_cuda_mlir.cuda import experimental as _cx
from numba_cuda_mlir.numba_cuda.types import int64 as _int64, uint32 as _uint32, uint64 as _uint64

_device = _cuda.jit(device=True, inline="always")
ARRIVALS_PER_WARP = 1


@_device
def shared_address(array):
    return _int64(_cx.inline_ptx("cvta.to.shared.u64 %0, %1;", "=l", 0, "C", _mtypes.ptr(array)))


def _barrier_op(ptx):
    @_device
    def op(bar, value):
        _cx.inline_ptx(ptx, "r", bar, "r", value)

    return op


barrier_init = _barrier_op("mbarrier.init.shared::cta.b64 [%0], %1;")
arrive_expect_bytes = _barrier_op("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;")
expect_bytes = _barrier_op("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;")


@_device
def barrier_fence():
    _cx.inline_ptx("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;")


@_device
def barrier_inval(bar):
    _cx.inline_ptx("mbarrier.inval.shared::cta.b64 [%0];", "r", bar)


@_device
def arrive(bar):
    _cx.inline_ptx("mbarrier.arrive.shared::cta.b64 _, [%0];", "r", bar)


@_device
def try_wait(bar, parity):
    done = _cx.inline_ptx("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                          "selp.b32 %0, 1, 0, p;\n\t}", "=r", 0, "r", bar, "r", parity)
    return _int64(done)


@_device
def tensor_load(dst, tensor_map, c0, c1, c2, c3, c4, bar):
    _cx.inline_ptx("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                   "[%0], [%1, {%2, %3, %4, %5, %6}], [%7];", "r", dst, "l", tensor_map, "r", c0, "r", c1, "r", c2,
                   "r", c3, "r", c4, "r", bar)


@_device
def bulk_store(dst, src, nbytes):
    _cx.inline_ptx("fence.proxy.async.shared::cta;\n\tcp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;",
                   "l", dst, "r", src, "r", nbytes)


@_device
def bulk_commit():
    _cx.inline_ptx("cp.async.bulk.commit_group;")


@_device
def bulk_wait_read():
    _cx.inline_ptx("cp.async.bulk.wait_group.read 0;")


@_device
def bulk_wait():
    _cx.inline_ptx("cp.async.bulk.wait_group 0;")


@_device
def load_shared_u128(addr):
    lo, hi = _cx.inline_ptx("ld.shared.v2.u64 {%0, %1}, [%2];", "=l", 0, "=l", 0, "r", addr)
    return _uint64(lo), _uint64(hi)


@_device
def load_shared_i128(addr):
    lo, hi = _cx.inline_ptx("ld.shared.v2.u64 {%0, %1}, [%2];", "=l", 0, "=l", 0, "r", addr)
    return _int64(lo), _int64(hi)


@_device
def load_shared_u32(addr):
    value = _cx.inline_ptx("ld.shared.b32 %0, [%1];", "=r", 0, "r", addr)
    return _int64(value) & 0xFFFFFFFF


@_device
def sync_warp():
    _cuda.syncwarp()


@_device
def ballot(predicate):
    return _int64(_cuda.ballot_sync(0xFFFFFFFF, predicate)) & 0xFFFFFFFF


@_device
def first_set(mask):
    return _int64(_cuda.ffs(_uint32(mask)))


@_device
def count_set(mask):
    return _int64(_cuda.popc(_uint32(mask)))


@_device
def broadcast(value):
    return _cuda.shfl_sync(0xFFFFFFFF, _int64(value), 0)


@_device
def release(bar, lane):
    _cuda.syncwarp()
    if lane == 0:
        arrive(bar)
