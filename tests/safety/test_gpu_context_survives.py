"""Bad calls on a real GPU raise clear errors, and the CUDA context survives every one of them.

Each test makes a bad call (out-of-range indices in GPU memory, pageable host memory, bad raw layer
tables), expects its error, then runs a valid transfer checked against ``kvnumba.reference``: an
illegal-address fault would have killed the context, and that transfer would fail.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.checks import guard
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu

ITEM = 64  # bytes per item
POOL = 256  # token slots per buffer
LAYERS = 4


@pytest.fixture(autouse=True)
def clean_flag_then_live_context():
    """No earlier test's flag leaks in; after the test, a valid transfer still works, byte for byte."""
    guard.clear()
    yield
    torch.cuda.synchronize()
    assert_context_alive()


def assert_context_alive():
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.integers(0, 256, (POOL, ITEM), dtype=np.uint8)).cuda()
    dst = torch.zeros((POOL, ITEM), dtype=torch.uint8, device="cuda")
    si = torch.randperm(POOL, device="cuda")[:64]
    di = torch.randperm(POOL, device="cuda")[:64]
    kv.transfer_kv_per_layer_mla(src, dst, si, di, ITEM, check=True)
    want = np.zeros((POOL, ITEM), np.uint8)
    reference.transfer_kv_per_layer_mla(src.cpu().numpy(), want, si.cpu().numpy(), di.cpu().numpy(), ITEM)
    np.testing.assert_array_equal(dst.cpu().numpy(), want)


def gpu(values):
    return torch.tensor(values, dtype=torch.int64, device="cuda")


def mla_pair():
    return (torch.ones((POOL, ITEM), dtype=torch.uint8, device="cuda"),
            torch.zeros((POOL, ITEM), dtype=torch.uint8, device="cuda"))


def test_a_valid_transfer_works():
    assert_context_alive()


def test_out_of_range_gpu_indices_are_skipped_and_reported_by_check_errors():
    src, dst = mla_pair()
    kv.transfer_kv_per_layer_mla(src, dst, gpu([0, 1, 10**9, -5]), gpu([2, 3, 4, POOL]), ITEM)
    with pytest.raises(kv.IndexOutOfRangeError, match="earlier kvnumba transfer skipped"):
        kv.check_errors()
    got = dst.cpu().numpy()
    assert (got[2:4] == 1).all(), "the valid items were not copied"
    assert not got[:2].any() and not got[4:].any(), "a skipped item (or something else) was written"


def test_out_of_range_gpu_indices_raise_with_check():
    layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    host_pool = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8).pin_memory()
    with pytest.raises(kv.IndexOutOfRangeError, match=r"dst_indices\[3\] = 256 is out of range"):
        kv.transfer_kv_all_layer_mla_lf_pf(kv.layer_table(layers), host_pool, gpu(list(range(8))),
                                           gpu([0, 1, 2, POOL, 4, 5, 6, 7]), ITEM, LAYERS * ITEM, LAYERS, check=True)


def test_the_next_call_reports_an_earlier_violation_and_does_nothing():
    src, dst = mla_pair()
    kv.transfer_kv_per_layer_mla(src, dst, gpu([POOL + 1]), gpu([POOL + 1]), ITEM)
    torch.cuda.synchronize()
    with pytest.raises(kv.IndexOutOfRangeError, match="earlier kvnumba transfer"):
        kv.transfer_kv_per_layer_mla(src, dst, gpu([0]), gpu([0]), ITEM)
    torch.cuda.synchronize()
    assert not dst.cpu().numpy().any()


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_pageable_host_memory_is_refused_with_how_to_pin_it(kind):
    from numba import cuda

    if kind == "torch":
        src, dst, idx = torch.ones((POOL, ITEM), dtype=torch.uint8), mla_pair()[1], gpu(list(range(8)))  # not pinned
        match = r"src is a CPU torch tensor in pageable host memory.*pin_memory"
    else:
        src, dst = cuda.to_device(np.ones((POOL, ITEM), np.uint8)), np.zeros((POOL, ITEM), np.uint8)
        idx = cuda.to_device(np.arange(8, dtype=np.int64))
        match = r"dst is a NumPy array in pageable host memory.*pinned"
    with pytest.raises(kv.PageableMemoryError, match=match):
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM)


def test_registered_numpy_memory_is_accepted_and_written():
    from numba import cuda

    src = cuda.to_device(np.ones((POOL, ITEM), np.uint8))
    dst = np.zeros((POOL, ITEM), np.uint8)
    idx = cuda.to_device(np.arange(8, dtype=np.int64))
    with cuda.pinned(dst):
        kv.transfer_kv_per_layer_mla(src, dst, idx, idx, ITEM, check=True)
    assert (dst[:8] == 1).all() and not dst[8:].any()


def raw_table(layers):
    """A layer table made by hand, as SGLang's tests make them: not from kv.layer_table."""
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64, device="cuda")


def test_raw_table_over_too_small_layers_is_bounded_by_the_driver():
    from numba import cuda

    small = [cuda.device_array((4, ITEM), np.uint8) for _ in range(LAYERS)]  # exact cuMemAlloc sizes
    table = cuda.to_device(np.array([a.device_ctypes_pointer.value for a in small], np.uint64))
    dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device="cuda")
    idx = gpu([0, 3, 10**7])
    with pytest.raises(kv.IndexOutOfRangeError, match=r"src_indices\[2\] = 10000000 is out of range for src_layers"):
        kv.transfer_kv_all_layer_mla_lf_pf(table, dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS, check=True)


def test_raw_table_with_an_address_outside_any_allocation_is_refused():
    layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    addresses = [t.data_ptr() for t in layers]
    addresses[2] = 0x10000  # not an allocation
    dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device="cuda")
    idx = gpu(list(range(4)))
    with pytest.raises(kv.BadAddressError, match=r"src_layers\[2\] = 0x10000 is not in any allocation"):
        kv.transfer_kv_all_layer_mla_lf_pf(gpu(addresses), dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS, check=True)
    torch.cuda.synchronize()
    assert not dst.cpu().numpy().any()


def test_raw_table_of_pinned_host_layers():
    """The driver's range of a pinned host layer covers the layer, and a raw table of such layers is a
    valid destination."""
    from kvnumba.driver.pointers import allocation

    host_layers = [torch.zeros((POOL, ITEM), dtype=torch.uint8).pin_memory() for _ in range(LAYERS)]
    start, size, _ = allocation(host_layers[0].data_ptr())
    assert start + size >= host_layers[0].data_ptr() + POOL * ITEM, f"pinned range too short: {start:#x} + {size}"
    layers_gpu = [torch.ones((POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    idx = gpu(list(range(16)))
    kv.transfer_kv_all_layer_mla(kv.layer_table(layers_gpu), raw_table(host_layers), idx, idx, ITEM, LAYERS,
                                 check=True)
    for layer in host_layers:
        assert (layer[:16] == 1).all().item() and not layer[16:].any().item()


def test_raw_table_with_checks_off_copies_in_range_indices():
    layers = [torch.ones((POOL, ITEM), dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    dst = torch.zeros((POOL, LAYERS, ITEM), dtype=torch.uint8, device="cuda")
    idx = gpu(list(range(16)))
    kv.transfer_kv_all_layer_mla_lf_pf(raw_table(layers), dst, idx, idx, ITEM, LAYERS * ITEM, LAYERS)
    torch.cuda.synchronize()
    kv.check_errors()
    assert (dst[:16] == 1).all().item() and not dst[16:].any().item()
