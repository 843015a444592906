"""A copy-engine entry point's plan (validated once) and its per-call path: no kernels, copies.

- ``transfer_kv_direct``: layer-first to layer-first; runs of indices where source and destination
  both advance by one are merged, one copy per run per layer, all submitted as one
  ``cudaMemcpyBatchAsync`` where the stream allows it (else one ``cudaMemcpyAsync`` each).
- ``transfer_kv_per_layer_direct_pf_lf`` / ``transfer_kv_all_layer_direct_lf_pf``: between
  layer-first buffers and page-first-direct buffers ``[num_pages, num_layers, page_size, ...]``;
  one copy per (page, layer, K/V), all submitted as one ``cudaMemcpyBatchAsync`` where the driver,
  binding and stream allow it, else page by page (``kvnumba.driver.batch_copy``).

Indices may live on the host or the device; like the seed, they are brought to the host first (a
synchronous device-to-host copy for device indices). Address arithmetic is vectorised with NumPy.
"""
import threading

import numpy as np

from ..arrays import HOST
from ..checks import bounds, guard, validate
from ..checks.devices import one_device
from ..driver import batch_copy, capture
from ..driver.devices import on_device
from ..driver.streams import stream_handle
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError
from ..memo import BoundedMemo
from . import routes
from .spec import PAGE_FIRST_DIRECT


class DirectPlan:
    """The validated part of one copy-engine call: buffer lists, their addresses, the device."""

    raw_tables = False
    tables = False

    def __init__(self, spec, geometry, strict):
        self.spec = spec
        # layer-first lists on both sides: merged runs; else one side is page-first-direct: pages
        self.runs = PAGE_FIRST_DIRECT not in (spec.src_layout, spec.dst_layout)
        if self.runs:
            src, dst = self._init_runs(geometry)
        else:
            src, dst = self._init_pages(geometry)
        self.device = one_device([(f"{name}[{i}]", info.device) for name, infos in
                                  ((self.src_name, src), (self.dst_name, dst)) for i, info in enumerate(infos)])
        self.uses_torch = any(info.is_torch for info in src + dst)
        self.empty = not src

    # --- transfer_kv_direct ----------------------------------------------------------------------

    def _init_runs(self, geometry):
        self.src_name, self.dst_name = "src_layers", "dst_layers"
        src = validate.buffer_list("src_layers", geometry["src_layers"], minimum=0)
        dst = validate.buffer_list("dst_layers", geometry["dst_layers"], minimum=0)
        if len(src) != len(dst):
            raise ValueError(f"src_layers and dst_layers must have the same number of layers, "
                             f"got {len(src)} and {len(dst)}")
        for j, (s, d) in enumerate(zip(src, dst)):
            if validate.row_bytes(s) != validate.row_bytes(d):
                raise ValueError(f"src_layers[{j}] and dst_layers[{j}] must have the same bytes per row, "
                                 f"got {validate.row_bytes(s)} and {validate.row_bytes(d)}")
            validate.same_dtype([(f"src_layers[{j}]", s), (f"dst_layers[{j}]", d)])
            validate.writable(f"dst_layers[{j}]", d)
        self.page_size = validate.integer("page_size", geometry["page_size"], minimum=1, maximum=validate.MAX_SIZE)
        self.rows = np.array([validate.row_bytes(i) for i in src], dtype=np.int64)
        self.src_base = np.array([i.ptr for i in src], dtype=np.int64)
        self.dst_base = np.array([i.ptr for i in dst], dtype=np.int64)
        self.src_tokens = min((i.shape[0] for i in src), default=0)
        self.dst_tokens = min((i.shape[0] for i in dst), default=0)
        # The batch call's location hints: one per side, so a side's layers must share a kind of memory.
        self.src_device, self.dst_device = _side_device(src), _side_device(dst)
        return src, dst

    def _run_merged(self, s_idx, d_idx, handle):
        # Runs: a new run starts wherever either side does not advance by exactly one.
        starts, lengths = routes.runs(s_idx, d_idx, 1)
        rows = self.rows
        # (run, layer), runs outer as in the seed; one batch where the stream allows it.
        srcs = (np.multiply.outer(s_idx[starts], rows) + self.src_base).reshape(-1)
        dsts = (np.multiply.outer(d_idx[starts], rows) + self.dst_base).reshape(-1)
        sizes = np.multiply.outer(lengths, rows).reshape(-1)
        mixed = MIXED in (self.src_device, self.dst_device)
        batch_copy.copy_many(dsts, srcs, sizes, handle, src_device=None if mixed else self.src_device,
                             dst_device=None if mixed else self.dst_device, batch=not mixed)

    # --- the page-first-direct pair --------------------------------------------------------------

    def _init_pages(self, geometry):
        self.lf_to_pf = self.spec.dst_layout == PAGE_FIRST_DIRECT
        lf_name, pf_name = ("src_ptrs", "dst_ptrs") if self.lf_to_pf else ("dst_ptrs", "src_ptrs")
        self.lf_name, self.pf_name = lf_name, pf_name
        pf = _page_first(pf_name, geometry[pf_name])
        is_mla = len(pf) == 1
        lf, row = _layer_first(lf_name, geometry[lf_name], is_mla)
        num_layers = len(lf) if is_mla else len(lf) // 2
        validate.same_dtype([(f"{pf_name}[{i}]", info) for i, info in enumerate(pf)]
                            + [(f"{lf_name}[{i}]", info) for i, info in enumerate(lf)])
        page_size = validate.integer("page_size", geometry["page_size"], minimum=1, maximum=validate.MAX_SIZE)
        pages_total, layers_total, slots = pf[0].shape[:3]
        if slots != page_size:
            raise ValueError(f"{pf_name}[0] must be [num_pages, num_layers, page_size={page_size}, ...], "
                             f"got shape {pf[0].shape}")
        layer_bytes = pf[0].nbytes // (pages_total * layers_total)  # one (page, layer) slot
        if layer_bytes != page_size * row:
            raise ValueError(f"{pf_name}[0] holds {layer_bytes // page_size} bytes per token, {lf_name} {row}: "
                             "the per-token bytes must match")
        first_layer = 0
        if "layer_id" in geometry:
            first_layer = validate.integer("layer_id", geometry["layer_id"], minimum=0, maximum=validate.MAX_SIZE)
        if first_layer + num_layers > layers_total:
            what = f"layer_id={first_layer} + " if "layer_id" in geometry else ""
            raise ValueError(f"{what}{num_layers} layers in {lf_name} exceed the {layers_total} layers of {pf_name}")
        for i, info in enumerate(pf if self.lf_to_pf else lf):
            validate.writable(f"dst_ptrs[{i}]", info)
        self.page_size, self.row, self.layer_bytes = page_size, row, layer_bytes
        self.pages_total, self.layers_total = pages_total, layers_total
        self.lf_tokens = min(i.shape[0] for i in lf)
        kinds = len(pf)  # K and V, or MLA's one
        self.lf_base = np.array([info.ptr for info in lf], dtype=np.int64).reshape(kinds, num_layers)
        self.pf_base = np.array([info.ptr for info in pf], dtype=np.int64)
        layers = np.arange(first_layer, first_layer + num_layers, dtype=np.int64)
        # What a page's addresses add to its token (or page) offset, shaped (1, layer, K/V).
        self.lf_layer_base = self.lf_base.T[None, :, :]
        self.pf_layer_base = self.pf_base[None, None, :] + (layers * layer_bytes)[None, :, None]
        self.page_bytes = layers_total * layer_bytes
        self.scratch = BoundedMemo(64)  # pages per call -> _Scratch
        self.lf_device, self.pf_device = _device(lf[0]), _device(pf[0])
        self.src_name, self.dst_name = ("src_ptrs", "dst_ptrs")
        return (lf, pf) if self.lf_to_pf else (pf, lf)

    def _run_pages(self, lf_idx, pf_idx, handle):
        page_size, row = self.page_size, self.row
        count = len(lf_idx)
        scratch = self._scratch(count // page_size)
        first = scratch.firsts
        lf_idx_name, pf_idx_name = ("src_indices", "dst_indices") if self.lf_to_pf else ("dst_indices", "src_indices")
        tokens = lf_idx[::page_size]  # first token of each page on the layer-first side (a view: no copy)
        pages_raw = pf_idx[::page_size]
        bounds.check_indices(lf_idx_name, tokens, max(self.lf_tokens - page_size + 1, 0),
                             f"the first token of a page of {page_size} tokens in {self.lf_name}", positions=first)
        bounds.check_indices(pf_idx_name, pages_raw, self.pages_total * page_size,
                             f"the {self.pages_total} pages of {self.pf_name}", positions=first)
        # Addresses shaped (page, layer, K/V): the seed's order, pages outer; written into arrays this
        # plan keeps (their addresses known), under a lock: threads may share a plan.
        with scratch.lock:
            np.multiply(tokens, row, out=scratch.offsets)
            np.add(self.lf_layer_base, scratch.offsets[:, None, None], out=scratch.lf_addr)
            np.floor_divide(pages_raw, page_size, out=scratch.offsets)
            scratch.offsets *= self.page_bytes
            np.add(self.pf_layer_base, scratch.offsets[:, None, None], out=scratch.pf_addr)
            lf_addr, pf_addr = scratch.lf_addr.reshape(-1), scratch.pf_addr.reshape(-1)
            if self.lf_to_pf:
                srcs, dsts, src_device, dst_device = lf_addr, pf_addr, self.lf_device, self.pf_device
                addresses = (scratch.pf_address, scratch.lf_address, scratch.sizes_address)
            else:
                srcs, dsts, src_device, dst_device = pf_addr, lf_addr, self.pf_device, self.lf_device
                addresses = (scratch.lf_address, scratch.pf_address, scratch.sizes_address)
            batch_copy.copy_many(dsts, srcs, scratch.sizes, handle, src_device=src_device, dst_device=dst_device,
                                 addresses=addresses)

    def _scratch(self, pages):
        """The arrays a call of ``pages`` pages computes its copies into (one set per page count)."""
        scratch = self.scratch.get(pages)
        if scratch is None:
            scratch = self.scratch.remember(pages, _Scratch(pages, self.page_size, self.lf_layer_base.shape,
                                                            self.page_size * self.row))
        return scratch

    # --- the per-call path -------------------------------------------------------------------------

    def run(self, src_indices, dst_indices, stream, check):
        """Check the indices, bring them to the host, copy; ``check``: wait for the copies."""
        guard.raise_pending()
        src_info, dst_info = validate.indices(src_indices, dst_indices)
        count = src_info.shape[0]
        validate.page_size(self.page_size, count)
        uses_torch = self.uses_torch or src_info.is_torch or dst_info.is_torch
        handle = stream_handle(stream, self.device if uses_torch else None)
        refuse_in_capture(self.spec.name, handle)
        for name, info in (("src_indices", src_info), ("dst_indices", dst_info)):
            if info.device != HOST and not SIMULATOR and info.device != self.device:
                raise DeviceMismatchError(f"{name} is on cuda:{info.device} but the buffers are on cuda:{self.device}")
        if count == 0 or self.empty:
            return
        with on_device(self.device):
            s_idx, d_idx = bounds.host_indices(src_info), bounds.host_indices(dst_info)
            if self.runs:
                bounds.check_indices("src_indices", s_idx, self.src_tokens, "the rows of src_layers")
                bounds.check_indices("dst_indices", d_idx, self.dst_tokens, "the rows of dst_layers")
                self._run_merged(s_idx, d_idx, handle)
            elif self.lf_to_pf:
                self._run_pages(s_idx, d_idx, handle)
            else:
                self._run_pages(d_idx, s_idx, handle)
            if check or guard.ALWAYS_CHECK:
                guard.synchronize(handle)


def refuse_in_capture(name, handle):
    """``CaptureError`` if stream ``handle`` is being captured: a copy-engine entry point reads its indices on the
    host and submits copies with their addresses, which a graph cannot replay with new indices."""
    capture.refuse(handle, f"{name} (a copy-engine entry point: it reads the indices on the host)",
                   "use a kernel entry point, or kv.copy(..., route='kernel'), with GPU index arrays")


class _Scratch:
    """One page count's copy arrays: the page offsets, both sides' addresses shaped (page, layer,
    K/V), the sizes (every copy is one page of one layer) and the data addresses of the three the
    batch call reads."""

    def __init__(self, pages, page_size, layer_shape, page_bytes):
        self.lock = threading.Lock()
        self.firsts = np.arange(0, pages * page_size, page_size)
        self.offsets = np.empty(pages, np.int64)
        shape = (pages, *layer_shape[1:])
        self.lf_addr = np.empty(shape, np.int64)
        self.pf_addr = np.empty(shape, np.int64)
        self.sizes = np.full(self.lf_addr.size, page_bytes, np.int64)
        self.lf_address, self.pf_address, self.sizes_address = (
            a.__array_interface__["data"][0] for a in (self.lf_addr, self.pf_addr, self.sizes))


def _layer_first(name, obj, is_mla):
    infos = validate.buffer_list(name, obj, minimum=1 if is_mla else 2)
    if not is_mla and len(infos) % 2:
        raise ValueError(f"{name} must hold K layers then V layers (an even count), got {len(infos)}")
    row = validate.row_bytes(infos[0])
    for i, info in enumerate(infos[1:], 1):
        if validate.row_bytes(info) != row:
            raise ValueError(f"{name}[{i}] has {validate.row_bytes(info)} bytes per token, {name}[0] has {row}")
    return infos, row


def _page_first(name, obj):
    infos = validate.buffer_list(name, obj)
    if len(infos) not in (1, 2):
        raise ValueError(f"{name} must hold 2 page-first buffers (K, V) or 1 (MLA), got {len(infos)}")
    for i, info in enumerate(infos):
        if len(info.shape) < 3:
            raise ValueError(f"{name}[{i}] must be [num_pages, num_layers, page_size, ...], got shape {info.shape}")
        if 0 in info.shape[:3]:
            raise ValueError(f"{name}[{i}] must have at least one page, layer and slot, got shape {info.shape}")
    if len(infos) == 2 and (infos[0].shape != infos[1].shape):
        raise ValueError(f"{name}[0] and {name}[1] must have the same shape, got {infos[0].shape} and {infos[1].shape}")
    return infos


def _side_device(infos):
    """The batch call's location hint for a list of layers: their device, or None for host memory;
    ``MIXED`` for a list that mixes kinds of memory (one hint serves every copy of a side)."""
    places = {info.device for info in infos}
    if len(places) > 1:
        return MIXED
    return None if not places or places == {HOST} else places.pop()


MIXED = "mixed"  # a side of host and GPU layers: its copies go one by one (cudaMemcpyDefault finds each kind)


def _device(info):
    """The batch call's location hint for one side: its device ordinal, or None for host memory."""
    return None if info.device == HOST else info.device
