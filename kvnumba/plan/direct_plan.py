"""A copy-engine entry point's plan (validated once) and its per-call path: no kernels, copies.

- ``transfer_kv_direct``: layer-first to layer-first; runs of indices where source and destination both
  advance by one are merged, one copy per run per layer;
- ``transfer_kv_per_layer_direct_pf_lf`` / ``transfer_kv_all_layer_direct_lf_pf``: between layer-first
  buffers and page-first-direct buffers ``[num_pages, num_layers, page_size, ...]``; one copy per (page,
  layer, K/V).

Every call's copies go as one ``cudaMemcpyBatchAsync`` where the driver, binding and stream allow it, else one
by one (``kvnumba.driver.batch_copy``). Indices are brought to the host first, as the seed does (a synchronous
copy for device indices); checking them and writing every copy is one compiled pass (``plan.direct_fill``)
into the batch arrays the plan keeps: per call, only the work that depends on the indices. With host indices
on a GPU that pass also asks about the stream and submits the copies (``direct_fill.submit_pages``/``_runs``),
so a call is its plan look-up, a few reads of its index arrays and one compiled call.
"""
import sys

import numpy as np

from ..arrays import HOST, array_info, typed_address
from ..checks import bounds, guard, validate
from ..checks.devices import call_stream, one_device
from ..driver import batch_copy, capture
from ..driver import bindings
from ..driver.devices import on_device
from ..driver.launch import stream_object
from ..driver.streams import torch_current_stream
from ..driver.target import SIMULATOR
from ..errors import DeviceMismatchError
from . import direct_fill
from .spec import PAGE_FIRST_DIRECT


class DirectPlan:
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
        self.device = one_device([(f"{name}[{i}]", info.device) for name, infos in zip(spec.buffers, (src, dst))
                                  for i, info in enumerate(infos)])
        self.batch.device = self.device  # the context its compiled submission expects current
        self.uses_torch = any(info.is_torch for info in src + dst)
        self.empty = not src
        self.staging = IndexStaging()

    def _init_runs(self, geometry):
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
        self.limits = np.array([min((i.shape[0] for i in infos), default=0) for infos in (src, dst)], np.int64)
        self.bases = np.array([self.rows, [i.ptr for i in src], [i.ptr for i in dst]], np.int64)
        # The batch call's location hints: one per side, so a side's layers must share a kind of memory.
        src_hint, dst_hint = _side_device(src), _side_device(dst)
        mixed = MIXED in (src_hint, dst_hint)
        self.batch = batch_copy.PreparedBatch(None if mixed else src_hint, None if mixed else dst_hint, batch=not mixed)
        return src, dst

    def _run_merged(self, s_idx, d_idx, handle):
        """One copy per run and layer (runs outer, as in the seed); under the batch's lock."""
        batch = self.batch
        out = batch.reserve(len(s_idx) * len(self.rows))
        count = direct_fill.fill_runs(s_idx, d_idx, self.limits, self.bases, out)
        if count == direct_fill.BAD:
            self._runs_error(s_idx, d_idx)
        batch.submit(count, handle)

    def _runs_error(self, s_idx, d_idx):
        bounds.check_indices("src_indices", s_idx, int(self.limits[0]), "the rows of src_layers")
        bounds.check_indices("dst_indices", d_idx, int(self.limits[1]), "the rows of dst_layers")
        raise AssertionError("fill_runs refused indices the bounds check accepts")  # pragma: no cover

    def _init_pages(self, geometry):
        self.lf_to_pf = self.spec.dst_layout == PAGE_FIRST_DIRECT
        lf_name, pf_name = ("src_ptrs", "dst_ptrs") if self.lf_to_pf else ("dst_ptrs", "src_ptrs")
        self.lf_name, self.pf_name = lf_name, pf_name
        pf = _page_first(pf_name, geometry[pf_name])
        kinds = len(pf)  # K and V, or MLA's one
        lf, row = _layer_first(lf_name, geometry[lf_name], kinds == 1)
        num_layers = len(lf) // kinds
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
        self.page_size = page_size
        lf_tokens = min(i.shape[0] for i in lf)
        layers = np.arange(first_layer, first_layer + num_layers, dtype=np.int64)
        # What a copy adds to its token offset (layer-first) and page offset (page-first), shaped (layer, K/V).
        lf_layer_base = np.array([info.ptr for info in lf], dtype=np.int64).reshape(kinds, num_layers).T
        pf_layer_base = np.array([info.ptr for info in pf], dtype=np.int64)[None, :] + (layers * layer_bytes)[:, None]
        self.bases = np.ascontiguousarray(np.stack([lf_layer_base, pf_layer_base]))
        self.copies_per_page = num_layers * kinds
        self.params = np.array([page_size, max(lf_tokens - page_size + 1, 0), pages_total * page_size, row,
                                layers_total * layer_bytes, page_size * row, int(self.lf_to_pf)], np.int64)
        sides = (lf, pf) if self.lf_to_pf else (pf, lf)
        self.batch = batch_copy.PreparedBatch(*(_side_device(infos[:1]) for infos in sides))
        return sides

    def _run_pages(self, lf_idx, pf_idx, handle):
        """One copy per (page, layer, K/V), pages outer (the seed's order); under the batch's lock."""
        page_size, batch = self.page_size, self.batch
        out = batch.reserve(len(lf_idx) // page_size * self.copies_per_page)
        count = direct_fill.fill_pages(lf_idx, pf_idx, self.params, self.bases, out)
        if count == direct_fill.BAD:
            self._page_error(lf_idx, pf_idx)
        batch.submit(count, handle)

    def _page_error(self, lf_idx, pf_idx):
        page_size = self.page_size
        lf_idx_name, pf_idx_name = ("src_indices", "dst_indices") if self.lf_to_pf else ("dst_indices", "src_indices")
        first = np.arange(0, len(lf_idx), page_size)
        # the layer-first side first, as SGLang's kernel reads them
        lf_limit, pf_limit = int(self.params[1]), int(self.params[2])
        bounds.check_indices(lf_idx_name, lf_idx[::page_size], lf_limit,
                             f"the first token of a page of {page_size} tokens in {self.lf_name}", positions=first)
        bounds.check_indices(pf_idx_name, pf_idx[::page_size], pf_limit,
                             f"the {pf_limit // page_size} pages of {self.pf_name}", positions=first)
        raise AssertionError("fill_pages refused indices the bounds check accepts")  # pragma: no cover

    def run(self, src_indices, dst_indices, stream, check):
        """Check the indices, bring them to the host, copy; ``check``: wait for the copies."""
        guard.raise_pending()
        device = self.device
        src, count, src_torch, src_at = _index(src_indices, "src_indices", device)
        dst, dst_count, dst_torch, dst_at = _index(dst_indices, "dst_indices", device)
        if count != dst_count:
            validate.same_length(array_info(src_indices, "src_indices"), array_info(dst_indices, "dst_indices"))
        page_size = self.page_size
        if count % page_size:
            validate.page_size(page_size, count)
        handle = call_stream(stream, device, self.uses_torch or src_torch or dst_torch)
        if count and not self.empty and self._submit_compiled(src, dst, src_at, dst_at, count, handle):
            if check or guard.ALWAYS_CHECK:
                guard.synchronize(handle)
            return
        refuse_in_capture(self.spec.name, handle)
        if count == 0 or self.empty:
            return
        with on_device(device):
            with self.batch.lock:  # from the indices' host copies to the submission: threads may share a plan
                s_idx, d_idx = _host_values(src), _host_values(dst)
                if s_idx is None or d_idx is None:  # indices on the GPU: copied to the host, as SGLang's are
                    s_idx, d_idx = self.staging.fetch(src, dst, count, device)
                if self.runs:
                    self._run_merged(s_idx, d_idx, handle)
                elif self.lf_to_pf:
                    self._run_pages(s_idx, d_idx, handle)
                else:
                    self._run_pages(d_idx, s_idx, handle)
            if check or guard.ALWAYS_CHECK:
                guard.synchronize(handle)

    def _submit_compiled(self, src, dst, s_address, d_address, count, handle):
        """Host indices: the whole call in one compiled pass (``direct_fill.submit_pages``/``submit_runs``); False
        where it did nothing (device indices, no native batch call for this stream; a capturing stream or another
        context current: the plain path). ``src``/``dst``, ``s_address``/``d_address``: as ``_index`` gave them."""
        if s_address is None:
            s_address = _numpy_address(src)
        if d_address is None:
            d_address = _numpy_address(dst)
        if s_address is None or d_address is None:  # device indices: the plain path's staging, not the runtime here
            return False
        batch = self.batch
        native = batch.native(handle)
        if native is None:
            return False
        with batch.lock:  # the batch arrays, from the fill to the submission
            if self.runs:
                out = batch.reserve(count * len(self.rows))
                result = direct_fill.submit_runs(s_address, d_address, count, self.limits, self.bases, out, native,
                                                 handle)
            else:
                lf, pf = (s_address, d_address) if self.lf_to_pf else (d_address, s_address)
                out = batch.reserve(count // self.page_size * self.copies_per_page)
                result = direct_fill.submit_pages(lf, pf, count, self.params, self.bases, out, native, handle)
            if result == batch_copy.NOT_HERE:
                return False
            if result == direct_fill.BAD:
                s_idx, d_idx = _host_values(src), _host_values(dst)
                if self.runs:
                    self._runs_error(s_idx, d_idx)
                self._page_error(*((s_idx, d_idx) if self.lf_to_pf else (d_idx, s_idx)))
            batch.settle(result, handle)
        return True


_INT64 = np.dtype(np.int64)
_TORCH: list = []  # [torch.Tensor, torch.int64] once a torch tensor has been seen


def _host_values(values):
    """``_index``'s values as a host NumPy array where they are in host memory, else None."""
    if type(values) is np.ndarray:
        return values
    if _TORCH and type(values) is _TORCH[0] and not values.is_cuda:
        return values.numpy()
    return None


def _numpy_address(values):
    """The address of ``_index``'s values where they are a contiguous NumPy array (the compiled submission reads
    ``count`` int64 there), else None. Strided indices are refused before a call gets here; this keeps the
    compiled read from ever being given one."""
    return typed_address(values) if type(values) is np.ndarray and values.flags.c_contiguous else None


def _index(obj, name, device):
    """An index array as ``(values, length, is_torch, address)``: ``values`` its host NumPy int64 values or a
    host torch tensor (``address``: its ``data_ptr``) where they are on the host already, else the device tensor
    or its ``ArrayInfo``, brought to the host by the caller (``_host_values``, ``IndexStaging``) after the stream
    is checked. Anything but int64 NumPy arrays and torch tensors goes through ``validate.index_info``, which
    gives every error message."""
    kind = type(obj)
    if kind is np.ndarray:
        flags = obj.flags
        if obj.dtype is _INT64 and obj.ndim == 1 and flags.aligned and flags.c_contiguous:
            return obj, obj.shape[0], False, None
    elif _TORCH and kind is _TORCH[0]:  # int64 tensors never require grad: numpy() takes them as they are
        shape, address = obj.shape, obj.data_ptr()
        if obj.dtype is _TORCH[1] and len(shape) == 1 and not address & 7 and obj.is_contiguous():
            on = obj.get_device()
            if on < 0:
                return obj, shape[0], True, address  # read in place: by address, or as NumPy (_host_values)
            if on != device:
                raise DeviceMismatchError(f"{name} is on cuda:{on} but the buffers are on cuda:{device}")
            return obj, shape[0], True, None  # checked: the caller copies it to the host
    elif not _TORCH and kind.__module__.startswith("torch"):
        torch = sys.modules["torch"]
        _TORCH[:] = [torch.Tensor, torch.int64]
        return _index(obj, name, device)
    info = validate.index_info(name, obj)
    if info.device != HOST and not SIMULATOR and info.device != device:
        raise DeviceMismatchError(f"{name} is on cuda:{info.device} but the buffers are on cuda:{device}")
    if info.device == HOST and isinstance(obj, np.ndarray):
        return obj, info.shape[0], False, None
    return info, info.shape[0], info.is_torch, None


class IndexStaging:
    """Where a plan's index arrays in GPU memory come to the host: pinned memory the plan keeps (grown when a call
    needs more), filled by one asynchronous copy per array on torch's current stream and one wait for both, where
    ``.cpu()`` twice would wait twice. The caller holds the plan's lock while it reads them. Anything but torch
    tensors (and the simulator) is copied by ``bounds.host_indices``."""

    def __init__(self):
        self.host = np.zeros(0, np.int64)

    def fetch(self, src, dst, count, device):
        """``(src values, dst values)`` as host int64 arrays; ``src``/``dst`` as ``_index`` gave them."""
        if SIMULATOR or not (_TORCH and type(src) is _TORCH[0] and type(dst) is _TORCH[0] and src.is_cuda
                             and dst.is_cuda):  # _index: contiguous
            return tuple(values if type(values) is np.ndarray else _on_host(values) for values in (src, dst))
        if self.host.shape[0] < 2 * count:
            from numba import cuda

            self.host = cuda.pinned_array(max(2 * count, 1024), np.int64)
        host, stream = self.host, stream_object(torch_current_stream(device))  # where .cpu() would copy
        nbytes = 8 * count
        for values, at in ((src, 0), (dst, nbytes)):
            bindings.check(bindings.cu.cuMemcpyDtoHAsync(host.ctypes.data + at, values.data_ptr(), nbytes, stream),
                           "cuMemcpyDtoHAsync")
        bindings.check(bindings.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return host[:count], host[count:2 * count]


def _on_host(values):
    """``_index``'s device indices as host NumPy values (int64 tensors never require grad: no ``detach``)."""
    if _TORCH and type(values) is _TORCH[0]:
        return values.cpu().numpy()
    return bounds.host_indices(values)


def refuse_in_capture(name, handle):
    """``CaptureError`` if stream ``handle`` is being captured: a graph cannot replay copies made from host
    reads of the indices with new indices."""
    if capture.capturing(handle):  # the message is made only then
        capture.refuse(handle, f"{name} (a copy-engine entry point: it reads the indices on the host)",
                       "use a kernel entry point, or kv.copy(..., route='kernel'), with GPU index arrays")


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
    """The batch call's location hint for a list of layers: their device, None for host memory, ``MIXED`` for
    both (one hint serves every copy of a side)."""
    places = {info.device for info in infos}
    if len(places) > 1:
        return MIXED
    return None if not places or places == {HOST} else places.pop()


MIXED = "mixed"  # a side of host and GPU layers: its copies go one by one (cudaMemcpyDefault finds each kind)
