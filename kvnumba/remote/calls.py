"""The one helper every NIXL call goes through (``kvnumba.remote.agent`` and ``kvnumba.remote.handles``)."""
from __future__ import annotations

from typing import Any

from .. import errors


def call(what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """A NIXL call; its failure as ``RemoteError`` naming the call and NIXL's error."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - NIXL raises its own classes (nixlNotFoundError, ...)
        text = str(error) or type(error).__name__
        raise errors.RemoteError(f"{what} failed: {type(error).__name__}: {text}") from error


__all__ = ["call"]
