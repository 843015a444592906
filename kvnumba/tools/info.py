"""``kvnumba info``: what kvnumba runs on. Every probe is guarded: without a GPU, a driver or the CUDA
runtime it says so instead of failing."""
import importlib
import importlib.metadata
import platform

from ..driver.target import SIMULATOR, gpu_available


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cuda_version(number):
    major, rest = divmod(int(number), 1000)
    return f"{major}.{rest // 10}"


def _runtime_version():
    try:
        from cuda.bindings import runtime

        err, version = runtime.cudaRuntimeGetVersion()
        if int(err):
            return f"unavailable ({err})"
        return _cuda_version(version)
    except Exception as exc:  # noqa: BLE001 - no runtime library is an answer, not a crash
        return f"unavailable ({type(exc).__name__}: {exc})"


def _driver_version():
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if int(err):
            return f"unavailable ({err})"
        return f"{_cuda_version(version)} (supports CUDA up to this version)"
    except Exception as exc:  # noqa: BLE001 - no libcuda (no driver) is an answer, not a crash
        return f"unavailable ({type(exc).__name__}: {exc})"


def _gpu():
    if SIMULATOR:
        return "simulator (NUMBA_ENABLE_CUDASIM=1; NumPy arrays stand for GPU memory)"
    if not gpu_available():
        return "no GPU (kernels run on the simulator: NUMBA_ENABLE_CUDASIM=1)"
    try:
        from numba import cuda

        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        major, minor = device.compute_capability
        return f"{name} (compute capability {major}.{minor}, {device.MULTIPROCESSOR_COUNT} SMs)"
    except Exception as exc:  # noqa: BLE001
        return f"a GPU, but it could not be queried ({type(exc).__name__}: {exc})"


def _batch_copy():
    """Whether ``cudaMemcpyBatchAsync`` is usable, as ``kvnumba.api.direct`` (added separately) sees it."""
    try:
        direct = importlib.import_module("kvnumba.api.direct")
    except ImportError:
        return "unknown (kvnumba.api.direct not present)"
    probe = getattr(direct, "batch_copy_available", None)
    if probe is None:
        return "unknown (kvnumba.api.direct has no batch_copy_available)"
    try:
        answer = probe()
    except Exception as exc:  # noqa: BLE001
        return f"unknown (batch_copy_available failed: {type(exc).__name__}: {exc})"
    if answer is True:
        return "yes"
    if answer is False:
        return "no"
    return f"no: {answer}"


def report():
    """``(name, value)`` pairs for ``kvnumba info``."""
    from .. import __version__

    return [
        ("kvnumba", __version__),
        ("python", platform.python_version()),
        ("numpy", _version("numpy")),
        ("numba", _version("numba")),
        ("numba-cuda", _version("numba-cuda")),
        ("cuda-bindings", _version("cuda-bindings")),
        ("CUDA runtime", _runtime_version()),
        ("CUDA driver", _driver_version()),
        ("GPU", _gpu()),
        ("cudaMemcpyBatchAsync", _batch_copy()),
    ]
