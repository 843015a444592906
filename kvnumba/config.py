"""Every environment variable kvnumba reads, in one place, read once at import."""
import os


def env_flag(name):
    """A boolean variable: ``1``, ``true``, ``yes`` or ``on`` (any case) mean on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


BATCH_COPY_ROUTES = ("auto", "cudart", "bindings", "page")


def batch_copy_route():
    """``KVNUMBA_BATCH_COPY``: how the page-first-direct copies are submitted (``kvnumba.driver.batch_copy``):
    ``auto`` (default), ``cudart``, ``bindings`` or ``page``."""
    value = os.environ.get("KVNUMBA_BATCH_COPY", "auto").strip().lower() or "auto"
    if value not in BATCH_COPY_ROUTES:
        raise ValueError(f"KVNUMBA_BATCH_COPY must be one of {', '.join(BATCH_COPY_ROUTES)}, got {value!r}")
    return value
