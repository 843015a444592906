"""``kvnumba convert --dtype nvfp4`` (``kv.convert(path, ..., dtype="nvfp4")``): a file's bfloat16/float16 ``k`` and
``v`` quantised into vLLM's NVFP4 pages, the format of ``kvnumba.quant.nvfp4``.

The output holds one uint8 tensor ``kv_cache`` of shape ``(L, blocks, 2, block_size, heads, D/2 + D/16)``: layer
``l`` is the tensor vLLM allocates for that layer (``kv_cache_dtype="nvfp4"``, NHD, linear V scales), ``block_size``
the ``page_size`` given, and its bytes are vLLM's ``[K_data | K_scale | V_data | V_scale]`` pages. Global scales
are 1.0 (``k_scale`` and ``v_scale``: a ``.safetensors`` output says so in its ``__metadata__``,
``"kvnumba.nvfp4"``). The input's layout is ``src``; its tokens fill whole pages.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..quant import nvfp4
from ..quant.fp8 import PLAIN_DTYPES
from .inputs import Item, Source
from .shapes import canonical_view, dims

NAME = "kv_cache"
FORMAT_KEY = "kvnumba.nvfp4"  # __metadata__: the page order and the global scales


def paged(source: Source, src: Any, page_size: int | None, in_path: str) -> Source:
    """``source``'s ``k`` and ``v`` as one NVFP4 ``kv_cache`` item (see the module docstring); ``ValueError``
    naming what does not fit."""
    items = {item.name: item for item in source.items}
    if set(items) != {"k", "v"}:
        raise ValueError(f"{in_path}: --dtype nvfp4 quantises a cache's K and V into vLLM's pages: the file must hold "
                         f"exactly the tensors 'k' and 'v', it holds {', '.join(sorted(items)) or 'none'}")
    if page_size is None:
        raise ValueError("--dtype nvfp4 needs page_size (vLLM's block_size: tokens per page)")
    k, v = items["k"], items["v"]
    for item in (k, v):
        if item.dtype.name not in PLAIN_DTYPES:
            raise ValueError(f"{in_path}[{item.name}]: nvfp4 quantises bfloat16 or float16 tensors, this one is "
                             f"{item.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"{in_path}: k has the shape {k.shape}, v {v.shape}")
    d = dims(src, k.shape, page_size)
    if len(d.item) != 2 or d.item[1] % nvfp4.GROUP:
        raise ValueError(f"{in_path}[k]: nvfp4 needs items (heads, D) with D a multiple of {nvfp4.GROUP}, got "
                         f"{d.item} ({d.token_axis})")
    if d.tokens % page_size:
        raise ValueError(f"{in_path}[k]: {d.tokens} tokens do not fill pages of {page_size} ({d.token_axis})")
    heads, head_dim = d.item
    shape = (d.layers, d.tokens // page_size, 2, page_size, heads, nvfp4.full_dim(head_dim))

    def load() -> np.ndarray:
        out = np.empty(shape, np.uint8)
        for kind, item in enumerate((k, v)):
            values = canonical_view(np.asarray(item.load()), src, page_size)  # (L, blocks, P, H, D)
            for layer in range(d.layers):
                data, scales = nvfp4.regions(out[layer], heads, page_size, head_dim, "NHD")
                data[:, kind], scales[:, kind] = nvfp4.quantise(values[layer])
        return out

    metadata = dict(source.metadata or {}, **{FORMAT_KEY: "NHD k_scale=1.0 v_scale=1.0"})
    return Source([Item(NAME, shape, np.dtype(np.uint8), load)], source.compressed, metadata)
