"""A probe of the FP8 load's design, on a GPU (sm_90) only: 8192 tokens of 8 heads of 128 FP8 codes and their
scales in pinned host memory, dequantised into bfloat16 in GPU memory by a kernel whose lanes bring codes and
scales into a per-warp ring in shared memory by ``cp.async`` (``S`` stages) and convert them with
``kernels.fp8``'s instructions. Every variant is checked bit for bit (modes 0-2) before it is timed.

Modes (what a lane stores):
    0: 16 codes, four 8-byte stores 32 bytes apart from the next lane's (as the wide kernel did)
    1: 16 codes, two 16-byte stores
    2: two granules of 8 codes, lanes side by side: a warp's 16-byte stores are contiguous
    3: mode 2's reads and stores without the conversion (its output is not checked)

    python scripts/fp8_async_probe.py             # the modes above
    python scripts/fp8_async_probe.py --shared    # mode 2 asking for more shared memory than it uses (less L1)

Results: scripts/RESULTS.md (H200, 2026-12-02); kvnumba.kernels.dequantise_pipelined is the kernel built from it.
It ran at ``40a35eb`` with its own copies of the inline PTX below; since then it takes them from
``kernels.async_copy`` and ``kernels.words`` and issues a pass from one device function, and its mode 0
spells out the 8-byte stores the packed ``store_chunk`` made then. Its kernels' PTX is the same as it
was, modulo names (compared by compiling both for sm_90).
"""

import sys

import ml_dtypes
import numpy as np
from cuda.bindings import driver as cu
from llvmlite import ir
from numba import cuda, int64, types
from numba.cuda.extending import intrinsic

from kvnumba.kernels.async_copy import commit, copy4, copy8, waiter
from kvnumba.kernels.words import store_i64, store_i128
from kvnumba.kernels.fp8 import ops
from kvnumba.kernels.jit import device_function
from kvnumba.kernels.tma import load_shared_i128, load_shared_u32, shared_address

deq4 = ops("e4m3", "bfloat16").dequantise4


@intrinsic
def cp16(typingctx, dst, src):
    """16 bytes by ``cp.async.cg`` (L2 only): the one copy ``kernels.async_copy`` does not have."""
    def codegen(context, builder, sig, args):
        operands = [builder.trunc(args[0], ir.IntType(32)), args[1]]
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [a.type for a in operands]),
                           "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}", side_effect=True)
        builder.call(asm, operands)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


def make(S, slots, mode=0):
    """The probe kernel for ``S`` stages, ``slots`` 16-code pieces a lane a pass and ``mode``, and its dynamic
    shared memory a block (1024 threads)."""
    wait = waiter(S - 1)
    stage_bytes = slots * 512 + slots * 256

    @device_function
    def issue(st, p, lane, src, scales):
        for s in range(slots):
            c = (p * slots + s) * 32 + lane
            if mode >= 2:
                g0 = (p * slots + s) * 64 + lane
                copy8(st + s * 512 + lane * 16, src + g0 * 8)
                copy8(st + s * 512 + lane * 16 + 8, src + (g0 + 32) * 8)
                copy4(st + slots * 512 + s * 256 + lane * 4, scales + (g0 >> 4) * 4)
                copy4(st + slots * 512 + s * 256 + 128 + lane * 4, scales + ((g0 + 32) >> 4) * 4)
            else:
                cp16(st + s * 512 + lane * 16, src + c * 16)
                copy4(st + slots * 512 + s * 256 + lane * 4, scales + (c >> 3) * 4)

    @cuda.jit("void(int64, int64, int64, int64)", max_registers=64)
    def k(src, scales, out, npasses):
        smem = cuda.shared.array(0, int64)
        lane = cuda.threadIdx.x & 31
        wib = cuda.threadIdx.x >> 5
        warps = cuda.gridDim.x * (cuda.blockDim.x >> 5)
        warp = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + wib
        ring = shared_address(smem) + wib * S * stage_bytes
        mine = (npasses - warp + warps - 1) // warps
        for i in range(S - 1):
            if i < mine:
                issue(ring + i * stage_bytes, warp + i * warps, lane, src, scales)
            commit()
        q = 0
        slot_issue = S - 1
        slot_use = 0
        while q < mine:
            i = q + S - 1
            if i < mine:
                issue(ring + slot_issue * stage_bytes, warp + i * warps, lane, src, scales)
            commit()
            wait()
            p = warp + q * warps
            st = ring + slot_use * stage_bytes
            for s in range(slots):
                c = (p * slots + s) * 32 + lane
                lo, hi = load_shared_i128(st + s * 512 + lane * 16)
                sc = load_shared_u32(st + slots * 512 + s * 256 + lane * 4)
                sc2 = load_shared_u32(st + slots * 512 + s * 256 + 128 + lane * 4)
                if mode == 0:
                    store_i64(out + c * 32, deq4(lo, sc))
                    store_i64(out + c * 32 + 8, deq4(lo >> 32, sc))
                    store_i64(out + c * 32 + 16, deq4(hi, sc))
                    store_i64(out + c * 32 + 24, deq4(hi >> 32, sc))
                elif mode == 1:
                    store_i128(out + c * 32, deq4(lo, sc), deq4(lo >> 32, sc))
                    store_i128(out + c * 32 + 16, deq4(hi, sc), deq4(hi >> 32, sc))
                elif mode == 3:
                    g0 = (p * slots + s) * 64 + lane
                    store_i128(out + g0 * 16, lo, sc)
                    store_i128(out + (g0 + 32) * 16, hi, sc2)
                else:  # two 8-code granules, lanes side by side
                    g0 = (p * slots + s) * 64 + lane
                    store_i128(out + g0 * 16, deq4(lo, sc), deq4(lo >> 32, sc))
                    store_i128(out + (g0 + 32) * 16, deq4(hi, sc2), deq4(hi >> 32, sc2))
            slot_issue = slot_issue + 1 if slot_issue + 1 < S else 0
            slot_use = slot_use + 1 if slot_use + 1 < S else 0
            q += 1

    return k, S * stage_bytes * 32


def allow_shared(k, shm):
    """Lets ``k`` ask for ``shm`` bytes of dynamic shared memory (more than 48 KB must be asked for)."""
    handle = int(next(iter(k.overloads.values()))._codelibrary.get_cufunc().handle)
    err, = cu.cuKernelSetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   shm, cu.CUkernel(handle), cu.CUdevice(0))
    assert err == cu.CUresult.CUDA_SUCCESS, err


def _buffers():
    """The probe's data: 8192 tokens of 8 heads of 128 codes (no NaN code) and their scales in pinned host memory,
    a GPU buffer for the bfloat16, the kernels' arguments, the chunk count and the bytes expected."""
    chunks = 8192 * 128  # 16-code chunks: 8192 tokens of 8 heads of 128, K and V
    rng = np.random.default_rng(0)
    values = rng.integers(0, 256, chunks * 16, dtype=np.uint8)
    values[(values & 0x7F) == 0x7F] = 0x3C  # no NaN codes: the probe has no exact path
    codes = cuda.pinned_array(values.shape, np.uint8)
    codes[:] = values
    scales = cuda.pinned_array(chunks // 8, np.float32)
    scales[:] = rng.uniform(0.001, 2, chunks // 8).astype(np.float32)
    out = cuda.device_array(chunks * 32, np.uint8)
    want = (values.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(-1, 128) * scales[:, None])
    want = want.astype(ml_dtypes.bfloat16).view(np.uint8).reshape(-1)
    args = (codes.ctypes.data, scales.ctypes.data, out.__cuda_array_interface__["data"][0])
    return (codes, scales), out, args, chunks, want


def _gbps(launch, args, passes, chunks):
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(20):
        launch(*args, passes)
    end.record()
    end.synchronize()
    return chunks * 32 / (cuda.event_elapsed_time(start, end) / 20) / 1e6


def main():
    pinned, out, args, chunks, want = _buffers()  # pinned: the host buffers, alive while the kernels read them
    print("mode  S slots  bq  GB/s bf16   link ok")
    for S, slots, mode in ((4, 2, 0), (4, 2, 1), (4, 2, 2), (4, 2, 3), (8, 1, 2), (2, 2, 2), (2, 1, 2)):
        k, shm = make(S, slots, mode)
        allow_shared(k, shm)
        passes = chunks // (32 * slots)
        for bq in (2, 4):
            launch = k[bq, 1024, 0, shm]
            launch(*args, passes)
            cuda.synchronize()
            ok = np.array_equal(out.copy_to_host(), want)
            gbps = _gbps(launch, args, passes, chunks)
            print(f"mode {mode} {S:>2} {slots:>5} {bq:>3} {gbps:10.1f} {gbps / 2 * (1 + 4 / 256):6.1f} {ok}",
                  flush=True)


def shared_sweep():
    """Mode 2 (S=2, 2 slots: 96 KiB of shared memory a block) launched asking for more dynamic shared memory than
    it uses: what the L1 left beside shared memory does to the asynchronous copies from host memory."""
    pinned, out, args, chunks, want = _buffers()  # pinned: the host buffers, alive while the kernels read them
    k, shm = make(2, 2, 2)
    passes = chunks // 64
    for asked in (shm, 132 * 1024, 164 * 1024, 200 * 1024, 227 * 1024):
        allow_shared(k, asked)
        for bq in (2, 4):
            launch = k[bq, 1024, 0, asked]
            launch(*args, passes)
            cuda.synchronize()
            assert np.array_equal(out.copy_to_host(), want)
            print(f"probe mode 2 S=2 slots=2 shared asked {asked // 1024:4d} KiB (uses {shm // 1024}) bq={bq}: "
                  f"{_gbps(launch, args, passes, chunks):6.1f} GB/s of bf16", flush=True)


if __name__ == "__main__":
    shared_sweep() if "--shared" in sys.argv[1:] else main()
