"""cuda-python's driver and runtime bindings, and the one helper every result goes through.

Every CUDA call kvnumba makes itself goes through ``cuda.bindings`` (the hot launch path checks its
result inline; everything else calls ``check``). Numba keeps its own use of the same bindings for
compiling and loading kernels.
"""
from ..errors import CudaError

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import runtime as rt
except ImportError:  # pragma: no cover - cuda-bindings is a dependency; the simulator needs none of it
    cu = rt = None


def error_name(err):
    """``CUDA_ERROR_...`` / ``cudaError...`` name of a driver or runtime result."""
    try:
        if isinstance(err, cu.CUresult):
            _, name = cu.cuGetErrorName(err)
        else:
            _, name = rt.cudaGetErrorName(rt.cudaError_t(int(err)))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - only for a message
        return f"error {int(err)}"


def check(result, call):
    """The values of a bindings call's result tuple ``(err, *values)``; ``CudaError`` naming
    ``call`` and the CUDA error if ``err`` is not success. One value comes back bare."""
    err = result[0]
    if err:
        raise CudaError(f"{call} failed: {error_name(err)} ({int(err)})", int(err), call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]
