"""NIXL's Python API, found once, on first use (``kvnumba.remote`` imports without it): ``nixl_cu13``,
``nixl_cu12`` or the ``nixl`` meta package. Each wheel declares torch as a dependency, but its API imports
torch only for torch tensors, and kvnumba hands it address lists: ``pip install --no-deps`` is enough.
``call`` is the one helper every NIXL call goes through."""
from __future__ import annotations

import importlib
from typing import Any

from .. import errors

CANDIDATES = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")
INSTALL = ('pip install --no-deps "nixl-cu13>=1.5.1,<2" ("nixl-cu12>=1.5.1,<2" with a CUDA 12 driver; NIXL\'s '
           'Python API needs only numpy), or pip install -e ".[nixl]" from kvnumba\'s checkout (pulls torch)')

_module: Any = None


def api() -> Any:
    """The NIXL API module (``nixl_agent``, ``nixl_agent_config``), or ``ImportError`` saying how to get it."""
    global _module
    if _module is None:
        errors = []
        for name in CANDIDATES:
            try:
                _module = importlib.import_module(name)
                break
            except ImportError as error:
                errors.append(f"{name}: {error}")
        else:
            raise ImportError("kvnumba.remote needs NIXL's Python API: " + INSTALL + ". Tried " + "; ".join(errors))
    return _module


def available() -> bool:
    """Whether NIXL's Python API can be imported here."""
    try:
        api()
    except ImportError:
        return False
    return True


def name() -> str:
    """The module NIXL was found as, e.g. ``nixl_cu13._api``."""
    return str(api().__name__)


def call(what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """A NIXL call; its failure as ``RemoteError`` naming the call and NIXL's error."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - NIXL raises its own classes (nixlNotFoundError, ...)
        text = str(error) or type(error).__name__
        raise errors.RemoteError(f"{what} failed: {type(error).__name__}: {text}") from error
