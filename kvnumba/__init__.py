"""kvnumba: SGLang's KV-cache transfer kernels (``sgl_kernel.kvcacheio``) in pure Python with Numba-CUDA.

``import kvnumba as kv`` stands in for ``sgl_kernel.kvcacheio``: same entry points, argument names,
order and defaults. Runs on a CUDA GPU, or without one on Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``). ``kvnumba.reference`` is the NumPy oracle.
"""
from .convert import CacheLayout, convert
from .api.direct import (
    batch_copy_available,
    last_path,
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)
from .api.copy import copy
from .api.transfer import Transfer, prepare
from .api.views import (
    CacheView,
    Geometry,
    LayerFirst,
    LayerTable,
    PageFirst,
    PageFirstDirect,
    PageHead,
    VllmFlashAttn,
    VllmFlashInfer,
)
from .checks.guard import check_errors
from .errors import (
    BadAddressError,
    CopyError,
    CudaError,
    DeviceMismatchError,
    ExportError,
    IndexOutOfRangeError,
    Interrupted,
    OverlapError,
    PageableMemoryError,
    RemoteError,
    StaleExportError,
)
from .kernels.layouts import Layout
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
from ._version import __version__  # noqa: F401 - kvnumba.__version__
from .types import (
    ArrayLike,
    CacheBuffer,
    CupyStreamLike,
    HandleStreamLike,
    StreamLike,
    SupportsCudaArrayInterface,
    SupportsCudaStream,
    TorchStreamLike,
    TorchTensorLike,
)

__all__ = [
    "BadAddressError",
    "CacheView",
    "Geometry",
    "LayerFirst",
    "LayerTable",
    "PageFirst",
    "PageFirstDirect",
    "PageHead",
    "VllmFlashAttn",
    "VllmFlashInfer",
    "copy",
    "CacheLayout",
    "CopyError",
    "CudaError",
    "DeviceMismatchError",
    "ExportError",
    "IndexOutOfRangeError",
    "Interrupted",
    "Layout",
    "OverlapError",
    "PageableMemoryError",
    "RemoteError",
    "StaleExportError",
    "Transfer",
    "batch_copy_available",
    "check_errors",
    "convert",
    "last_path",
    "layer_table",
    "prepare",
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
    # typing (kvnumba.types)
    "ArrayLike",
    "CacheBuffer",
    "CupyStreamLike",
    "HandleStreamLike",
    "StreamLike",
    "SupportsCudaArrayInterface",
    "SupportsCudaStream",
    "TorchStreamLike",
    "TorchTensorLike",
]
