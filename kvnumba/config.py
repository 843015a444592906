"""Every environment variable kvnumba reads, in one place (nothing else in kvnumba reads the environment).
A value that cannot be used raises ``SettingError`` (a ``ValueError``) naming the variable; ``problems()``
lists them all (the command line refuses to run with one). Each variable has one reader below, which says
when it is read. ``use_simulator`` is the one place kvnumba writes the environment.

``override(...)`` changes settings for a ``with`` block. Tuning settings have no variable: they are set
with ``override`` only and read with ``tuning(name)``; None means kvnumba's own (tuned) choice:

- ``copy_shape``: one ``kernels.warp_copy.CopyShape`` for every kernel built (else ``factory.COPY_SHAPES``);
- ``staged_shape``: the staged kernel's ring (``kernels.staged.StagedShape``; else ``staged.SHAPE``);
- ``l2_promotion``: the tensor maps' L2 promotion (one of ``L2_PROMOTIONS``);
- ``map_store``: the ``plan.tensor_maps.MapStore`` new tensor maps are written to;
- ``host_index_checks``: False skips the host's bounds check of host-readable indices, so that they meet
  the kernel's guard (tests of the guard on the simulator);
- ``fp8_kernel``: ``"general"`` or ``"wide"``, the FP8 copies' kernel where both could run
  (NVFP4 loads likewise: the register kernel, or the pipelined one);
- ``scale_boxes``: False has the staged FP8 load copy its scales through the loader warp, not the bulk unit.
"""
import contextlib
import os
import sys
import threading

from .errors import SettingError

SIMULATOR_VARIABLE = "NUMBA_ENABLE_CUDASIM"

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off", "")


def _get(name, environ=None):
    """The variable's text (empty when unset), from ``environ`` (a mapping) or the process's environment."""
    return (os.environ if environ is None else environ).get(name, "")


def env_flag(name, environ=None):
    """A boolean variable: ``1``, ``true``, ``yes``, ``on`` (any case) mean on; unset, empty, ``0``,
    ``false``, ``no``, ``off`` mean off; anything else is a ``ValueError`` naming it. ``environ``: read
    there instead of the process's environment (``override`` checks values before setting them)."""
    text = _get(name, environ)
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise SettingError(f"{name} must be one of {', '.join(_ON)} (on) or {', '.join(_OFF[:-1])} (off), got {text!r}")


def env_int(name, default, minimum, environ=None):
    """An integer variable (unset or empty: ``default``); ``ValueError`` naming it if malformed or below ``minimum``."""
    text = _get(name, environ).strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise SettingError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def env_choice(name, choices, default, environ=None):
    """One of ``choices`` (any case; unset or empty: ``default``); ``ValueError`` naming the variable otherwise."""
    value = _get(name, environ).strip().lower() or default
    if value not in choices:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def always_check(environ=None):
    """``KVNUMBA_CHECK``: every call behaves as if given ``check=True`` (``kvnumba.checks.guard`` reads it at import)."""
    return env_flag("KVNUMBA_CHECK", environ)


BATCH_COPY_ROUTES = ("auto", "cudart", "bindings", "page")


def batch_copy_route(environ=None):
    """``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``kvnumba.driver.batch_copy``):
    ``auto`` (default), ``cudart``, ``bindings`` or ``page``."""
    return env_choice("KVNUMBA_BATCH_COPY", BATCH_COPY_ROUTES, "auto", environ)


def load_path(environ=None):
    """``KVNUMBA_LOAD_PATH``: ``auto`` (default: the staged bulk-copy kernel for pinned-host -> GPU
    per-layer loads on sm_90+, else the register kernel), ``staged`` (wherever the layouts allow) or
    ``register``; also which build ``kv.load_resident`` takes. Read when a plan is built (``kvnumba.plan.staged_plan``)."""
    return env_choice("KVNUMBA_LOAD_PATH", ("auto", "staged", "register"), "auto", environ)


def require_gpu(environ=None):
    """``KVNUMBA_REQUIRE_GPU``: without a CUDA driver, refuse to run instead of falling back to Numba's
    simulator (``kvnumba.driver.target`` reads it at ``import kvnumba``)."""
    return env_flag("KVNUMBA_REQUIRE_GPU", environ)


def simulator_setting(environ=None):
    """``NUMBA_ENABLE_CUDASIM`` as Numba reads it: None when unset or empty (kvnumba then chooses), else
    whether it asks for the simulator (an integer, nonzero: yes). ``ValueError`` for a value Numba cannot
    parse (Numba would warn and run on the GPU target)."""
    text = _get(SIMULATOR_VARIABLE, environ).strip()
    if not text:
        return None
    try:
        return int(text) != 0
    except ValueError:
        raise SettingError(f"{SIMULATOR_VARIABLE} must be 1 (Numba's CUDA simulator) or 0 (the GPU), "
                         f"got {text!r}") from None


def results_dir(environ=None):
    """``KVNUMBA_RESULTS``: a folder of saved benchmark results (``scripts/results`` of a checkout), or None."""
    text = _get("KVNUMBA_RESULTS", environ).strip()
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


def chunk_bytes(environ=None):
    """``KVNUMBA_CHUNK_BYTES``: bytes per chunk of ``kvnumba convert`` (``kvnumba.convert.files``), for tests and
    small machines; 64 MiB when unset."""
    return env_int("KVNUMBA_CHUNK_BYTES", 64 << 20, minimum=1, environ=environ)


_READERS = {
    "KVNUMBA_CHECK": always_check,
    "KVNUMBA_BATCH_COPY": batch_copy_route,
    "KVNUMBA_CHUNK_BYTES": chunk_bytes,
    "KVNUMBA_LOAD_PATH": load_path,
    "KVNUMBA_REQUIRE_GPU": require_gpu,
    "KVNUMBA_RESULTS": results_dir,
    SIMULATOR_VARIABLE: simulator_setting,
}
VARIABLES = tuple(name for name in _READERS if name != SIMULATOR_VARIABLE)  # kvnumba's own


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
_TUNING_TYPES = {  # the class each takes, by name (l2_promotion takes a name, host_index_checks a bool)
    "copy_shape": "kvnumba.kernels.warp_copy.CopyShape", "staged_shape": "kvnumba.kernels.staged.StagedShape",
    "map_store": "kvnumba.plan.tensor_maps.MapStore"}
_TUNING = {"copy_shape": None, "staged_shape": None, "l2_promotion": None, "map_store": None, "host_index_checks": None,
           "fp8_kernel": None, "scale_boxes": None}
_tuning = dict(_TUNING)  # the values in force (None: kvnumba's own choice)
L2_PROMOTIONS = ("NONE", "L2_64B", "L2_128B", "L2_256B")
FP8_KERNELS = ("general", "wide")
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
    ``load_path``; e.g. ``check=True``) and the tuning settings of the module docstring. Cached plans are
    dropped on entry and exit, so the block's calls follow the new values.

    A bad value raises before anything changes: ``SettingError`` for a value a variable cannot take,
    ``TypeError`` for a tuning value of the wrong type, both naming the setting.

    The settings are the process's, so open blocks (nested, or in several threads) stack: a setting has
    the value of the latest entered open block that sets it, and once all those closed, its value from
    before them."""
    unknown = sorted(set(values) - set(_OVERRIDABLE) - set(_TUNING))
    if unknown:
        raise TypeError(f"override() got unknown settings {', '.join(unknown)} "
                        f"(known: {', '.join([*_OVERRIDABLE, *_TUNING])})")
    tuned = {k: v for k, v in values.items() if k in _TUNING}
    for name, value in tuned.items():
        _check_tuning(name, value)
    names = {_OVERRIDABLE[k]: _text(v) for k, v in values.items() if k in _OVERRIDABLE}
    for name in names:
        _READERS[name](names)  # validated before anything changes
    # One block's settings, keyed ("env", variable) or ("tuning", name).
    layer = {**{("env", name): text for name, text in names.items()}, **{("tuning", k): v for k, v in tuned.items()}}
    with _override_lock:
        for key in layer:
            if not any(key in open_layer for open_layer in _open):
                _before[key] = os.environ.get(key[1]) if key[0] == "env" else _tuning[key[1]]
        _open.append(layer)
        _settle(layer)
    try:
        yield
    finally:
        with _override_lock:
            _open[:] = [open_layer for open_layer in _open if open_layer is not layer]
            _settle(layer)


_override_lock = threading.RLock()
_open: list = []  # the open override blocks, oldest first: {(kind, name): value}
_before: dict = {}  # (kind, name) -> its value before the first open block that set it


def _settle(keys):
    """Give each of these settings the value of the latest open block that sets it, else its value from
    before the blocks (then forgotten); then tell the listeners."""
    for key in keys:
        setters = [open_layer[key] for open_layer in _open if key in open_layer]
        value = setters[-1] if setters else _before.pop(key)
        kind, name = key
        if kind == "tuning":
            _tuning[name] = value
        elif value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for callback in _listeners:
        callback()


def _check_tuning(name, value):
    """A tuning value of the right type (None: kvnumba's own choice), else ``TypeError`` naming it;
    ``SettingError`` for an L2 promotion kvnumba does not know."""
    if value is None:
        return
    choices = {"l2_promotion": L2_PROMOTIONS, "fp8_kernel": FP8_KERNELS}.get(name)
    if choices is not None:
        if value not in choices:
            raise SettingError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return
    if name in ("host_index_checks", "scale_boxes"):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True, False or None, got {type(value).__name__}")
        return
    expected = _TUNING_TYPES[name]  # by name: config imports nothing of kvnumba's higher layers
    if expected not in {f"{c.__module__}.{c.__qualname__}" for c in type(value).__mro__}:
        raise TypeError(f"{name} must be a {expected} or None, got {type(value).__name__} {value!r}")
    defaults = getattr(type(value), "_field_defaults", {})
    for field, default in defaults.items():  # a NamedTuple's fields: each of its default's type
        got = getattr(value, field)
        if type(got) is not type(default):
            raise TypeError(f"{name}.{field} must be {type(default).__name__} (like its default {default!r}), "
                            f"got {type(got).__name__} {got!r}")


def _text(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
