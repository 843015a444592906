"""Every environment variable kvnumba reads, in one place; each reader names its variable when the
value cannot be used.

- ``KVNUMBA_CHECK``: every call behaves as if given ``check=True`` (read at import).
- ``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``batch_copy_route``).
- ``KVNUMBA_CHUNK_BYTES``: the chunk size of ``kvnumba convert`` (``env_int``).
- ``KVNUMBA_LOAD_PATH``: which kernel per-layer loads take (``load_path``).
"""
import os


def env_flag(name):
    """A boolean variable: ``1``, ``true``, ``yes`` or ``on`` (any case) mean on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


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


BATCH_COPY_ROUTES = ("auto", "cudart", "bindings", "page")


def batch_copy_route():
    """``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``kvnumba.driver.batch_copy``):
    ``auto`` (default), ``cudart``, ``bindings`` or ``page``."""
    value = os.environ.get("KVNUMBA_BATCH_COPY", "auto").strip().lower() or "auto"
    if value not in BATCH_COPY_ROUTES:
        raise ValueError(f"KVNUMBA_BATCH_COPY must be one of {', '.join(BATCH_COPY_ROUTES)}, got {value!r}")
    return value


LOAD_PATHS = ("auto", "staged", "register")


def load_path():
    """``KVNUMBA_LOAD_PATH``: ``auto`` (default: the staged bulk-copy kernel for pinned-host -> GPU
    per-layer loads on sm_90+, else the register kernel), ``staged`` (wherever the layouts allow) or
    ``register``. Read when a plan is built (``kvnumba.api.staged_plan``)."""
    value = os.environ.get("KVNUMBA_LOAD_PATH", "auto").strip().lower() or "auto"
    if value not in LOAD_PATHS:
        raise ValueError(f"KVNUMBA_LOAD_PATH must be one of {', '.join(LOAD_PATHS)}, got {value!r}")
    return value
