"""Every environment variable kvnumba reads, in one place; a value that cannot be used raises
``kvnumba.errors.SettingError`` (a ``ValueError``) naming the variable, what it accepts and what it got.
Nothing else in kvnumba (or its scripts) reads the environment.

- ``KVNUMBA_CHECK``: every call behaves as if given ``check=True`` (``always_check``; read once, when
  ``kvnumba.checks.guard`` is imported).
- ``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``batch_copy_route``; read at
  each copy-engine call).
- ``KVNUMBA_CHUNK_BYTES``: the chunk size of ``kvnumba convert`` (``env_int``, read by
  ``kvnumba.convert_files``).
- ``KVNUMBA_LOAD_PATH``: which kernel per-layer loads take (``load_path``; read when a plan is built).
- ``KVNUMBA_REQUIRE_GPU``: never fall back to Numba's simulator (``require_gpu``; read at ``import kvnumba``).
- ``KVNUMBA_RESULTS``: a folder of saved benchmark results for the notebooks (``results_dir``;
  ``kvnumba.tools.results`` reads it).

Numba's own ``NUMBA_ENABLE_CUDASIM`` (the simulator) is read by Numba when ``numba.cuda`` is imported;
``simulator_setting`` reads it the same way first, so that ``kvnumba.driver.target`` can choose, and
``use_simulator`` sets it when there is no CUDA driver (the one place kvnumba writes the environment).

``problems()`` lists every variable whose value cannot be used: the command line refuses to run with one.
``override(...)`` changes settings for a ``with`` block, from Python (tests and benchmarks use it).

Tuning settings have no variable: they are set from Python only, with ``override`` (tuning scripts and
tests), and read with ``tuning(name)``; None means kvnumba's own (tuned) choice:

- ``copy_shape``: one ``kvnumba.kernels.warp_copy.CopyShape`` for every kernel built, instead of
  ``kvnumba.kernels.factory.COPY_SHAPES``;
- ``staged_shape``: the staged kernel's ring (``kvnumba.kernels.staged.StagedShape``) instead of ``staged.SHAPE``;
- ``l2_promotion``: the tensor maps' L2 promotion (``"NONE"``, ``"L2_64B"``, ``"L2_128B"``, ``"L2_256B"``);
- ``map_store``: the ``kvnumba.plan.tensor_maps.MapStore`` new tensor maps are written to;
- ``host_index_checks``: False skips the host-side bounds check of indices the host can read, so
  that they meet the kernel's guard as indices in GPU memory do (tests of the guard on the simulator).
"""
import contextlib
import os
import sys

from .errors import SettingError

VARIABLES = ("KVNUMBA_CHECK", "KVNUMBA_BATCH_COPY", "KVNUMBA_CHUNK_BYTES", "KVNUMBA_LOAD_PATH", "KVNUMBA_REQUIRE_GPU",
             "KVNUMBA_RESULTS")
SIMULATOR_VARIABLE = "NUMBA_ENABLE_CUDASIM"

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off", "")


def env_flag(name):
    """A boolean variable: ``1``, ``true``, ``yes``, ``on`` (any case) mean on; unset, empty, ``0``,
    ``false``, ``no``, ``off`` mean off; anything else is a ``ValueError`` naming it."""
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise SettingError(f"{name} must be one of {', '.join(_ON)} (on) or {', '.join(_OFF[:-1])} (off), got {text!r}")


def env_int(name, default, minimum):
    """An integer variable (unset or empty: ``default``); ``ValueError`` naming it if malformed or below ``minimum``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise SettingError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def env_choice(name, choices, default):
    """One of ``choices`` (any case; unset or empty: ``default``); ``ValueError`` naming the variable otherwise."""
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def always_check():
    """``KVNUMBA_CHECK``: every call behaves as if given ``check=True`` (``kvnumba.checks.guard`` reads it at import)."""
    return env_flag("KVNUMBA_CHECK")


BATCH_COPY_ROUTES = ("auto", "cudart", "bindings", "page")


def batch_copy_route():
    """``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``kvnumba.driver.batch_copy``):
    ``auto`` (default), ``cudart``, ``bindings`` or ``page``."""
    return env_choice("KVNUMBA_BATCH_COPY", BATCH_COPY_ROUTES, "auto")


LOAD_PATHS = ("auto", "staged", "register")


def load_path():
    """``KVNUMBA_LOAD_PATH``: ``auto`` (default: the staged bulk-copy kernel for pinned-host -> GPU
    per-layer loads on sm_90+, else the register kernel), ``staged`` (wherever the layouts allow) or
    ``register``. Read when a plan is built (``kvnumba.plan.staged_plan``)."""
    return env_choice("KVNUMBA_LOAD_PATH", LOAD_PATHS, "auto")


def require_gpu():
    """``KVNUMBA_REQUIRE_GPU``: without a CUDA driver, refuse to run instead of falling back to Numba's
    simulator (``kvnumba.driver.target`` reads it at ``import kvnumba``)."""
    return env_flag("KVNUMBA_REQUIRE_GPU")


def simulator_setting():
    """``NUMBA_ENABLE_CUDASIM`` as Numba reads it: None when unset or empty (kvnumba then chooses), else
    whether it asks for the simulator (an integer, nonzero: yes). ``ValueError`` for a value Numba cannot
    parse (Numba would warn and run on the GPU target)."""
    text = os.environ.get(SIMULATOR_VARIABLE, "").strip()
    if not text:
        return None
    try:
        return int(text) != 0
    except ValueError:
        raise SettingError(f"{SIMULATOR_VARIABLE} must be 1 (Numba's CUDA simulator) or 0 (the GPU), "
                         f"got {text!r}") from None


def results_dir():
    """``KVNUMBA_RESULTS``: a folder of saved benchmark results (``scripts/results`` of a checkout), or None."""
    text = os.environ.get("KVNUMBA_RESULTS", "").strip()
    if text and not os.path.isdir(text):
        raise SettingError(f"KVNUMBA_RESULTS must be a folder, got {text!r}")
    return text or None


_set_here: set[str] = set()  # variables kvnumba set itself (use_simulator): not the user's settings


def use_simulator():
    """Set ``NUMBA_ENABLE_CUDASIM=1`` for this process (and the processes it starts), before ``numba.cuda``
    is imported; if Numba's configuration was read already, it is read again."""
    os.environ[SIMULATOR_VARIABLE] = "1"
    _set_here.add(SIMULATOR_VARIABLE)
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        numba_config.reload_config()


_READERS = {
    "KVNUMBA_CHECK": always_check,
    "KVNUMBA_BATCH_COPY": batch_copy_route,
    "KVNUMBA_CHUNK_BYTES": lambda: env_int("KVNUMBA_CHUNK_BYTES", 1, minimum=1),
    "KVNUMBA_LOAD_PATH": load_path,
    "KVNUMBA_REQUIRE_GPU": require_gpu,
    "KVNUMBA_RESULTS": results_dir,
    SIMULATOR_VARIABLE: simulator_setting,
}


def problems():
    """``{variable: message}`` for every setting whose value cannot be used (empty when all are fine)."""
    found = {}
    for name, read in _READERS.items():
        try:
            read()
        except ValueError as err:
            found[name] = str(err)
    return found


def settings():
    """``{variable: value}`` of every variable kvnumba reads that is set, by the user rather than by kvnumba
    itself (for ``kvnumba info``)."""
    return {name: os.environ[name] for name in _READERS if name in os.environ and name not in _set_here}


# --- changing settings from Python ----------------------------------------------------------------

_OVERRIDABLE = {"check": "KVNUMBA_CHECK", "batch_copy": "KVNUMBA_BATCH_COPY", "chunk_bytes": "KVNUMBA_CHUNK_BYTES",
                "load_path": "KVNUMBA_LOAD_PATH"}
_TUNING = {"copy_shape": None, "staged_shape": None, "l2_promotion": None, "map_store": None, "host_index_checks": None}
_tuning = dict(_TUNING)  # the values in force (None: kvnumba's own choice)
L2_PROMOTIONS = ("NONE", "L2_64B", "L2_128B", "L2_256B")
_listeners: list = []  # called after a setting changed through ``override`` (plans built under the old value go)


def on_change(callback):
    """Call ``callback()`` whenever ``override`` changes a setting (kvnumba's plan caches register here)."""
    _listeners.append(callback)


def tuning(name):
    """The tuning setting ``name`` in force (see the module docstring); None: kvnumba's own choice."""
    return _tuning[name]


@contextlib.contextmanager
def override(**values):
    """``with kvnumba.config.override(load_path="register"):`` runs the block with these settings, then
    restores them: variables by their short names (``check``, ``batch_copy``, ``chunk_bytes``,
    ``load_path``; values as the variables take them, e.g. ``check=True``) and tuning settings
    (``copy_shape``, ``staged_shape``, ``l2_promotion``, ``map_store``, ``host_index_checks``; see the module
    docstring). Cached plans are dropped on entry and exit, so the block's calls follow the new values.
    A bad value raises ``SettingError`` before anything changes."""
    unknown = sorted(set(values) - set(_OVERRIDABLE) - set(_TUNING))
    if unknown:
        raise TypeError(f"override() got unknown settings {', '.join(unknown)} "
                        f"(known: {', '.join([*_OVERRIDABLE, *_TUNING])})")
    tuned = {k: v for k, v in values.items() if k in _TUNING}
    if tuned.get("l2_promotion") not in (None, *L2_PROMOTIONS):
        raise SettingError(f"l2_promotion must be one of {', '.join(L2_PROMOTIONS)}, got {tuned['l2_promotion']!r}")
    names = {_OVERRIDABLE[k]: _text(v) for k, v in values.items() if k in _OVERRIDABLE}
    saved = {name: os.environ.get(name) for name in names}
    try:
        os.environ.update(names)
        for name in names:
            _READERS[name]()  # validated before the block runs
    except BaseException:
        _restore(saved)
        raise
    saved_tuning = {k: _tuning[k] for k in tuned}
    _tuning.update(tuned)
    _notify()
    try:
        yield
    finally:
        _restore(saved)
        _tuning.update(saved_tuning)
        _notify()


def _text(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _restore(saved):
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _notify():
    for callback in _listeners:
        callback()
