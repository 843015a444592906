"""The kernels' parameter block, defined once: the names, order and packing of the int64 scalars every
kvnumba kernel takes. ``KernelArgs``: the register kernel's, what changes per call first (``pack_call``
rewrites that prefix of a plan's block); ``StagedArgs``: then ``STAGED_EXTRA``. Kernels name their
parameters in this order (``check_parameters``), and plans fill blocks by name.
"""
import struct
from collections import namedtuple
from typing import NamedTuple

NO_LIMIT = 2**63 - 1  # a token bound that bounds nothing


class KernelArgs(NamedTuple):
    """The kernel's parameters, in order. Addresses are plain integers; sizes are in bytes."""

    src_indices: int  # address of num_items int64 token indices, readable by the kernel
    dst_indices: int
    num_items: int
    items_per_warp: int
    first_layer: int
    src_token_limit: int  # items whose source token is outside [0, limit) are skipped and flagged
    dst_token_limit: int  # the same for the destination token
    src_k: int  # buffer base, or the address of a uint64 layer table for Layout.LAYER_TABLE
    dst_k: int
    src_v: int  # 0 for MLA
    dst_v: int
    num_layers: int
    item_size: int
    src_layout_dim: int
    dst_layout_dim: int
    src_page_size: int  # paged layouts; 1 otherwise
    dst_page_size: int
    head_num: int  # heads a copy goes by when a side splits them; 1 otherwise
    error_flag: int  # address of an int64 set to 1 when an item is skipped (0: none)


PER_CALL_ARGS = KernelArgs._fields.index("first_layer")  # src_indices .. items_per_warp: written by every call
PER_LAYER_ARGS = KernelArgs._fields.index("src_k")  # .. dst_token_limit: what a call writes
pack_call = struct.Struct(f"{PER_LAYER_ARGS}q").pack_into  # pack_call(block view, 0, *the first PER_LAYER_ARGS)

# The staged kernel's three more: its tensor maps' device address (K's maps for box lengths 1, 2, 4, ..
# 2**max_run_log2, then V's) and its run limits.
STAGED_EXTRA = ("maps", "max_run_log2", "min_run")
StagedArgs = namedtuple("StagedArgs", KernelArgs._fields + STAGED_EXTRA)  # type: ignore[misc]  # fields: computed


def signature(args):
    """The Numba signature of a kernel taking ``args`` (a parameter-block type): int64 scalars only. Its first
    ``PER_LAYER_ARGS`` fields must be ``KernelArgs``' (``TypeError`` else): every call writes them with ``pack_call``."""
    if args._fields[:PER_LAYER_ARGS] != KernelArgs._fields[:PER_LAYER_ARGS]:
        raise TypeError(f"{args.__name__} must begin with {', '.join(KernelArgs._fields[:PER_LAYER_ARGS])}, the "
                        "parameters every call writes (kvnumba.kernels.params.pack_call)")
    return "void(" + ", ".join(["int64"] * len(args._fields)) + ")"


SIGNATURE = signature(KernelArgs)


def parameters(function):
    """The parameter names of a kernel's Python function, in order."""
    code = function.__code__
    return code.co_varnames[:code.co_argcount]


def check_parameters(function, args):
    """``TypeError`` unless ``function`` (a kernel's Python function) takes ``args``' fields, in order."""
    if parameters(function) != args._fields:
        raise TypeError(f"{function.__name__} must take {', '.join(args._fields)} (kvnumba.kernels.params."
                        f"{args.__name__}), in that order; it takes {', '.join(parameters(function))}")
