"""The three copy-engine entry points against the NumPy reference, every destination byte compared.

Simulator: copies are ``ctypes.memmove`` (the page-by-page path). GPU: the same cases with Numba
device arrays and pinned host arrays, on the default stream (page by page) and on a side stream
(the real ``cudaMemcpyBatchAsync`` where the driver has it).
"""
import numpy as np
import pytest

import kvnumba
from kvnumba import reference
from kvnumba.api import direct
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import PLACE, device, host, to_numpy

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset

POISON = 0xA5


def side_stream():
    """A non-legacy stream: a Numba stream on the GPU; any handle but 0/1 on the simulator."""
    if SIMULATOR:
        return 7
    from numba import cuda

    return cuda.stream()


STREAMS = {"default": lambda: None, "side": side_stream}


def _random(rng, shape, dtype):
    return rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype).reshape(shape)


def _poisoned(shape, dtype):
    return np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, POISON, np.uint8).view(dtype).reshape(shape)


def _check(dst_placed, dst_expected):
    for i, (got, want) in enumerate(zip(dst_placed, dst_expected)):
        got = to_numpy(got)
        assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes(), f"destination {i} differs"


def _pages(rng, num_pages_pool, count_pages, page_size, aligned=True, pool_tokens=None):
    """Index array of count_pages pages: page starts drawn without repeats, P consecutive tokens each."""
    if aligned:
        starts = rng.choice(num_pages_pool, size=count_pages, replace=False) * page_size
    else:  # any start with room for a page (layer-first side only reads the first index)
        starts = rng.choice(pool_tokens - page_size + 1, size=count_pages, replace=False)
    return (starts[:, None] + np.arange(page_size)[None, :]).reshape(-1).astype(np.int64)


# ---------------------------------------------------------------- transfer_kv_direct

def _direct_case(src_idx, dst_idx, *, num_layers=3, rows=40, token_shape=(2, 4), dtype=np.float16, page_size=1,
                 src_place="host", dst_place="device", index_place="host", stream="default", seed=0):
    rng = np.random.default_rng(seed)
    src = [_random(rng, (rows, *token_shape), dtype) for _ in range(num_layers)]
    dst = [_poisoned((rows, *token_shape), dtype) for _ in range(num_layers)]
    src_places = src_place if isinstance(src_place, tuple) else (src_place,)  # a tuple: layer by layer, in turn
    src_placed = [PLACE[src_places[i % len(src_places)]](a) for i, a in enumerate(src)]
    dst_placed = [PLACE[dst_place](a) for a in dst]
    s, d = np.asarray(src_idx, np.int64), np.asarray(dst_idx, np.int64)
    kvnumba.transfer_kv_direct(src_placed, dst_placed, PLACE[index_place](s), PLACE[index_place](d), page_size,
                               stream=STREAMS[stream]())
    reference.transfer_kv_direct(src, dst, s, d, page_size)
    _check(dst_placed, dst)


@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("index_place", ["host", "device"])
@pytest.mark.parametrize("src_place,dst_place", [("host", "device"), ("device", "host"), ("device", "device")])
def test_direct_scattered(src_place, dst_place, index_place, stream):
    rng = np.random.default_rng(1)
    s, d = rng.choice(40, 12, replace=False), rng.choice(40, 12, replace=False)
    _direct_case(s, d, src_place=src_place, dst_place=dst_place, index_place=index_place, stream=stream)


@pytest.mark.parametrize("page_size", [1, 2, 4, 8])
def test_direct_runs_merge(page_size):
    # runs of 8, one broken only on the destination side, one only on the source side
    s = np.r_[0:8, 16:24, 30:38]
    d = np.r_[10:18, 2:6, 7:11, 20:28]
    _direct_case(s, d, page_size=page_size)


@pytest.mark.parametrize("dtype,token_shape", [(np.uint8, (8,)), (np.float32, (3, 2)), (np.uint16, (1, 576))])
def test_direct_dtypes_and_rows(dtype, token_shape):
    _direct_case(np.arange(6)[::-1], np.arange(6) + 3, dtype=dtype, token_shape=token_shape, num_layers=2)


def test_direct_records_its_path():
    _direct_case([3, 4], [5, 6], stream="default")
    assert direct.last_path() == "page"  # legacy default stream: never the batch call


def test_direct_mixing_host_and_gpu_layers_goes_copy_by_copy():
    """One location hint serves a side's copies: a side of host and GPU layers is copied one by one."""
    _direct_case([3, 4], [5, 6], src_place=("host", "device"))


def test_direct_no_tokens_and_no_layers():
    _direct_case([], [], page_size=4)  # destinations compared with the reference's: untouched
    before = direct.path_counts(), direct.last_path()
    no_tokens = np.zeros(0, np.int64)
    assert kvnumba.transfer_kv_direct([], [], no_tokens, no_tokens, 1) is None
    assert kvnumba.transfer_kv_direct([], [], np.arange(2), np.arange(2), 2) is None  # tokens, but no layers
    assert (direct.path_counts(), direct.last_path()) == before  # no copy was submitted


# ---------------------------------------------------------------- page-first-direct

def _pf_case(op, *, mla=False, page_size=4, count_pages=3, num_layers=3, pool_pages=6, token_shape=(2, 8),
             dtype=np.float16, lf_place=None, pf_place=None, index_place="host", stream="default", layer_id=None,
             lf_layers=None, aligned=True, seed=0):
    rng = np.random.default_rng(seed)
    lf_to_pf = op == "transfer_kv_all_layer_direct_lf_pf"
    lf_place = lf_place or ("device" if lf_to_pf else "device")
    pf_place = pf_place or "host"
    kinds = 1 if mla else 2
    pool_tokens = pool_pages * page_size
    lf_layers = lf_layers if lf_layers is not None else (num_layers if lf_to_pf else 1)
    pf_shape = (pool_pages, num_layers, page_size, *token_shape)
    lf_shape = (pool_tokens, *token_shape)
    lf_tokens = _pages(rng, pool_pages, count_pages, page_size, aligned=aligned, pool_tokens=pool_tokens)
    pf_tokens = _pages(rng, pool_pages, count_pages, page_size)
    if lf_to_pf:
        src = [_random(rng, lf_shape, dtype) for _ in range(kinds * lf_layers)]
        dst = [_poisoned(pf_shape, dtype) for _ in range(kinds)]
        s, d = lf_tokens, pf_tokens
        src_placed, dst_placed = [PLACE[lf_place](a) for a in src], [PLACE[pf_place](a) for a in dst]
    else:
        src = [_random(rng, pf_shape, dtype) for _ in range(kinds)]
        dst = [_poisoned(lf_shape, dtype) for _ in range(kinds * lf_layers)]
        s, d = pf_tokens, lf_tokens
        src_placed, dst_placed = [PLACE[pf_place](a) for a in src], [PLACE[lf_place](a) for a in dst]
    si, di = PLACE[index_place](s), PLACE[index_place](d)
    if lf_to_pf:
        kvnumba.transfer_kv_all_layer_direct_lf_pf(src_placed, dst_placed, si, di, page_size, stream=STREAMS[stream]())
        reference.transfer_kv_all_layer_direct_lf_pf(src, dst, s, d, page_size)
    else:
        layer_id = num_layers - 1 if layer_id is None else layer_id
        kvnumba.transfer_kv_per_layer_direct_pf_lf(src_placed, dst_placed, si, di, layer_id, page_size,
                                                   stream=STREAMS[stream]())
        reference.transfer_kv_per_layer_direct_pf_lf(src, dst, s, d, layer_id, page_size)
    _check(dst_placed, dst)


PF_OPS = ["transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf"]


@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("index_place", ["host", "device"])
@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
@pytest.mark.parametrize("op", PF_OPS)
def test_page_first_direct(op, mla, index_place, stream):
    _pf_case(op, mla=mla, index_place=index_place, stream=stream)


@pytest.mark.parametrize("page_size", [1, 2, 16, 128])
@pytest.mark.parametrize("op", PF_OPS)
def test_page_first_direct_page_sizes(op, page_size):
    _pf_case(op, page_size=page_size, count_pages=2, pool_pages=3, num_layers=2, token_shape=(8,), dtype=np.uint8)


@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
@pytest.mark.parametrize("op", PF_OPS)
def test_page_first_direct_directions(op, mla):
    _pf_case(op, mla=mla, lf_place="host", pf_place="device")
    _pf_case(op, mla=mla, lf_place="device", pf_place="device", seed=2)


@pytest.mark.parametrize("op", PF_OPS)
def test_page_first_direct_unaligned_layer_first_pages(op):
    # the layer-first side reads P rows from whatever its first index is
    _pf_case(op, aligned=False, page_size=4, seed=5)


def test_per_layer_several_layers_and_layer_ids():
    for layer_id in (0, 1):
        _pf_case("transfer_kv_per_layer_direct_pf_lf", lf_layers=2, num_layers=3, layer_id=layer_id)


def test_all_layer_fewer_layers_than_buffer():
    _pf_case("transfer_kv_all_layer_direct_lf_pf", lf_layers=2, num_layers=3)


def test_mla_item_1152_bytes():
    _pf_case("transfer_kv_all_layer_direct_lf_pf", mla=True, token_shape=(1, 576), dtype=np.uint16, page_size=2)
    _pf_case("transfer_kv_per_layer_direct_pf_lf", mla=True, token_shape=(1, 576), dtype=np.uint16, page_size=2)


@pytest.mark.parametrize("op", PF_OPS)
def test_page_first_direct_no_tokens(op):
    _pf_case(op, count_pages=0)


def test_last_path_is_recorded():
    _pf_case("transfer_kv_all_layer_direct_lf_pf", stream="default")
    assert direct.last_path() == "page"  # legacy default stream: never the batch call
    counts = direct.path_counts()
    assert counts["page"] >= 1 and set(counts) == {"batch", "page"}


# ---------------------------------------------------------------- validation

def _lf_pf_args(**override):
    lf = [device(np.arange(16 * 8, dtype=np.uint8).reshape(16, 8)) for _ in range(4)]
    pf = [host(np.zeros((4, 2, 4, 8), np.uint8)) for _ in range(2)]
    args = dict(src_ptrs=lf, dst_ptrs=pf, src_indices=np.arange(8, dtype=np.int64),
                dst_indices=np.arange(4, 12, dtype=np.int64), page_size=4)
    args.update(override)
    return args, pf


@pytest.mark.parametrize("override,error,match", [
    (dict(src_ptrs=np.zeros((4, 16, 8), np.uint8)), TypeError, r"src_ptrs must be a list of arrays"),
    (dict(dst_ptrs=[]), ValueError, r"dst_ptrs must hold at least 1 array, got 0"),
    (dict(src_ptrs=[np.zeros((16, 8), np.uint8)] * 3), ValueError, r"src_ptrs must hold K layers then V layers"),
    (dict(src_ptrs=[np.zeros((16, 8), np.uint8)] * 6), ValueError, r"3 layers in src_ptrs exceed the 2 layers"),
    (dict(src_ptrs=[np.zeros((16, 8), np.uint8)] * 3 + [np.zeros((16, 16), np.uint8)]), ValueError,
     r"src_ptrs\[3\] has 16 bytes per token, src_ptrs\[0\] has 8"),
    (dict(src_ptrs=[np.zeros((16, 4), np.uint16)] * 4), TypeError, r"dtype uint16 but dst_ptrs\[0\] has uint8"),
    (dict(src_ptrs=[1, 2]), TypeError, r"src_ptrs\[0\] must be an array"),
    (dict(dst_ptrs=[np.zeros((4, 2, 4, 8), np.uint8)] * 3), ValueError, r"2 page-first buffers \(K, V\) or 1"),
    (dict(dst_ptrs=[np.zeros((4, 16, 8), np.uint8)] * 2), ValueError, r"page_size=4"),
    (dict(dst_ptrs=[np.zeros((4, 8), np.uint8)] * 2), ValueError, r"must be \[num_pages, num_layers, page_size"),
    (dict(dst_ptrs=[np.zeros((4, 2, 4, 16), np.uint8)] * 2), ValueError, r"per-token bytes must match"),
    (dict(page_size=0), ValueError, r"page_size must be >= 1, got 0"),
    (dict(page_size=3), ValueError, r"dst_ptrs\[0\] must be \[num_pages, num_layers, page_size=3, \.\.\.\]"),
    (dict(src_indices=np.arange(6, dtype=np.int64), dst_indices=np.arange(6, dtype=np.int64)), ValueError,
     r"number of indices \(6\) must be a multiple of page_size \(4\)"),
    (dict(src_indices=np.arange(8, dtype=np.int32)), TypeError, r"src_indices must hold int64"),
    (dict(dst_indices=np.arange(4, dtype=np.int64)), ValueError, r"same length, got 8 and 4"),
    (dict(dst_indices=np.arange(16, 24, dtype=np.int64)), ValueError, r"dst_indices\[0\] = 16 is out of range for the 4 pages of dst_ptrs: valid tokens are \[0, 16\)"),
    (dict(src_indices=np.arange(13, 21, dtype=np.int64)), ValueError, r"src_indices\[0\] = 13 is out of range for the first token of a page of 4 tokens in src_ptrs: valid tokens are \[0, 13\)"),
    (dict(src_indices=np.arange(-1, 7, dtype=np.int64)), ValueError, r"src_indices\[0\] = -1 is out of range"),
    (dict(stream="s"), TypeError, r"stream must be a CUDA stream"),
])
def test_lf_pf_rejects(override, error, match):
    args, pf = _lf_pf_args(**override)
    with pytest.raises(error, match=match):
        kvnumba.transfer_kv_all_layer_direct_lf_pf(**args)
    assert not any(to_numpy(buffer).any() for buffer in pf)


@pytest.mark.parametrize("layer_id,error,match", [
    (2, ValueError, r"layer_id=2 \+ 1 layers in dst_ptrs exceed the 2 layers of src_ptrs"),
    (-1, ValueError, r"layer_id must be >= 0, got -1"),
    (1.0, TypeError, r"layer_id must be an integer, got float"),
])
def test_pf_lf_layer_id(layer_id, error, match):
    pf = [host(np.ones((4, 2, 4, 8), np.uint8)) for _ in range(2)]
    lf = [device(np.zeros((16, 8), np.uint8)) for _ in range(2)]
    with pytest.raises(error, match=match):
        kvnumba.transfer_kv_per_layer_direct_pf_lf(pf, lf, np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64),
                                                   layer_id, 4)
    assert not any(to_numpy(b).any() for b in lf)


@pytest.mark.parametrize("override,error,match", [
    (dict(dst_layers=[np.zeros((8, 4), np.uint8)]), ValueError, r"same number of layers, got 2 and 1"),
    (dict(dst_layers=[np.zeros((8, 8), np.uint8)] * 2), ValueError, r"same bytes per row, got 4 and 8"),
    (dict(dst_layers=[np.zeros((8, 2), np.uint16)] * 2), TypeError, r"dtype uint16 but src_layers\[0\] has uint8"),
    (dict(src_layers=(np.zeros((8, 4), np.uint8), "x")), TypeError, r"src_layers\[1\] must be an array"),
    (dict(src_layers=np.zeros((2, 8, 4), np.uint8)), TypeError, r"src_layers must be a list"),
    (dict(page_size=3), ValueError, r"multiple of page_size \(3\)"),
    (dict(dst_indices=np.array([6, 8], np.int64)), ValueError, r"dst_indices\[1\] = 8 is out of range for the rows of dst_layers: valid tokens are \[0, 8\)"),
    (dict(src_indices=np.array([-2, 0], np.int64)), ValueError, r"src_indices\[0\] = -2 is out of range"),
])
def test_direct_rejects(override, error, match):
    args = dict(src_layers=[device(np.ones((8, 4), np.uint8))] * 2,
                dst_layers=[device(np.zeros((8, 4), np.uint8)), device(np.zeros((8, 4), np.uint8))],
                src_indices=np.array([0, 1], np.int64), dst_indices=np.array([2, 3], np.int64), page_size=2)
    args.update(override)
    with pytest.raises(error, match=match):
        kvnumba.transfer_kv_direct(**args)
    for buffer in args["dst_layers"]:
        assert not to_numpy(buffer).any()


def test_direct_rejects_non_contiguous():
    strided = np.zeros((8, 8), np.uint8)[:, ::2]
    with pytest.raises(ValueError, match=r"dst_layers\[0\] must be C-contiguous"):
        kvnumba.transfer_kv_direct([np.zeros((8, 4), np.uint8)], [strided], np.zeros(1, np.int64),
                                   np.zeros(1, np.int64), 1)
