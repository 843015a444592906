"""``kvnumba info``: what kvnumba runs on, as text or (``--json``) as data. Every probe is guarded:
without a GPU, a driver or the CUDA runtime it says so instead of failing."""
import importlib
import importlib.metadata
import platform
import warnings

from .. import config
from ..driver import target
from ..driver.bindings import error_name

PACKAGES = ("numpy", "numba", "numba-cuda", "cuda-bindings")


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _unavailable(exc):
    return f"{type(exc).__name__}: {exc}"


def _cuda_version_of(module, call):
    """``(version, None)`` from ``cuda.bindings.<module>.<call>()``, or ``(None, why not)``: a missing
    runtime library or libcuda (no driver) is an answer, not a crash."""
    try:
        err, version = getattr(importlib.import_module(f"cuda.bindings.{module}"), call)()
        if int(err):
            return None, error_name(err)
        major, rest = divmod(int(version), 1000)
        return f"{major}.{rest // 10}", None
    except Exception as exc:  # noqa: BLE001
        return None, _unavailable(exc)


def _gpu():
    """``(target, gpu, note)``: ``"simulator"``, ``"none"`` or ``"gpu"``; the GPU's facts or None."""
    choice = target.CHOICE
    if choice.refusal is not None:
        return "none", None, f"refused: {choice.refusal}"
    if choice.simulator:
        chosen = ", chosen by kvnumba" if choice.automatic else ""
        return "simulator", None, (f"Numba's CUDA simulator ({choice.reason}{chosen}; NumPy arrays stand for GPU "
                                   "memory)")
    if not target.gpu_available():
        return "none", None, (f"no usable GPU ({choice.reason}, but no device answers; kvnumba demo runs on the "
                              "simulator)")
    try:
        from numba import cuda

        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        major, minor = device.compute_capability
        return "gpu", {"name": name, "compute_capability": f"{major}.{minor}",
                       "sms": int(device.MULTIPROCESSOR_COUNT)}, None
    except Exception as exc:  # noqa: BLE001
        return "gpu", None, f"a GPU, but it could not be queried ({_unavailable(exc)})"


def _batch_copy():
    """``(usable, None)``, or ``(None, why unknown)`` if the probe fails (e.g. a bad ``KVNUMBA_BATCH_COPY``)."""
    try:
        from ..api.direct import batch_copy_available

        with warnings.catch_warnings():  # info reports the simulator itself (target), not as a warning
            warnings.simplefilter("ignore", UserWarning)
            return bool(batch_copy_available()), None
    except Exception as exc:  # noqa: BLE001
        return None, _unavailable(exc)


def facts():
    """What ``kvnumba info`` reports, as plain values (``--json`` prints this dict; its keys:
    docs/guides/command-line.md). A None value has its reason in ``unavailable``."""
    from .. import __version__

    runtime, runtime_why = _cuda_version_of("runtime", "cudaRuntimeGetVersion")
    driver, driver_why = _cuda_version_of("driver", "cuDriverGetVersion")
    where, gpu, gpu_note = _gpu()
    batch, batch_why = _batch_copy()
    unavailable = {"cuda_runtime": runtime_why, "cuda_driver": driver_why, "gpu": gpu_note, "batch_copy": batch_why}
    from ..plan import routes

    return {
        "kvnumba": __version__,
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cuda_runtime": runtime,
        "cuda_driver": driver,
        "target": where,
        "target_reason": target.CHOICE.reason,
        "gpu": gpu,
        "batch_copy": batch,
        "copy_engine_min_bytes": routes.COPY_ENGINE_MIN_BYTES,
        "copy_engine_crossover": routes.CROSSOVER,
        "unavailable": {key: why for key, why in unavailable.items() if why is not None},
        "settings": config.settings(),
        "setting_errors": config.problems(),
    }


def report(found=None):
    """``(name, value)`` text pairs for ``kvnumba info``, from ``facts()`` (or ``found``)."""
    found = found or facts()
    why = found["unavailable"]
    gpu = found["gpu"]
    if gpu is not None:
        gpu_text = f"{gpu['name']} (compute capability {gpu['compute_capability']}, {gpu['sms']} SMs)"
    else:
        gpu_text = why["gpu"]
    batch = found["batch_copy"]
    return [
        ("kvnumba", found["kvnumba"]),
        ("python", found["python"]),
        *((name, version or "not installed") for name, version in found["packages"].items()),
        ("CUDA runtime", found["cuda_runtime"] or f"unavailable ({why['cuda_runtime']})"),
        ("CUDA driver", f"{found['cuda_driver']} (supports CUDA up to this version)" if found["cuda_driver"]
         else f"unavailable ({why['cuda_driver']})"),
        ("GPU", gpu_text),
        ("cudaMemcpyBatchAsync", f"unknown ({why['batch_copy']})" if batch is None else ("yes" if batch else "no")),
        ("kv.copy route='auto'", f"the copy engine for copies of {found['copy_engine_min_bytes'] // 1024} KiB or "
         f"more on average, else the kernel ({found['copy_engine_crossover']})"),
        ("settings", ", ".join(f"{name}={value}" + (" (cannot be used)" if name in found.get("setting_errors", {})
                                                     else "") for name, value in found.get("settings", {}).items())
         or "none set"),
    ]
