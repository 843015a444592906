"""Argument checks shared by every entry point. Each error names the argument, the rule and what
was given; nothing is launched or written before all checks pass."""
import operator

from .arrays import array_info

MAX_THREADS_PER_BLOCK = 1024
_TABLE_DTYPES = ("uint64", "int64")


def integer(name, value, minimum=None, maximum=None):
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


def item_size(value, head_num=1):
    """Item size in bytes: positive, a multiple of 8, and (page-head) split into 8-byte-multiple heads."""
    value = integer("item_size", value, minimum=1)
    if value % 8:
        raise ValueError(f"item_size must be a multiple of 8 bytes, got {value}")
    if head_num > 1 and value % (8 * head_num):
        raise ValueError(
            f"item_size / head_num must be a multiple of 8 bytes, got {value} / {head_num} = {value / head_num:g}"
        )
    return value


def launch_config(block_quota, num_warps_per_block):
    block_quota = integer("block_quota", block_quota, minimum=1, maximum=2**31 - 1)
    warps = integer("num_warps_per_block", num_warps_per_block, minimum=1, maximum=MAX_THREADS_PER_BLOCK // 32)
    return block_quota, warps


def indices(src_indices, dst_indices):
    """Both index arrays: int64, one-dimensional, of equal length."""
    infos = []
    for name, obj in (("src_indices", src_indices), ("dst_indices", dst_indices)):
        info = array_info(obj, name)
        if info.dtype != "int64":
            raise TypeError(f"{name} must hold int64 token indices, got dtype {info.dtype}")
        if len(info.shape) != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {info.shape}")
        infos.append(info)
    src, dst = infos
    if src.shape[0] != dst.shape[0]:
        raise ValueError(
            f"src_indices and dst_indices must have the same length, got {src.shape[0]} and {dst.shape[0]}"
        )
    return src, dst


def layer_table(name, obj, num_layers):
    """A 1-D table of ``num_layers`` 8-byte base addresses (see ``kvnumba.layer_table``)."""
    info = array_info(obj, name)
    if info.dtype not in _TABLE_DTYPES:
        raise TypeError(f"{name} must be a uint64 table of layer addresses, got dtype {info.dtype}")
    if len(info.shape) != 1 or info.shape[0] != num_layers:
        raise ValueError(f"{name} must hold num_layers={num_layers} addresses, got shape {info.shape}")
    return info
