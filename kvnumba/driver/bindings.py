"""cuda-python's driver and runtime bindings, and ``failure``, the one helper every CUDA error goes through: its
message names the call and the error (``cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE (1)``).
"""
from ..errors import CudaError

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import runtime as rt
except ImportError:  # pragma: no cover - cuda-bindings is a dependency; the simulator needs none of it
    cu = rt = None


def error_name(err):
    """``CUDA_ERROR_...`` / ``cudaError...`` name of a driver or runtime result (a plain number is read as
    a runtime error). The bindings' enums hold the names, so no driver is needed to ask."""
    try:
        if isinstance(err, cu.CUresult):
            return err.name
        return rt.cudaError_t(int(err)).name
    except Exception:  # noqa: BLE001 - no bindings, or a number no enum knows: only for a message
        return "unknown CUDA error"


def failure(call, err, detail="", error=CudaError, **fields):
    """The exception for CUDA call ``call`` that answered ``err`` (a driver or runtime result, or its
    number): ``error`` (``CudaError`` or a subclass) with the message ``"{call} failed{detail}: {name}
    ({number})"``, ``code`` and ``call`` set; ``fields`` go to the class (``CopyError``'s ``index``)."""
    code = int(err)
    return error(f"{call} failed{detail}: {error_name(err)} ({code})", code, call, **fields)


def check(result, call):
    """The values of a bindings call's result tuple ``(err, *values)``; ``CudaError`` naming
    ``call`` and the CUDA error if ``err`` is not success. One value comes back bare."""
    err = result[0]
    if err:
        raise failure(call, err)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]
