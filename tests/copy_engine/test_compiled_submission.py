"""The copy-engine entry points' compiled submission (``plan.direct_fill.submit_pages``/``submit_runs``): one
compiled call checks the stream, fills the copies and calls ``cudaMemcpyBatchAsync`` by address.

Here the C functions it calls are ctypes callbacks standing in for libcudart and libcuda: the batch moves the
bytes with ``ctypes.memmove`` (so the copies are checked byte for byte against the reference), the capture
query and the current context answer what a test sets. No CUDA needed: runs on the simulator and on a GPU
(where the buffers are NumPy host arrays, untouched by the GPU).
"""
import ctypes

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import errors, reference
from kvnumba.api import direct
from kvnumba.driver import batch_copy

rt = pytest.importorskip("cuda.bindings.runtime")

STREAM, CONTEXT = 0x5EED, 0xC0C0
NOT_SUPPORTED, INVALID = 801, 1
WORD = ctypes.c_uint64


class StandInLibraries:
    """libcudart's and libcuda's functions as C callbacks, and what they were asked."""

    def __init__(self, version, answer=0, fail_index=None):
        self.version, self.answer, self.fail_index = version, answer, fail_index
        self.capturing, self.context = set(), CONTEXT
        self.batches, self.copies = [], []
        words = 9 if version < 13000 else 8
        self._batch = ctypes.CFUNCTYPE(ctypes.c_int, *[WORD] * words)(self._on_batch)
        self._is_capturing = ctypes.CFUNCTYPE(ctypes.c_int, WORD, WORD)(self._on_is_capturing)
        self._current = ctypes.CFUNCTYPE(ctypes.c_int, WORD)(self._on_current)
        self.cudaMemcpyBatchAsync = self._batch  # what CudartBatch loads (the ctypes call, on the plain path)

    def cudaRuntimeGetVersion(self, ref):
        ref._obj.value = self.version
        return 0

    def _on_batch(self, dsts, srcs, sizes, count, attrs, attrs_index, num_attrs, *rest):
        stream = rest[-1]
        self.batches.append((count, stream, num_attrs))
        if self.answer == 0:
            for i in range(count):
                ctypes.memmove(*(ctypes.c_int64.from_address(a + 8 * i).value for a in (dsts, srcs, sizes)))
        if len(rest) == 2 and self.fail_index is not None:  # CUDA 12's size_t* failIdx
            ctypes.c_uint64.from_address(rest[0]).value = self.fail_index
        return self.answer

    def _on_is_capturing(self, stream, status):
        ctypes.c_int.from_address(status).value = int(stream in self.capturing)
        return 0

    def _on_current(self, context):
        ctypes.c_uint64.from_address(context).value = self.context
        return 0

    def calls(self):
        address = batch_copy._function_address
        return batch_copy.NativeCalls(address(self._batch), address(self._is_capturing), address(self._current),
                                      lambda device: CONTEXT)


class Binding:
    """What ``CudaRuntime`` needs of cuda-bindings' runtime module, and its page copies (``memmove``)."""

    def __init__(self):
        for name in ("cudaMemcpyKind", "cudaMemcpyAttributes", "cudaMemcpySrcAccessOrder", "cudaMemLocationType",
                     "cudaError_t", "cudaGetErrorName"):
            setattr(self, name, getattr(rt, name))
        self.copies = []

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        self.copies.append((dst, src, count))
        ctypes.memmove(dst, src, count)
        return (rt.cudaError_t.cudaSuccess,)


@pytest.fixture
def native(batch_runtime, monkeypatch):
    """``native(version, ...)``: stand-in libraries behind a runtime whose calls take the compiled submission;
    ``libraries.plain`` counts the submissions by the plain path (``PreparedBatch.submit``) instead."""
    def install(version=13000, **kwargs):
        libraries = StandInLibraries(version, **kwargs)
        cudart = batch_copy.CudartBatch(libraries, rt)
        cudart.native = libraries.calls()
        binding = Binding()
        batch_runtime(batch_copy.CudaRuntime(binding, 13, 13000, cudart))
        libraries.binding, libraries.plain = binding, []
        submit = batch_copy.PreparedBatch.submit

        def counted(batch, count, stream):
            libraries.plain.append(count)
            return submit(batch, count, stream)

        monkeypatch.setattr(batch_copy.PreparedBatch, "submit", counted)
        return libraries

    return install


def _pools(kinds=2, layers=3, page=4, pages=6, row=24, seed=0):
    rng = np.random.default_rng(seed)
    host = [rng.integers(0, 256, (pages, layers, page, row), dtype=np.uint8) for _ in range(kinds)]
    gpu = [np.full((pages * page, row), 0xA5, np.uint8) for _ in range(kinds * layers)]
    return host, gpu


def _pages(rng, pages, count, page):
    chosen = rng.choice(pages, count, replace=False)
    return (chosen[:, None] * page + np.arange(page)).reshape(-1).astype(np.int64)


@pytest.mark.parametrize("version", [12080, 13000])
@pytest.mark.parametrize("kinds", [2, 1], ids=["kv", "mla"])
def test_a_per_layer_load_is_one_compiled_submission(native, version, kinds):
    libraries = native(version)
    host, gpu = _pools(kinds)
    rng = np.random.default_rng(1)
    s, d = _pages(rng, 6, 3, 4), _pages(rng, 6, 3, 4)
    dst = [gpu[0], gpu[3]] if kinds == 2 else [gpu[0]]
    expected = [x.copy() for x in dst]
    reference.transfer_kv_per_layer_direct_pf_lf(host, expected, s, d, 1, 4)
    kv.transfer_kv_per_layer_direct_pf_lf(host, dst, s, d, 1, 4, stream=STREAM)
    assert all(np.array_equal(a, b) for a, b in zip(dst, expected))
    assert libraries.batches == [(3 * kinds, STREAM, 1)] and not libraries.binding.copies
    assert not libraries.plain and direct.last_path() == "batch"


@pytest.mark.parametrize("version", [12080, 13000])
def test_an_all_layer_backup_and_a_run_copy_are_compiled_submissions(native, version):
    libraries = native(version)
    rng = np.random.default_rng(2)
    layers = [rng.integers(0, 256, (24, 40), dtype=np.uint8) for _ in range(6)]
    pools = [np.full((6, 3, 4, 40), 0x5A, np.uint8) for _ in range(2)]
    s, d = _pages(rng, 6, 2, 4), _pages(rng, 6, 2, 4)
    expected = [p.copy() for p in pools]
    reference.transfer_kv_all_layer_direct_lf_pf(layers, expected, s, d, 4)
    kv.transfer_kv_all_layer_direct_lf_pf(layers, pools, s, d, 4, stream=STREAM)
    assert all(np.array_equal(a, b) for a, b in zip(pools, expected))
    assert libraries.batches == [(2 * 3 * 2, STREAM, 1)]

    dst = [np.full((24, 40), 0x11, np.uint8) for _ in range(2)]
    runs_s = np.array([0, 1, 2, 9, 5, 6], np.int64)
    runs_d = np.array([3, 4, 5, 0, 20, 21], np.int64)
    expected = [x.copy() for x in dst]
    reference.transfer_kv_direct(layers[:2], expected, runs_s, runs_d, 2)
    kv.transfer_kv_direct(layers[:2], dst, runs_s, runs_d, 2, stream=STREAM)
    assert all(np.array_equal(a, b) for a, b in zip(dst, expected))
    assert libraries.batches[-1] == (3 * 2, STREAM, 1)  # three runs, two layers
    assert not libraries.plain


@pytest.mark.parametrize("which", ["src_indices", "dst_indices"])
def test_bad_indices_are_named_and_nothing_is_submitted(native, which):
    libraries = native()
    host, gpu = _pools()
    s, d = np.arange(8, dtype=np.int64), np.arange(8, dtype=np.int64)
    (s if which == "src_indices" else d)[4] = 10_000
    before = [x.copy() for x in gpu]
    with pytest.raises(errors.IndexOutOfRangeError, match=which):
        kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 0, 4, stream=STREAM)
    with pytest.raises(errors.IndexOutOfRangeError, match=which):
        kv.transfer_kv_direct(gpu[:2], gpu[2:4], s, d, 4, stream=STREAM)
    assert not libraries.batches and all(np.array_equal(a, b) for a, b in zip(gpu, before))


def test_a_capturing_stream_is_refused_before_anything_is_submitted(native, monkeypatch):
    from kvnumba.driver import capture

    libraries = native()
    libraries.capturing.add(STREAM)
    monkeypatch.setattr(capture, "capturing", lambda handle: handle == STREAM)  # the plain path's query, agreeing
    host, gpu = _pools()
    s = d = np.arange(8, dtype=np.int64)
    with pytest.raises(errors.CaptureError):
        kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 0, 4, stream=STREAM)
    assert not libraries.batches and (gpu[0] == 0xA5).all()


def test_another_context_current_takes_the_plain_path(native):
    libraries = native()
    libraries.context = CONTEXT + 1
    host, gpu = _pools()
    s = d = np.arange(8, dtype=np.int64)
    expected = [gpu[0].copy(), gpu[3].copy()]
    reference.transfer_kv_per_layer_direct_pf_lf(host, expected, s, d, 2, 4)
    kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 2, 4, stream=STREAM)
    assert np.array_equal(gpu[0], expected[0]) and np.array_equal(gpu[3], expected[1])
    assert libraries.batches == [(4, STREAM, 1)] and libraries.plain == [4]  # the ctypes call, on the plain path


def test_an_unsupported_batch_goes_page_by_page(native):
    libraries = native(answer=NOT_SUPPORTED)
    host, gpu = _pools()
    s, d = np.arange(8, dtype=np.int64), np.arange(4, 12, dtype=np.int64)
    expected = [gpu[0].copy(), gpu[3].copy()]
    reference.transfer_kv_per_layer_direct_pf_lf(host, expected, s, d, 0, 4)
    kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 0, 4, stream=STREAM)
    assert np.array_equal(gpu[0], expected[0]) and np.array_equal(gpu[3], expected[1])
    assert len(libraries.batches) == 1 and len(libraries.binding.copies) == 4 and direct.last_path() == "page"
    assert not libraries.plain


@pytest.mark.parametrize("version, named", [(12080, "at copy 3 of 4"), (13000, "does not report which")])
def test_a_failed_batch_raises_naming_the_copy(native, version, named):
    native(version, answer=INVALID, fail_index=3)
    host, gpu = _pools()
    s = d = np.arange(8, dtype=np.int64)
    with pytest.raises(errors.CopyError, match=named):
        kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 0, 4, stream=STREAM)


def test_torch_host_indices_are_read_in_place(native):
    """SGLang's host indices are CPU tensors: read by address in the compiled pass, never copied."""
    torch = pytest.importorskip("torch")
    libraries = native()
    host, gpu = _pools()
    rng = np.random.default_rng(3)
    s, d = _pages(rng, 6, 2, 4), _pages(rng, 6, 2, 4)
    expected = [gpu[0].copy(), gpu[3].copy()]
    reference.transfer_kv_per_layer_direct_pf_lf(host, expected, s, d, 1, 4)
    kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], torch.from_numpy(s), torch.from_numpy(d), 1, 4,
                                          stream=STREAM)
    assert np.array_equal(gpu[0], expected[0]) and np.array_equal(gpu[3], expected[1])
    assert libraries.batches == [(4, STREAM, 1)] and not libraries.plain
    d[0] = -1
    with pytest.raises(errors.IndexOutOfRangeError, match="dst_indices"):
        kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], torch.from_numpy(s), torch.from_numpy(d), 1, 4,
                                              stream=STREAM)
    assert len(libraries.batches) == 1


def test_strided_host_indices_are_refused_and_nothing_is_submitted(native):
    """The compiled pass reads ``count`` contiguous int64 at an array's address: a strided index array must never
    get there (it is refused, naming it, as before)."""
    libraries = native()
    host, gpu = _pools()
    s = np.repeat(np.arange(4, 12, dtype=np.int64), 2)[::2]
    d = np.arange(8, dtype=np.int64)
    with pytest.raises(ValueError, match="src_indices must be C-contiguous"):
        kv.transfer_kv_per_layer_direct_pf_lf(host, [gpu[0], gpu[3]], s, d, 0, 4, stream=STREAM)
    assert not libraries.batches and not libraries.plain and (gpu[0] == 0xA5).all()
