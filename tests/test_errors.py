"""Every exception class kvnumba defines lives in ``kvnumba.errors`` and is exported from ``kvnumba``;
every CUDA failure message names the call and the CUDA error (``kvnumba.driver.bindings.failure``)."""
import importlib
import inspect
import pkgutil

import pytest

import kvnumba
from kvnumba import errors
from kvnumba.driver.bindings import check, failure

pytestmark = pytest.mark.smoke  # in the one-minute subset

ERROR_CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, BaseException) and cls.__module__ == errors.__name__]


def _modules():
    for info in pkgutil.walk_packages(kvnumba.__path__, "kvnumba."):
        if not info.name.endswith("__main__"):  # running it would start the command line
            yield importlib.import_module(info.name)


def test_every_exception_class_is_defined_in_errors():
    elsewhere = [f"{module.__name__}.{name}" for module in _modules()
                 for name, cls in inspect.getmembers(module, inspect.isclass)
                 if issubclass(cls, BaseException) and cls.__module__ == module.__name__
                 and module.__name__ != errors.__name__]
    assert elsewhere == []


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_is_exported(cls):
    assert cls.__name__ in kvnumba.__all__
    assert getattr(kvnumba, cls.__name__) is cls


def test_the_known_errors_are_there():
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"CopyError", "CudaError", "BadAddressError", "IndexOutOfRangeError", "PageableMemoryError",
            "DeviceMismatchError", "OverlapError", "Interrupted"} <= names


def test_argument_errors_are_value_errors_and_cuda_errors_runtime_errors():
    for cls in (kvnumba.BadAddressError, kvnumba.IndexOutOfRangeError, kvnumba.PageableMemoryError,
                kvnumba.DeviceMismatchError, kvnumba.OverlapError):
        assert issubclass(cls, ValueError)
    assert issubclass(kvnumba.CopyError, kvnumba.CudaError) and issubclass(kvnumba.CudaError, RuntimeError)
    assert issubclass(kvnumba.Interrupted, KeyboardInterrupt) and not issubclass(kvnumba.Interrupted, Exception)


def test_failure_names_a_driver_call_and_its_error():
    cu = pytest.importorskip("cuda.bindings.driver")
    error = failure("cuMemAlloc", cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    assert type(error) is kvnumba.CudaError
    assert str(error) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
    assert (error.code, error.call) == (2, "cuMemAlloc")


def test_failure_names_a_runtime_call_given_as_a_number():
    pytest.importorskip("cuda.bindings.runtime")
    error = failure("cudaMemcpyAsync", 1, " (64 bytes from 0x10 to 0x20)", kvnumba.CopyError, index=3)
    assert str(error) == "cudaMemcpyAsync failed (64 bytes from 0x10 to 0x20): cudaErrorInvalidValue (1)"
    assert (error.code, error.call, error.index) == (1, "cudaMemcpyAsync", 3)


def test_check_returns_values_or_raises_the_failure():
    cu = pytest.importorskip("cuda.bindings.driver")
    assert check((cu.CUresult.CUDA_SUCCESS, 7), "cuDeviceGet") == 7
    assert check((cu.CUresult.CUDA_SUCCESS, 7, 8), "cuDeviceGet") == (7, 8)
    assert check((cu.CUresult.CUDA_SUCCESS,), "cuCtxSynchronize") is None
    with pytest.raises(kvnumba.CudaError, match=r"^cuCtxSynchronize failed: CUDA_ERROR_INVALID_CONTEXT \(201\)$"):
        check((cu.CUresult.CUDA_ERROR_INVALID_CONTEXT,), "cuCtxSynchronize")


def test_a_gpu_copy_of_a_dtype_numba_cannot_hold_names_it(monkeypatch):
    """``kvnumba.testing.device_array`` of a bfloat16 array on a GPU (pictured here): a ``TypeError`` that
    names the dtype and a way out, before any CUDA call, instead of Numba's buffer error from inside its copy."""
    import ml_dtypes
    import numpy as np

    from kvnumba import arrays

    monkeypatch.setattr(arrays, "SIMULATOR", False)
    with pytest.raises(TypeError, match=r"bfloat16.*uint16"):
        arrays.device_array(np.zeros(4, ml_dtypes.bfloat16))
