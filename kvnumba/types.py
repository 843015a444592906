"""What kvnumba's signatures mean by an array and a stream: typing Protocols, matched by shape, so
none of torch, CuPy or Numba needs to be imported (or installed) to type-check a call.

- ``ArrayLike``: what ``kvnumba.arrays`` describes (its docstring says which memory each kind may be);
- ``StreamLike``: what ``stream=`` takes (``kvnumba.driver.streams``), one protocol per kind of stream
  object, besides a raw handle (an int; 0 is the default stream).

The protocols are ``runtime_checkable``: ``isinstance(s, kvnumba.SupportsCudaStream)`` checks that the
members exist, not their types.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeAlias, Union, runtime_checkable

import numpy as np

__all__ = [
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


@runtime_checkable
class SupportsCudaArrayInterface(Protocol):
    """GPU memory described by the CUDA Array Interface (CuPy arrays, Numba device arrays, CUDA tensors)."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...


@runtime_checkable
class TorchTensorLike(Protocol):
    """A torch tensor, known as kvnumba knows it: a data pointer and an element size."""

    def data_ptr(self) -> int: ...

    def element_size(self) -> int: ...


ArrayLike: TypeAlias = Union[SupportsCudaArrayInterface, TorchTensorLike, np.ndarray]
"""A buffer, table or index array: ``__cuda_array_interface__``, a NumPy array, or a torch tensor.
Objects offering only ``__array_interface__`` are refused (``TypeError``): wrap them with
``numpy.asarray``."""

CacheBuffer: TypeAlias = Union[ArrayLike, Sequence[ArrayLike]]
"""A cache view's K or V: one array, or a sequence of per-layer arrays (``kv.LayerFirst``)."""


@runtime_checkable
class SupportsCudaStream(Protocol):
    """The CUDA stream protocol: ``__cuda_stream__()`` returns ``(version, handle)``, the handle an int."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


@runtime_checkable
class TorchStreamLike(Protocol):
    """A ``torch.cuda.Stream``: its raw handle is ``cuda_stream``."""

    @property
    def cuda_stream(self) -> int: ...


@runtime_checkable
class CupyStreamLike(Protocol):
    """A ``cupy.cuda.Stream``: its raw handle is ``ptr``."""

    @property
    def ptr(self) -> int: ...


@runtime_checkable
class HandleStreamLike(Protocol):
    """A stream object with a ``handle``: an int, or a ctypes pointer (its ``value``; None is 0)."""

    @property
    def handle(self) -> Any: ...


StreamLike: TypeAlias = Union[int, SupportsCudaStream, TorchStreamLike, CupyStreamLike, HandleStreamLike]
"""What ``stream=`` takes besides None (None: torch's current stream for torch tensors, else the
default stream). ``bool`` is refused at run time although it is an ``int``."""
