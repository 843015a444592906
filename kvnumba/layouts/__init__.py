"""Cache views, the two sides of ``kv.copy``: buffers plus a layout plus geometry. One module per family of
layouts (``layer_first``, ``page_first``, ``page_head``, ``page_unified``, ``vllm``); each view class declares
everything the package knows of its layout: its shapes, address parts and bounds, NumPy picture and routes
(``base.CacheView``). A class registers itself by declaring its ``name``; ``view_class`` reads a name, ``NAMES``
holds them all. A module added to this package is imported here, and so registered.
"""
import importlib
import pkgutil

from .base import NAMES, CacheView, Geometry, picture, registered, view_class, view_name
from .layer_first import LayerFirst, LayerTable
from .page_first import PageFirst, PageFirstDirect
from .page_head import PageHead
from .page_unified import PageUnified
from .vllm import VllmFlashAttn, VllmFlashInfer

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

BUILT_IN = registered()
"""kvnumba's view classes, in the order declared."""

__all__ = ["BUILT_IN", "NAMES", "CacheView", "Geometry", "LayerFirst", "LayerTable", "PageFirst", "PageFirstDirect",
           "PageHead", "PageUnified", "VllmFlashAttn", "VllmFlashInfer", "picture", "registered", "view_class",
           "view_name"]
