"""kvnumba's direct libcudart call of cudaMemcpyBatchAsync: the C signature follows the runtime
library's version (12.x has ``size_t* failIdx`` before the stream, 13.x does not)."""
import ctypes

import numpy as np
import pytest

from kvnumba.driver import batch_copy
from kvnumba.driver.bindings import error_name
from tests.helpers.placement import ON_GPU

rt = pytest.importorskip("cuda.bindings.runtime")


class FakeCudart:
    """A stand-in libcudart: reports ``version`` and records each batch call's arguments."""

    def __init__(self, version, error=0, fail_index=None):
        self.version, self.error, self.fail_index, self.calls = version, error, fail_index, []

        def get_version(ref):
            ref._obj.value = self.version
            return 0

        def batch(*args):
            self.calls.append(args)
            if self.fail_index is not None:
                args[7]._obj.value = self.fail_index
            return self.error

        self.cudaRuntimeGetVersion = get_version
        self.cudaMemcpyBatchAsync = batch


def _arrays():
    return (np.array([0x1000, 0x2000], np.int64), np.array([0x3000, 0x4000], np.int64),
            np.array([64, 64], np.int64))


def test_cuda13_signature_has_no_fail_index():
    lib = FakeCudart(13000)
    call = batch_copy.CudartBatch(lib, rt)
    dsts, srcs, sizes = _arrays()
    assert call(dsts, srcs, sizes, 0, None, 0x77) == batch_copy.BatchResult(0, None)
    (args,) = lib.calls
    assert len(args) == 8 and args[3] == 2 and args[6] == 1 and args[7] == 0x77
    assert args[0] == dsts.ctypes.data and args[1] == srcs.ctypes.data and args[2] == sizes.ctypes.data
    attrs = args[4]._obj
    assert attrs.srcAccessOrder == int(rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream)
    assert (attrs.srcLocHint.type, attrs.srcLocHint.id) == (int(rt.cudaMemLocationType.cudaMemLocationTypeDevice), 0)
    assert attrs.dstLocHint.type == int(rt.cudaMemLocationType.cudaMemLocationTypeHost) and attrs.flags == 0


def test_cuda12_signature_reports_the_failing_copy():
    lib = FakeCudart(12080, error=1, fail_index=1)
    call = batch_copy.CudartBatch(lib, rt)
    result = call(*_arrays(), None, 0, 0x77)
    assert result == batch_copy.BatchResult(1, 1)
    (args,) = lib.calls
    assert len(args) == 9 and args[8] == 0x77


@pytest.mark.skipif(ON_GPU, reason="made-up addresses: only safe where no device can copy them; "
                                    "on a GPU the real call runs in copy_engine/test_entry_points.py and test_gpu_hicache_scale.py")
def test_real_libcudart_answers_without_crashing():
    """The pip runtime's libcudart: the real signature, called with real arrays (no GPU: an error code)."""
    pathfinder = pytest.importorskip("cuda.pathfinder")
    try:
        lib = ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("cudart").abs_path)
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"no libcudart: {error}")
    call = batch_copy.CudartBatch(lib, rt)
    assert call.runtime_version >= 12000
    result = call(*_arrays(), None, None, 0)
    # No device here: the runtime refuses the batch with one of its own errors (no driver, no device),
    # reported as a number the error helper names, and never as a crash or a success.
    assert result.error != 0
    assert error_name(result.error).startswith("cudaError")
    assert result.fail_index is None  # 13.x reports no index; 12.x reports none for a whole-call error


@pytest.mark.parametrize("version", [12080, 13000])
def test_prepared_batch_calls_with_its_pointers_and_attributes(version, batch_runtime):
    """``PreparedBatch.submit`` through ``CudartBatch.call``: the arrays' pointers and the attributes made
    once, the count and stream per call; the same C signature per runtime version as ``__call__``."""
    lib = FakeCudart(version)
    cudart = batch_copy.CudartBatch(lib, rt)
    prepared = batch_copy.PreparedBatch(0, None)
    out = prepared.reserve(5)
    out[:, :2] = np.array(_arrays())
    batch_runtime(type("Runtime", (), {"cudart": cudart, "has_batch": True, "driver_version": 13000})())
    assert prepared.submit(2, 0x77) == "batch" and prepared.submit(2, 0x78) == "batch"
    first, second = lib.calls
    assert [first[i].value for i in range(3)] == [out[row].ctypes.data for row in range(3)]
    assert first[3] == 2 and first[-1] == 0x77 and second[-1] == 0x78
    assert first[4] is second[4] and first[4]._obj is cudart.attributes(0, None)  # made once
    assert len(first) == (9 if version < 13000 else 8)
