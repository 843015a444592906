"""Issue 6 on a real GPU: bad inputs raise, and the CUDA context survives every one of them.

    python scripts/gpu_safety_check.py            # needs a CUDA GPU, torch with CUDA, numba-cuda

Each check makes a bad call (out-of-range indices in GPU memory, pageable host memory, bad raw
layer tables), expects a clear error, then runs a valid transfer and compares it with
``kvnumba.reference``: an illegal-address fault would have killed the context and that transfer
would fail. Prints a PASS/FAIL table and the measured host cost of the checks; exits 1 on a failure.
"""
import sys
import time
import traceback

import numpy as np

ITEM = 64  # bytes per item
POOL = 256  # token slots per buffer
LAYERS = 4


def _setup():
    import torch
    from numba import cuda

    import kvnumba
    from kvnumba import reference

    if not torch.cuda.is_available():
        sys.exit("gpu_safety_check: needs a CUDA GPU and torch with CUDA")
    return torch, cuda, kvnumba, reference


def main():
    torch, cuda, kv, reference = _setup()
    from kvnumba.checks import guard, pinned
    from kvnumba.arrays import array_info
    from kvnumba.errors import BadAddressError, IndexOutOfRangeError, PageableMemoryError

    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    results = []

    def record(name, fn):
        start = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as error:  # noqa: BLE001 - a check's failure is a FAIL row, not a crash
            ok, detail = False, f"{type(error).__name__}: {error}"
            traceback.print_exc()
        results.append((name, ok, detail, time.perf_counter() - start))

    def expect(error_type, pattern, call):
        import re

        try:
            call()
        except error_type as error:
            if not re.search(pattern, str(error)):
                raise AssertionError(f"message {str(error)!r} does not match {pattern!r}") from None
            return f"{type(error).__name__}: {str(error)[:90]}"
        raise AssertionError(f"no {error_type.__name__} raised")

    def valid_transfer():
        """A valid per-layer D2D transfer, checked byte for byte: the context still works."""
        src = torch.from_numpy(rng.integers(0, 256, (POOL, ITEM), dtype=np.uint8)).to(dev)
        dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev)
        si = torch.randperm(POOL, device=dev)[:64].to(torch.int64)
        di = torch.randperm(POOL, device=dev)[:64].to(torch.int64)
        kv.transfer_kv_per_layer_mla(src, dst, si, di, ITEM, check=True)
        want = np.zeros((POOL, ITEM), np.uint8)
        reference.transfer_kv_per_layer_mla(src.cpu().numpy(), want, si.cpu().numpy(), di.cpu().numpy(), ITEM)
        torch.cuda.synchronize()
        if not np.array_equal(dst.cpu().numpy(), want):
            raise AssertionError("valid transfer after the bad call does not match the reference")

    def then_valid(fn):
        def run():
            detail = fn()
            valid_transfer()
            return detail
        return run

    # 1. out-of-range device indices, no check: the kernel skips and flags; check_errors raises.
    def device_indices_deferred():
        src = torch.ones((POOL, ITEM), dtype=torch.uint8, device=dev)
        dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev)
        si = torch.tensor([0, 1, 10**9, -5], dtype=torch.int64, device=dev)
        di = torch.tensor([2, 3, 4, POOL], dtype=torch.int64, device=dev)
        kv.transfer_kv_per_layer_mla(src, dst, si, di, ITEM)
        detail = expect(IndexOutOfRangeError, "earlier kvnumba transfer skipped", kv.check_errors)
        got = dst.cpu().numpy()
        if not (got[2] == 1).all() or not (got[3] == 1).all() or got[4].any() or got[5:].any() or got[:2].any():
            raise AssertionError("the valid items were not copied exactly (or a skipped one was)")
        return detail

    # 2. the same with check=True (torch CUDA indices, all-layer page-first backup).
    def device_indices_checked():
        layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
        table = kv.layer_table(layers)
        host_pool = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8).pin_memory()
        si = torch.arange(8, dtype=torch.int64, device=dev)
        di = torch.tensor([0, 1, 2, POOL, 4, 5, 6, 7], dtype=torch.int64, device=dev)
        return expect(IndexOutOfRangeError, r"dst_indices\[3\] = 256 is out of range",
                      lambda: kv.transfer_kv_all_layer_mla_lf_pf(table, host_pool, si, di, ITEM, LAYERS * ITEM, LAYERS,
                                                                 check=True))

    # 3. the next call reports an earlier unchecked violation.
    def next_call_reports():
        src = torch.ones((POOL, ITEM), dtype=torch.uint8, device=dev)
        dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev)
        bad = torch.tensor([POOL + 1], dtype=torch.int64, device=dev)
        kv.transfer_kv_per_layer_mla(src, dst, bad, bad, ITEM)
        torch.cuda.synchronize()
        ok = torch.tensor([0], dtype=torch.int64, device=dev)
        return expect(IndexOutOfRangeError, "earlier kvnumba transfer",
                      lambda: kv.transfer_kv_per_layer_mla(src, dst, ok, ok, ITEM))

    # 4. a pageable (not pinned) CPU tensor and NumPy array as a kernel's host buffer.
    def pageable_tensor():
        src = torch.ones((POOL, ITEM), dtype=torch.uint8)  # not pinned
        dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev)
        idx = torch.arange(8, dtype=torch.int64, device=dev)
        return expect(PageableMemoryError, r"src is a CPU torch tensor in pageable host memory.*pin_memory",
                      lambda: kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM))

    def pageable_numpy():
        src = cuda.to_device(np.ones((POOL, ITEM), np.uint8))
        dst = np.zeros((POOL, ITEM), np.uint8)  # pageable
        idx = cuda.to_device(np.arange(8, dtype=np.int64))
        return expect(PageableMemoryError, r"dst is a NumPy array in pageable host memory.*pinned",
                      lambda: kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM))

    def registered_numpy_accepted():
        src = cuda.to_device(np.ones((POOL, ITEM), np.uint8))
        dst = np.zeros((POOL, ITEM), np.uint8)
        idx = cuda.to_device(np.arange(8, dtype=np.int64))
        with cuda.pinned(dst):
            kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, check=True)
        if not (dst[:8] == 1).all() or dst[8:].any():
            raise AssertionError("registered host destination not written as expected")
        return "cuda.pinned(arr) registered memory accepted and written"

    # 5. raw layer tables (user-made uint64 arrays): sizes from the driver with check=True.
    def raw_table(layers):
        return torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64, device=dev)

    def raw_table_too_small():
        small = [cuda.device_array((4, ITEM), np.uint8) for _ in range(LAYERS)]  # exact cuMemAlloc sizes
        table = cuda.to_device(np.array([a.device_ctypes_pointer.value for a in small], np.uint64))
        dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device=dev)
        idx = torch.tensor([0, 3, 10**7], dtype=torch.int64, device=dev)
        return expect(IndexOutOfRangeError, r"src_indices\[2\] = 10000000 is out of range for src_layers",
                      lambda: kv.transfer_kv_all_layer_mla_lf_pf(table, dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS,
                                                                 check=True))

    def raw_table_garbage_address():
        layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
        addresses = [t.data_ptr() for t in layers]
        addresses[2] = 0x10000  # not an allocation
        table = torch.tensor(addresses, dtype=torch.int64, device=dev)
        dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device=dev)
        idx = torch.arange(4, dtype=torch.int64, device=dev)
        return expect(BadAddressError, r"src_layers\[2\] = 0x10000 is not in any allocation",
                      lambda: kv.transfer_kv_all_layer_mla_lf_pf(table, dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS,
                                                                 check=True))

    def raw_table_pinned_host_range():
        host_layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8).pin_memory() for _ in range(LAYERS)]
        from kvnumba.driver.pointers import allocation

        start, size, _ = allocation(host_layers[0].data_ptr())
        if start + size < host_layers[0].data_ptr() + POOL * ITEM:
            raise AssertionError(f"pinned host range too short: start 0x{start:x} size {size}")
        layers_dev = [torch.ones((POOL, ITEM), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
        idx = torch.arange(16, dtype=torch.int64, device=dev)
        kv.transfer_kv_all_layer_mla(kv.layer_table(layers_dev), raw_table(host_layers), idx, idx, ITEM, LAYERS,
                                     check=True)  # device -> pinned host layers through a raw table
        if not all((t[:16] == 1).all().item() and not t[16:].any().item() for t in host_layers):
            raise AssertionError("device -> pinned host layers through a raw table: wrong bytes")
        return f"driver range of a pinned host layer: {size} bytes (need {POOL * ITEM})"

    def raw_table_unchecked_valid():
        layers = [torch.ones((POOL, ITEM), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
        dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device=dev)
        idx = torch.arange(16, dtype=torch.int64, device=dev)
        kv.transfer_kv_all_layer_mla_lf_pf(raw_table(layers), dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS)
        torch.cuda.synchronize()
        kv.check_errors()
        if not (dst[:16] == 1).all().item() or dst[16:].any().item():
            raise AssertionError("raw table transfer (checks off) wrong")
        return "raw table, checks off, in-range indices: copied"

    checks = [
        ("device indices out of range, deferred (check_errors)", device_indices_deferred),
        ("device indices out of range, check=True", device_indices_checked),
        ("next call reports an earlier violation", next_call_reports),
        ("pageable CPU torch tensor", pageable_tensor),
        ("pageable NumPy array", pageable_numpy),
        ("cuda.pinned(arr) NumPy accepted", registered_numpy_accepted),
        ("raw table, layers too small (check=True)", raw_table_too_small),
        ("raw table, garbage address (check=True)", raw_table_garbage_address),
        ("raw table of pinned host layers (check=True)", raw_table_pinned_host_range),
        ("raw table, checks off, valid", raw_table_unchecked_valid),
    ]
    record("valid transfer before anything", valid_transfer)
    for name, fn in checks:
        guard.clear()
        record(name, then_valid(fn))

    # Host cost of the checks per call: an entry point against the unchecked launcher, same launch.
    def host_cost():
        src = torch.ones((POOL, ITEM), dtype=torch.uint8, device=dev)
        dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device=dev)
        pool = torch.zeros((POOL, ITEM), dtype=torch.uint8).pin_memory()
        pinned_np = cuda.pinned_array((POOL, ITEM), np.uint8)
        idx = torch.arange(32, dtype=torch.int64, device=dev)

        def per_call(fn, n=2000):
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = (time.perf_counter() - start) / n
            torch.cuda.synchronize()
            return elapsed * 1e6

        prepared = kv.prepare(kv.transfer_kv_per_layer_mla, src=src, dst=dst, item_size=ITEM)
        base = per_call(lambda: prepared(idx, idx))
        full = per_call(lambda: kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM))
        h2d = per_call(lambda: kv.transfer_kv_per_layer_mla(pool, dst, idx, idx, ITEM))
        torch_pin = per_call(lambda: pinned.require("x", array_info(pool, "x")), 20000)
        numpy_pin = per_call(lambda: pinned.require("x", array_info(pinned_np, "x")), 20000)
        flag = per_call(guard.raise_pending, 20000)
        checked = per_call(lambda: kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, check=True), 500)
        return (f"per call: prepared {base:.1f} us, entry point D2D {full:.1f} us (+{full - base:.1f}), "
                f"H2D pinned torch {h2d:.1f} us; pinned.require torch {torch_pin:.2f} us, NumPy {numpy_pin:.2f} us; "
                f"flag read {flag:.2f} us; check=True {checked:.1f} us")

    record("host cost of the checks (measured)", host_cost)
    record("context alive at the end", lambda: (torch.cuda.synchronize(), valid_transfer())[1])

    width = max(len(name) for name, *_ in results)
    failed = 0
    for name, ok, detail, seconds in results:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name:<{width}}  {seconds * 1e3:7.1f} ms  {detail}")
    print(f"\n{len(results) - failed}/{len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
