"""Every environment variable kvnumba reads, in one place, read once at import."""
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
