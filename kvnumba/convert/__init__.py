"""Whole-cache layout conversion: ``kv.convert`` of an array or a file, and what ``kvnumba convert`` runs
(``api``: the call and its types; one module per job, listed in docs/architecture.md)."""
from .api import LayoutArg, LayoutName, UnifiedArg, convert
from .shapes import converted_shape

__all__ = ["LayoutArg", "LayoutName", "UnifiedArg", "convert", "converted_shape"]
