"""Every environment variable kvnumba reads, in one place, read once at import."""
import os


def env_flag(name):
    """A boolean variable: ``1``, ``true``, ``yes`` or ``on`` (any case) mean on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
