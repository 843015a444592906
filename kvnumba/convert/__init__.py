"""Whole-cache layout conversion: ``kv.convert`` of an array or a file, and what ``kvnumba convert`` runs.

- ``api``: ``kv.convert`` itself, its engines and its types (``LayoutName``, ``LayoutArg``);
- ``unified``: SGLang's page-unified pool (K and V in one array) converted from and to a pair ``(k, v)``;
  ``pool_files``: K and V of a file paired by name with its pool (``k``, ``v`` and ``kv``);
- ``shapes``: one whole-cache tensor in a layout, read through its view class (dimensions, converted
  shape, the NumPy picture both engines and the file converter use);
- ``files``: ``.npy``, ``.npz`` and ``.safetensors`` files converted in chunks, all or nothing; ``inputs``
  checks and describes the input, ``outputs`` writes the output (under a temporary name), ``signals`` turns
  SIGINT, SIGTERM and SIGHUP into ``Interrupted`` meanwhile;
- ``safetensors``: the ``.safetensors`` format, read and checked, written through its library;
- ``quantised``: FP8 cache files (``dtype=``, ``--dtype``): the file format, quantising and dequantising.
"""
from .api import LayoutArg, LayoutName, UnifiedArg, convert
from .shapes import converted_shape

__all__ = ["LayoutArg", "LayoutName", "UnifiedArg", "convert", "converted_shape"]
