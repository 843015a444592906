"""kvnumba: SGLang's KV-cache transfer kernels (``sgl_kernel.kvcacheio``) in pure Python with Numba-CUDA.

``import kvnumba as kv`` stands in for ``sgl_kernel.kvcacheio``: same entry points, argument names,
order and defaults. Runs on a CUDA GPU, or without one on Numba's CUDA simulator (chosen by itself
when there is no CUDA driver, see ``kvnumba.driver.target``). ``kvnumba.reference`` is the NumPy oracle.

``import kvnumba`` itself never fails for a setting: a value kvnumba cannot use (``SettingError``), or
``KVNUMBA_REQUIRE_GPU=1`` without a GPU (``NoGpuError``), is raised by the first use of ``kvnumba.<name>``,
so that ``kvnumba info`` can still run and say what is wrong.
"""
from typing import TYPE_CHECKING

from ._version import __version__  # noqa: F401 - kvnumba.__version__
from .driver import target as _target  # first: picks the GPU or the simulator before numba.cuda is imported
from .errors import *  # noqa: F403 - every exception class, listed in errors.__all__
from . import errors, types

_SETUP_ERROR = None  # the SettingError or NoGpuError that stopped the imports below, if any
try:
    _target.require()
    from .convert import convert
    from .api.direct import (
        batch_copy_available,
        last_path,
        transfer_kv_all_layer_direct_lf_pf,
        transfer_kv_direct,
        transfer_kv_per_layer_direct_pf_lf,
    )
    from .api.copy import copy
    from .api.fp8_views import Fp8View, fp8_like
    from .api.nvfp4_views import Nvfp4View
    from .plan.routes import last_route
    from .driver.lanes import LaneStream, SmLanes, sm_count
    from .api.prepare_types import prepare
    from .api.transfer import Transfer, clear_plan_caches
    from .layouts import (
        CacheView,
        Geometry,
        LayerFirst,
        LayerTable,
        PageFirst,
        PageFirstDirect,
        PageHead,
        PageUnified,
        VllmFlashAttn,
        VllmFlashInfer,
    )
    from .checks.guard import check_errors
    from .api.resident import LayerSignal, ResidentLoad, load_resident
    from .api.entry_points import (
        transfer_kv_all_layer,
        transfer_kv_all_layer_lf_pf,
        transfer_kv_all_layer_lf_ph,
        transfer_kv_all_layer_mla,
        transfer_kv_all_layer_mla_lf_pf,
        transfer_kv_per_layer,
        transfer_kv_per_layer_mla,
        transfer_kv_per_layer_mla_pf_lf,
        transfer_kv_per_layer_pf_lf,
        transfer_kv_per_layer_ph_lf,
    )
    from .api.tables import layer_table
    from .types import *  # noqa: F403 - the typing protocols, listed in types.__all__
except (SettingError, NoGpuError) as _error:
    _SETUP_ERROR = _error

__all__ = [
    "CacheView",
    "Geometry",
    "LaneStream",
    "LayerFirst",
    "LayerTable",
    "PageFirst",
    "PageFirstDirect",
    "PageHead",
    "PageUnified",
    "SmLanes",
    "VllmFlashAttn",
    "VllmFlashInfer",
    "copy",
    "LayerSignal",
    "ResidentLoad",
    "load_resident",
    "Fp8View",
    "Nvfp4View",
    "fp8_like",
    "Transfer",
    "batch_copy_available",
    "check_errors",
    "clear_plan_caches",
    "convert",
    "last_path",
    "last_route",
    "layer_table",
    "prepare",
    "sm_count",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]
__all__ += errors.__all__  # the exception classes (kvnumba.errors)
__all__ += types.__all__  # the typing protocols (kvnumba.types)

if not TYPE_CHECKING:
    if _SETUP_ERROR is not None:  # every public name but the exception classes raises it, each time
        for _name in __all__:
            if _name not in errors.__all__:
                globals().pop(_name, None)

        def __getattr__(name):
            if name in __all__:
                raise type(_SETUP_ERROR)(str(_SETUP_ERROR))
            raise AttributeError(f"module 'kvnumba' has no attribute {name!r}")
