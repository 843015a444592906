"""Argument checks shared by every entry point. Each error names the argument, the rule and what
was given; nothing is launched or written before all checks pass."""
import numpy as np

from ..arrays import array_info
from ..integers import integer  # noqa: F401 - every check's integer rule (below the driver: lanes use it too)
from ..driver.launch import MAX_QUOTA, MAX_WARPS

# Every size stays far below 2**63, so the kernels' int64 address arithmetic cannot overflow.
MAX_SIZE = 2**48
_TABLE_DTYPES = ("uint64", "int64")


def item_size(value, head_num=1):
    """Item size in bytes: positive, a multiple of 8, and (page-head) split into 8-byte-multiple heads."""
    value = integer("item_size", value, minimum=1, maximum=MAX_SIZE)
    if value % 8:
        raise ValueError(f"item_size must be a multiple of 8 bytes, got {value}")
    if head_num > 1 and value % (8 * head_num):
        raise ValueError(
            f"item_size / head_num must be a multiple of 8 bytes, got {value} / {head_num} = {value / head_num:g}"
        )
    return value


def launch_config(block_quota, num_warps_per_block):
    block_quota = integer("block_quota", block_quota, minimum=1, maximum=MAX_QUOTA)
    warps = integer("num_warps_per_block", num_warps_per_block, minimum=1, maximum=MAX_WARPS)
    return block_quota, warps


def index_info(name, obj):
    """One index array: int64 in native byte order, one-dimensional, 8-byte aligned."""
    info = array_info(obj, name)
    if info.dtype != "int64":
        order = " (non-native byte order: convert with .astype(numpy.int64))" if info.dtype.endswith("int64") else ""
        raise TypeError(f"{name} must hold int64 token indices, got dtype {info.dtype}{order}")
    if len(info.shape) != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {info.shape}")
    if info.ptr & 7:
        aligned(name, info)
    return info


def same_length(src, dst):
    if src.shape[0] != dst.shape[0]:
        raise ValueError(
            f"src_indices and dst_indices must have the same length, got {src.shape[0]} and {dst.shape[0]}"
        )


def indices(src_indices, dst_indices):
    """Both index arrays (``index_info``), of equal length."""
    src, dst = index_info("src_indices", src_indices), index_info("dst_indices", dst_indices)
    same_length(src, dst)
    return src, dst


def layer_table(name, obj, num_layers):
    """A 1-D table of ``num_layers`` 8-byte base addresses (see ``kvnumba.layer_table``)."""
    info = array_info(obj, name)
    if info.ptr & 7:
        aligned(name, info)
    if info.dtype not in _TABLE_DTYPES:
        raise TypeError(f"{name} must be a uint64 table of layer addresses, got dtype {info.dtype}")
    if len(info.shape) != 1 or info.shape[0] != num_layers:
        raise ValueError(f"{name} must hold num_layers={num_layers} addresses, got shape {info.shape}")
    return info


def buffer_list(name, obj, minimum=1):
    """A Python list (or tuple) of at least ``minimum`` arrays; elements are named ``name[i]``."""
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"{name} must be a list of arrays (one per layer, K layers then V), got {type(obj).__name__}")
    if len(obj) < minimum:
        raise ValueError(f"{name} must hold at least {minimum} array{'s' if minimum > 1 else ''}, got {len(obj)}")
    infos = [array_info(item, f"{name}[{i}]") for i, item in enumerate(obj)]
    for i, info in enumerate(infos):
        if len(info.shape) == 0 or info.shape[0] == 0:
            raise ValueError(f"{name}[{i}] must have at least one row (token) on dim 0, got shape {info.shape}")
    return infos


def row_bytes(info):
    return info.nbytes // info.shape[0]


def same_dtype(named_infos):
    first_name, first = named_infos[0]
    for name, info in named_infos[1:]:
        if info.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {info.dtype} but {first_name} has {first.dtype}: "
                            "the direct copies move raw bytes, dtypes must match")


def page_size(value, count):
    """``page_size`` positive and dividing the number of indices ``count``."""
    value = integer("page_size", value, minimum=1)
    if count % value:
        raise ValueError(f"the number of indices ({count}) must be a multiple of page_size ({value})")
    return value


def layout_dim(name, value, item_size, layers_needed, head_num=1, layer_id=None):
    """A page-first or page-head ``*_layout_dim``: a multiple of ``8 * head_num`` bytes, and at least
    ``layers_needed * item_size`` (``layer_id + 1`` layers for a per-layer call)."""
    value = integer(name, value, minimum=0, maximum=MAX_SIZE)
    unit = 8 * head_num
    if value % unit:
        per = f" (8 bytes per head x head_num={head_num})" if head_num > 1 else ""
        raise ValueError(f"{name} must be a multiple of {unit} bytes{per}, got {value}")
    if value < layers_needed * item_size:
        if layer_id is not None:
            raise ValueError(
                f"layer_id={layer_id} is out of range for {name}={value}: a token slot of {value} bytes holds "
                f"{value // item_size} items of item_size={item_size}, so layer_id must be < {value // item_size} "
                f"({name} must be >= (layer_id + 1) * item_size = {layers_needed * item_size})")
        raise ValueError(f"{name} must be >= num_layers * item_size = {layers_needed} * {item_size} = "
                         f"{layers_needed * item_size} (one item per layer in a token slot), got {value}")
    return value


def aligned(name, info):
    if info.ptr % 8:
        raise ValueError(f"{name} must start at an 8-byte aligned address, got 0x{info.ptr:x} "
                         f"(a view at an offset of {info.ptr % 8} bytes? copy it with .contiguous()/.copy())")


def writable(name, info):
    """A destination must be writable: a read-only array's memory may not be ours to change (a read-only memory
    map faults when written)."""
    if info is not None and not info.writable:
        kind = "NumPy array" if isinstance(info.obj, np.ndarray) else f"{type(info.obj).__name__} array"
        raise ValueError(f"{name} is a read-only {kind}; a destination must be writable")
