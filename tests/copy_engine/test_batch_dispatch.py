"""The batch path's dispatch, with stand-in binding functions: no CUDA needed, runs everywhere.

A stand-in ``runtime`` module answers ``cudaMemcpyBatchAsync`` in the 12.x form ``(err, failIdx)``
or the 13.x form ``(err,)`` and records what it was given; its copies are ``ctypes.memmove`` on
plain NumPy buffers, so batched and page-by-page bytes can be compared.
"""
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

import kvnumba
from kvnumba import reference
from kvnumba.api import direct
from kvnumba.driver import batch_copy

rt = pytest.importorskip("cuda.bindings.runtime")

SUCCESS = rt.cudaError_t.cudaSuccess
INVALID = rt.cudaError_t.cudaErrorInvalidValue
NOT_SUPPORTED = rt.cudaError_t.cudaErrorNotSupported
NEWER_DRIVER = rt.cudaError_t.cudaErrorCallRequiresNewerDriver
SIZE_MAX = 2**64 - 1
STREAM = 0x5EED


class StandIn:
    """Enums and structs from the real binding; the calls kvnumba makes, recorded."""

    def __init__(self, major, answer=SUCCESS, fail_index=None, has_batch=True):
        self.major, self.answer, self.fail_index = major, answer, fail_index
        self.batches, self.copies = [], []
        for name in ("cudaMemcpyKind", "cudaMemcpyAttributes", "cudaMemcpySrcAccessOrder", "cudaMemLocationType",
                     "cudaError_t", "cudaGetErrorName"):
            setattr(self, name, getattr(rt, name))
        if has_batch:
            self.cudaMemcpyBatchAsync = self._batch

    def _batch(self, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream):
        self.batches.append(SimpleNamespace(dsts=dsts, srcs=srcs, sizes=sizes, count=count, attrs=attrs,
                                            attrs_idxs=attrs_idxs, num_attrs=num_attrs, stream=stream))
        if self.answer == SUCCESS:
            for d, s, n in zip(dsts, srcs, sizes):
                ctypes.memmove(d, s, n)
        fail = SIZE_MAX if self.fail_index is None else self.fail_index
        return (self.answer, fail) if self.major == 12 else (self.answer,)

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        self.copies.append((dst, src, count, stream))
        ctypes.memmove(dst, src, count)
        return (SUCCESS,)

    def cudaPointerGetAttributes(self, ptr):
        return (SUCCESS, SimpleNamespace(device=3))


@pytest.fixture
def use(batch_runtime):
    """use(major, ...) installs a stand-in runtime for the test and returns it."""
    def install(major, driver=13000, **kwargs):
        stand_in = StandIn(major, **kwargs)
        batch_runtime(batch_copy.CudaRuntime(stand_in, major, driver))
        return stand_in

    return install


def _lf_pf(mla=False, num_layers=3, page_size=4, pages=3, pool_pages=5, row=16, seed=0):
    """Plain NumPy lf->pf arguments (host memory on a GPU, never touched by CUDA here)."""
    rng = np.random.default_rng(seed)
    kinds = 1 if mla else 2
    src = [rng.integers(0, 256, (pool_pages * page_size, row), dtype=np.uint8) for _ in range(kinds * num_layers)]
    dst = [np.full((pool_pages, num_layers, page_size, row), 0xA5, np.uint8) for _ in range(kinds)]
    starts = rng.choice(pool_pages, pages, replace=False) * page_size
    s = (starts[:, None] + np.arange(page_size)).reshape(-1).astype(np.int64)
    d = (rng.choice(pool_pages, pages, replace=False)[:, None] * page_size + np.arange(page_size)).reshape(-1)
    return src, dst, s, d.astype(np.int64), page_size


def _expected_copies(src, dst, s, d, page_size):
    """The seed's page-by-page order: page, layer, K then V; addresses from the layout definitions."""
    kinds = len(dst)
    layers = len(src) // kinds
    row = src[0].shape[1]
    out = []
    for i in range(len(s) // page_size):
        tok, page = s[i * page_size], d[i * page_size] // page_size
        for j in range(layers):
            for kv in range(kinds):
                src_addr = src[kv * layers + j].ctypes.data + tok * row
                dst_addr = dst[kv].ctypes.data + (page * dst[kv].shape[1] + j) * page_size * row
                out.append((dst_addr, src_addr, page_size * row))
    return out


@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
@pytest.mark.parametrize("major", [12, 13])
def test_batch_arrays_and_bytes(use, major, mla):
    stand_in = use(major)
    src, dst, s, d, page_size = _lf_pf(mla=mla)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)
    assert direct.last_path() == "batch" and not stand_in.copies
    (call,) = stand_in.batches
    expected = _expected_copies(src, dst, s, d, page_size)
    assert call.count == len(expected) == 3 * 3 * (1 if mla else 2)
    assert list(zip(call.dsts, call.srcs, call.sizes)) == expected
    assert call.num_attrs == 1 and call.attrs_idxs == [0] and call.stream == STREAM
    (attrs,) = call.attrs
    assert attrs.srcAccessOrder == rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
    assert attrs.flags == 0
    # plain NumPy: "device" memory on the simulator (device 0: the plan knows it), host memory on a GPU
    on_device = batch_copy.SIMULATOR
    device_type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
    host_type = rt.cudaMemLocationType.cudaMemLocationTypeHost
    for hint in (attrs.srcLocHint, attrs.dstLocHint):
        assert hint.type == (device_type if on_device else host_type)
        assert hint.id == 0
    want = [a.copy() for a in dst]
    reference.transfer_kv_all_layer_direct_lf_pf(src, want, s, d, page_size)
    assert all(np.array_equal(a, b) for a, b in zip(dst, want))


@pytest.mark.parametrize("major", [12, 13])
def test_batched_bytes_equal_page_by_page_bytes(use, major):
    src, dst_batch, s, d, page_size = _lf_pf(page_size=2, pages=4, pool_pages=6, seed=4)
    dst_page = [a.copy() for a in dst_batch]
    batched = use(major)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst_batch, s, d, page_size, stream=STREAM)
    paged = use(major)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst_page, s, d, page_size, stream=0)
    assert batched.batches and not batched.copies and paged.copies and not paged.batches
    # the same copies, in the same order: destinations as (buffer, offset) since the buffers differ
    def located(addr, buffers):
        (k,) = [k for k, a in enumerate(buffers) if a.ctypes.data <= addr < a.ctypes.data + a.nbytes]
        return k, addr - buffers[k].ctypes.data

    call = batched.batches[0]
    assert [(located(dst, dst_batch), src, n) for dst, src, n in zip(call.dsts, call.srcs, call.sizes)] == \
        [(located(dst, dst_page), src, n) for dst, src, n, _ in paged.copies]
    assert all(np.array_equal(a, b) for a, b in zip(dst_batch, dst_page))


def test_pf_lf_batch_addresses(use):
    stand_in = use(13)
    rng = np.random.default_rng(2)
    page_size, layers, row = 4, 3, 8
    src = [rng.integers(0, 256, (5, layers, page_size, row), dtype=np.uint8) for _ in range(2)]
    dst = [np.zeros((20, row), np.uint8) for _ in range(2)]
    s = np.r_[8:12, 0:4].astype(np.int64)  # pages 2 and 0
    d = np.r_[12:16, 4:8].astype(np.int64)
    kvnumba.transfer_kv_per_layer_direct_pf_lf(src, dst, s, d, 1, page_size, stream=STREAM)
    (call,) = stand_in.batches
    slot = page_size * row
    expected = []
    for page, tok in ((2, 12), (0, 4)):
        for kv in range(2):
            expected.append((dst[kv].ctypes.data + tok * row, src[kv].ctypes.data + (page * layers + 1) * slot, slot))
    assert list(zip(call.dsts, call.srcs, call.sizes)) == expected
    assert np.array_equal(dst[0][12:16], src[0][2, 1]) and np.array_equal(dst[1][4:8], src[1][0, 1])


def test_error_names_failing_index_12x(use):
    use(12, answer=INVALID, fail_index=5)
    src, dst, s, d, page_size = _lf_pf()
    with pytest.raises(kvnumba.CopyError, match=r"failed at copy 5 of 18 .*cudaErrorInvalidValue") as info:
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)
    assert info.value.index == 5 and isinstance(info.value, RuntimeError)
    assert (info.value.code, info.value.call) == (int(INVALID), "cudaMemcpyBatchAsync")
    assert all((a == 0xA5).all() for a in dst)


def test_error_without_index_12x_size_max(use):
    use(12, answer=INVALID, fail_index=None)  # SIZE_MAX: the error is not about one copy
    src, dst, s, d, page_size = _lf_pf()
    with pytest.raises(kvnumba.CopyError, match=r"failIdx=18446744073709551615, not a single copy"):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)


def test_error_13x_has_no_index(use):
    use(13, answer=INVALID)
    src, dst, s, d, page_size = _lf_pf()
    with pytest.raises(kvnumba.CopyError, match=r"one of 18 copies \(this runtime does not report which\)"):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)


@pytest.mark.parametrize("major", [12, 13])
def test_wrong_return_form_is_an_error(use, major):
    stand_in = use(major)
    stand_in.cudaMemcpyBatchAsync = lambda *args: (SUCCESS, 0, 0)
    src, dst, s, d, page_size = _lf_pf()
    with pytest.raises(kvnumba.CopyError, match=rf"{major}.x cudaMemcpyBatchAsync returned 3 values"):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)


@pytest.mark.parametrize("answer", [NOT_SUPPORTED, NEWER_DRIVER], ids=["not-supported", "newer-driver"])
@pytest.mark.parametrize("major", [12, 13])
def test_unsupported_answer_falls_back(use, major, answer):
    stand_in = use(major, answer=answer)
    src, dst, s, d, page_size = _lf_pf()
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)
    assert len(stand_in.batches) == 1 and direct.last_path() == "page"
    assert [c[:3] for c in stand_in.copies] == _expected_copies(src, dst, s, d, page_size)
    assert all(c[3] == STREAM for c in stand_in.copies)
    want = [np.full_like(a, 0xA5) for a in dst]
    reference.transfer_kv_all_layer_direct_lf_pf(src, want, s, d, page_size)
    assert all(np.array_equal(a, b) for a, b in zip(dst, want))


@pytest.mark.parametrize("stream", [0, 1], ids=["default", "cudaStreamLegacy"])
def test_legacy_default_stream_falls_back(use, stream):
    stand_in = use(13)
    src, dst, s, d, page_size = _lf_pf()
    assert not batch_copy.batch_copy_available(stream) and batch_copy.batch_copy_available(STREAM)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=stream)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size)  # stream=None: the default stream
    assert not stand_in.batches and direct.last_path() == "page"
    assert len(stand_in.copies) == 2 * 18


@pytest.mark.parametrize("setup", [dict(driver=12070), dict(has_batch=False), dict(major=11)],
                         ids=["driver-12.7", "no-symbol", "binding-11"])
def test_no_batch_call_falls_back(use, setup):
    setup = dict(setup)
    stand_in = use(setup.pop("major", 13), **setup)
    assert not batch_copy.batch_copy_available(STREAM)
    src, dst, s, d, page_size = _lf_pf()
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)
    assert not stand_in.batches and len(stand_in.copies) == 18


def test_empty_transfer_submits_nothing(use):
    stand_in = use(13)
    src, dst, _, _, page_size = _lf_pf()
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, np.zeros(0, np.int64), np.zeros(0, np.int64), page_size,
                                               stream=STREAM)
    assert not stand_in.batches and not stand_in.copies


def test_direct_merges_runs_one_copy_per_run_per_layer_in_one_batch(use):
    stand_in = use(13)
    src = [np.arange(32 * 8, dtype=np.uint8).reshape(32, 8) + k for k in range(2)]
    dst = [np.zeros((32, 8), np.uint8) for _ in range(2)]
    s = np.array([0, 1, 2, 3, 10, 11, 5], np.int64)
    d = np.array([4, 5, 6, 7, 8, 9, 20], np.int64)
    kvnumba.transfer_kv_direct(src, dst, s, d, 1, stream=STREAM)
    # runs [0..3]->[4..7], [10,11]->[8,9], [5]->[20]; runs outer, layers inner, as in the seed; one batch
    expected = [(dst[j].ctypes.data + dt * 8, src[j].ctypes.data + st * 8, n * 8)
                for st, dt, n in ((0, 4, 4), (10, 8, 2), (5, 20, 1)) for j in range(2)]
    (batch,) = stand_in.batches
    assert list(zip(batch.dsts, batch.srcs, batch.sizes)) == expected and batch.stream == STREAM
    assert not stand_in.copies and direct.last_path() == "batch"
    want = [np.zeros_like(a) for a in dst]
    reference.transfer_kv_direct(src, want, s, d, 1)
    assert all(np.array_equal(a, b) for a, b in zip(dst, want))


def test_default_runtime_matches_target():
    runtime = batch_copy.runtime()
    if batch_copy.SIMULATOR:
        assert isinstance(runtime, batch_copy.SimulatorRuntime) and not batch_copy.batch_copy_available(STREAM)
    else:
        assert runtime.binding_major in (12, 13)


def test_route_is_checked():
    with pytest.raises(ValueError, match=r"batch copy route must be one of auto, cudart, bindings, page, got 'fast'"):
        batch_copy.make_runtime("fast")



def test_the_plans_batch_arrays_are_kept_and_grown(use):
    """A prepared plan fills one set of batch arrays in place: kept across calls, grown for a larger call."""
    stand_in = use(13)
    src, dst, s, d, page_size = _lf_pf(pages=30, pool_pages=40, seed=5)
    load = kvnumba.prepare(kvnumba.transfer_kv_all_layer_direct_lf_pf, src_ptrs=src, dst_ptrs=dst,
                           page_size=page_size)
    batch = load._plan.batch
    calls = [(s[:page_size], d[:page_size]), (s, d), (s[page_size:2 * page_size], d[page_size:2 * page_size])]
    arrays = []
    for si, di in calls:
        load(si, di, stream=STREAM)
        arrays.append(batch.out)
        call = stand_in.batches[-1]
        assert list(zip(call.dsts, call.srcs, call.sizes)) == _expected_copies(src, dst, si, di, page_size)
    assert arrays[0].shape[1] == 64 and arrays[1].shape[1] == 30 * 3 * 2 and arrays[2] is arrays[1]
    want = [np.full_like(a, 0xA5) for a in dst]
    reference.transfer_kv_all_layer_direct_lf_pf(src, want, s, d, page_size)
    assert all(np.array_equal(a, b) for a, b in zip(dst, want))


def test_a_bad_index_after_good_calls_writes_nothing(use):
    """The one pass refuses an out-of-range page with the usual message, and nothing is submitted."""
    stand_in = use(13)
    src, dst, s, d, page_size = _lf_pf(pages=3, pool_pages=5, seed=6)
    kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size, stream=STREAM)
    before = [a.copy() for a in dst]
    bad = d.copy()
    bad[2 * page_size] = 5 * page_size  # the third page's first slot: past the 5 pages
    with pytest.raises(kvnumba.IndexOutOfRangeError, match=rf"dst_indices\[{2 * page_size}\] = {5 * page_size} "
                                                           r"is out of range for the 5 pages of dst_ptrs"):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src, dst, s, bad, page_size, stream=STREAM)
    assert len(stand_in.batches) == 1 and all(np.array_equal(a, b) for a, b in zip(dst, before))
