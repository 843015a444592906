"""Cache views, the two sides of ``kv.copy``, one module per family of layouts: each view class declares all the
package reads of its layout (``base.CacheView``), and registers itself by its ``name``. Every module here is
imported, so a layout added as a module is registered."""
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
