"""Every environment variable kvnumba reads, in one place; a value that cannot be used raises
``ValueError`` naming the variable, what it accepts and what it got. Nothing else in kvnumba (or its
scripts) reads the environment.

- ``KVNUMBA_CHECK``: every call behaves as if given ``check=True`` (``always_check``; read once, at import).
- ``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``batch_copy_route``; read at
  each copy-engine call).
- ``KVNUMBA_CHUNK_BYTES``: the chunk size of ``kvnumba convert`` (``env_int``, read by
  ``kvnumba.tools.convert_files``).
- ``KVNUMBA_LOAD_PATH``: which kernel per-layer loads take (``load_path``; read when a plan is built).

Numba's own ``NUMBA_ENABLE_CUDASIM`` (the simulator) is read by Numba; ``kvnumba.driver.target`` asks Numba.
"""
import os

VARIABLES = ("KVNUMBA_CHECK", "KVNUMBA_BATCH_COPY", "KVNUMBA_CHUNK_BYTES", "KVNUMBA_LOAD_PATH")

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
    raise ValueError(f"{name} must be one of {', '.join(_ON)} (on) or {', '.join(_OFF[:-1])} (off), got {text!r}")


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
        raise ValueError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def env_choice(name, choices, default):
    """One of ``choices`` (any case; unset or empty: ``default``); ``ValueError`` naming the variable otherwise."""
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
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
    ``register``. Read when a plan is built (``kvnumba.api.staged_plan``)."""
    return env_choice("KVNUMBA_LOAD_PATH", LOAD_PATHS, "auto")
