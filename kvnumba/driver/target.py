"""Which world kvnumba runs in, decided once, at ``import kvnumba``: a real GPU or Numba's CUDA simulator.

Numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported, so kvnumba chooses before
(``kvnumba/__init__.py`` imports this module first):

- ``NUMBA_ENABLE_CUDASIM=1``: the simulator; ``=0``: the GPU target, driver or not (e.g. to compile PTX).
- Unset: the GPU target when libcuda loads (found as cuda-bindings finds it, without initialising CUDA, so
  a later ``fork`` is safe); else kvnumba sets ``NUMBA_ENABLE_CUDASIM=1`` and ``announce`` says so once.
- ``KVNUMBA_REQUIRE_GPU=1``: never the simulator; where kvnumba would fall back, ``REFUSAL`` holds the
  ``NoGpuError`` that ``require()`` raises.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

from .. import config
from ..errors import NoGpuError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Choice(NamedTuple):
    """What ``choose`` decided, and why (``reason``); ``automatic``: kvnumba switched to the simulator itself."""

    simulator: bool
    reason: str
    automatic: bool = False
    refusal: Exception | None = None


_DRIVER_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


def driver_missing() -> str | None:
    """Why the CUDA driver library cannot be loaded (as cuda-bindings loads it), or None if it can."""
    try:
        from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib
    except ImportError:  # pragma: no cover - cuda-pathfinder comes with cuda-bindings
        import ctypes.util

        return None if ctypes.util.find_library("cuda") else f"{_DRIVER_LIBRARY} not found"
    try:
        load_nvidia_dynamic_lib("cuda")
    except DynamicLibNotFoundError:
        return f"{_DRIVER_LIBRARY} not found"
    except Exception as exc:  # noqa: BLE001 - any failure to load it means: no driver
        return f"{_DRIVER_LIBRARY} could not be loaded: {' '.join(str(exc).split()) or type(exc).__name__}"
    return None


def _read(reader):
    try:
        return reader(), None
    except ValueError as err:
        return None, err


def choose(setting, require_gpu, numba_cuda_simulator, missing) -> Choice:
    """The decision, as a pure function of ``setting`` (``NUMBA_ENABLE_CUDASIM``: None, a bool, or the
    ``ValueError`` reading it raised), ``require_gpu`` (``KVNUMBA_REQUIRE_GPU`` likewise),
    ``numba_cuda_simulator`` (None before ``numba.cuda`` is imported, else whether it simulates) and
    ``missing`` (called only when needed: why the driver library cannot be loaded, or None)."""
    for value in (setting, require_gpu):
        if isinstance(value, ValueError):
            return Choice(False, f"a setting cannot be used: {value}", refusal=value)
    late = numba_cuda_simulator is not None  # too late to choose: numba.cuda has chosen
    if numba_cuda_simulator or (not late and setting is True):
        asks = ("numba.cuda runs on Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)" if late
                else "NUMBA_ENABLE_CUDASIM=1 asks for Numba's CUDA simulator")
        refusal = NoGpuError(f"KVNUMBA_REQUIRE_GPU=1, but {asks}: unset one of them") if require_gpu else None
        return Choice(True, "NUMBA_ENABLE_CUDASIM=1", refusal=refusal)
    if late:
        why = missing() if setting is None else None
        if why is not None:
            return Choice(False, f"no CUDA driver ({why})", refusal=NoGpuError(
                f"there is no CUDA driver ({why}), and numba.cuda was imported before kvnumba, on its GPU "
                "target, so kvnumba cannot switch to Numba's CUDA simulator: import kvnumba before numba.cuda, "
                "or set NUMBA_ENABLE_CUDASIM=1"))
        return Choice(False, "a CUDA driver")
    if setting is False:
        return Choice(False, "NUMBA_ENABLE_CUDASIM=0")
    why = missing()
    if why is None:
        return Choice(False, "a CUDA driver")
    if require_gpu:
        return Choice(False, f"no CUDA driver ({why})", refusal=NoGpuError(
            f"KVNUMBA_REQUIRE_GPU=1, but there is no CUDA driver ({why}): install the NVIDIA driver, or unset "
            "KVNUMBA_REQUIRE_GPU to run on Numba's CUDA simulator"))
    return Choice(True, f"no CUDA driver ({why})", automatic=True)


def _numba_cuda_simulator():
    numba_cuda = sys.modules.get("numba.cuda")
    if numba_cuda is None:
        return None
    return bool(getattr(getattr(numba_cuda, "config", None), "ENABLE_CUDASIM", False))


def _decide() -> Choice:
    setting, setting_error = _read(config.simulator_setting)
    require, require_error = _read(config.require_gpu)
    choice = choose(setting_error or setting, require_error or require, _numba_cuda_simulator(), driver_missing)
    if choice.automatic:
        config.use_simulator()
    return choice


CHOICE = _decide()
SIMULATOR = CHOICE.simulator
REFUSAL = CHOICE.refusal

WARNING = ("kvnumba: no CUDA driver found, so kernels run on Numba's CUDA simulator (slow: for tiny sizes; NumPy "
           "arrays stand for GPU memory). Set NUMBA_ENABLE_CUDASIM=1 to choose it (and silence this warning), or "
           "KVNUMBA_REQUIRE_GPU=1 to make it an error.")
_announced = False


def require():
    """Raise (a fresh copy of) ``REFUSAL`` if kvnumba refuses to run here."""
    if REFUSAL is not None:
        raise type(REFUSAL)(str(REFUSAL))


def announce():
    """Warn, once per process, that kvnumba switched to the simulator by itself, at the caller's line."""
    global _announced
    if _announced or not CHOICE.automatic:
        return
    _announced = True
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                        or frame.f_code.co_filename.startswith("<frozen")):
        frame = frame.f_back
    warnings.warn_explicit(WARNING, UserWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"))


def gpu_available():
    """True when a real CUDA GPU can be used (never on the simulator)."""
    if SIMULATOR:
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver install means "no GPU" here
        return False
