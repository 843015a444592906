"""One integer argument, checked: the rule every entry point, view and lane applies to a count, size or index
(``kvnumba.checks.validate`` re-exports it). It sits below every wing, since the driver's lanes check their
arguments with it too."""
import operator
from typing import Any


def integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int; ``TypeError`` if it is not an integer, ``ValueError`` if out of range."""
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value  # the common case, first: this runs several times per call
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value
