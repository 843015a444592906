"""Where a resident load says which layers have landed, and how another stream waits for one.

A ``LayerSignal`` is ``1 + max_layers`` uint32 words of device memory on one GPU: word 0 counts the layers of the
current load that have landed (the resident loader publishes ``l + 1`` when layer ``l`` of the load is
complete, ``kvnumba.kernels.resident``; a load by copy engine writes it on its stream after each layer's copies,
``publish``), the others count the blocks done with each layer. Before each load,
on the load's stream:

- ``cuMemsetD32Async`` clears every word (the load starts from nothing; a stale count cannot release a waiter);
- ``cuEventRecord`` marks that point (``started``).

A waiter, on any stream of the device, enqueues ``cuStreamWaitEvent(started)`` (so it cannot read the count
before the reset) and then ``cuStreamWaitValue32(layers_done, l + 1, CU_STREAM_WAIT_VALUE_GEQ)``: the GPU holds
the stream's later work until the count reaches ``l + 1``, with no host involvement. The event is also the order
CUDA's scheduler can see (a stream memory operation's is not): the waits come after a load that is already
enqueued, so no wait can be queued ahead of the work it waits for, even where two streams share a hardware
queue. Work queued behind a wait on such a shared queue may be held until the layer lands.

On a stream being captured into a CUDA graph the second step is a kernel instead (``kernels.layer_wait``: one
warp polls the word), so that the graph holds the wait as a kernel node; capture the load and its waits in one
graph, with a ``LayerSignal`` made before the capture (it builds the wait kernel). Nothing here blocks the host.

One load at a time per signal: a new load resets the words, so start it only once every wait of the previous
load has passed (SGLang keeps a ring of such counters for the same reason). On the simulator a load has finished
when its call returns, and a wait checks the count on the host.
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..driver.bindings import check, cu
from ..driver.capture import capturing
from ..driver.devices import on_device
from ..driver.launch import BoundKernel, launchable, stream_object
from ..driver.target import SIMULATOR
from ..kernels.layer_wait import WAIT_SIGNATURE, get_wait_kernel

_pack_count = struct.Struct("q").pack_into  # the wait kernel's second parameter: the count to wait for


class LayerSignal:
    """The words a resident load publishes its layers in, for loads of at most ``max_layers`` layers, on GPU
    ``device`` (module docstring)."""

    def __init__(self, max_layers: int, device: int = 0) -> None:
        if type(max_layers) is not int or max_layers < 1:
            raise ValueError(f"max_layers must be a positive int, got {max_layers!r}")
        self.max_layers, self.device = max_layers, device
        words = 1 + max_layers
        self._event = None
        self._words: Any  # a NumPy array on the simulator, a Numba device array on a GPU
        if SIMULATOR:
            self._words = np.zeros(words, np.uint32)
            self.address = self._words.ctypes.data
        else:
            from numba import cuda

            _release_retired()  # making a signal is never captured (it allocates): a safe point to free old ones
            with on_device(device):
                self._words = cuda.to_device(np.zeros(words, np.uint32))  # zero: nothing landed before a load
                self.address = self._words.device_ctypes_pointer.value
                flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
                self._event = check(cu.cuEventCreate(flags), "cuEventCreate")
            self._cu_address = cu.CUdeviceptr(self.address)
        # The wait kernel bound to the count, built now: nothing is compiled under a capture.
        self._waiter = BoundKernel(launchable(get_wait_kernel(), WAIT_SIGNATURE), device, (self.address, 0))

    @property
    def layers_done_address(self) -> int:
        """Device address of the count of layers landed (a uint32)."""
        return self.address

    @property
    def arrivals_address(self) -> int:
        """Device address of the per-layer arrival counts (``max_layers`` uint32)."""
        return self.address + 4

    def reset(self, handle: int) -> None:
        """On stream ``handle``: clear every word, then record ``started``."""
        if SIMULATOR:
            self._words[:] = 0
            return
        with on_device(self.device):
            stream = stream_object(handle)
            check(cu.cuMemsetD32Async(self._cu_address, 0, 1 + self.max_layers, stream), "cuMemsetD32Async")
            check(cu.cuEventRecord(self._event, stream), "cuEventRecord")

    def publish(self, handle: int, layers: int) -> None:
        """On stream ``handle``, once its earlier work is done: the count becomes ``layers``
        (``cuStreamWriteValue32``, which fences the stream's earlier writes first: a resident load by copy
        engine publishes each layer so, and a load with nothing to copy all its layers at once)."""
        if SIMULATOR:
            self._words[0] = layers
            return
        with on_device(self.device):
            check(cu.cuStreamWriteValue32(stream_object(handle), self._cu_address, layers, 0), "cuStreamWriteValue32")

    def wait(self, handle: int, layers: int) -> None:
        """Stream ``handle`` waits (on the GPU) until ``layers`` layers have landed; nothing waits on the host. On
        a stream being captured the wait is the wait kernel (module docstring)."""
        if SIMULATOR:
            landed = int(self._words[0])
            if landed < layers:
                raise RuntimeError(f"the simulator ran the load to its end, yet it landed {landed} layers, "
                                   f"not {layers}")
            if capturing(handle):
                self._launch_wait(handle, layers)  # returns at once: the count is there
            return
        with on_device(self.device):
            stream = stream_object(handle)
            check(cu.cuStreamWaitEvent(stream, self._event, 0), "cuStreamWaitEvent")
            if capturing(handle):
                self._launch_wait(handle, layers)
            else:
                check(cu.cuStreamWaitValue32(stream, self._cu_address, layers, _GEQ), "cuStreamWaitValue32")

    def _launch_wait(self, handle: int, layers: int) -> None:
        blocks = self._waiter.blocks
        _pack_count(blocks.view, 8, layers)
        self._waiter.launch(1, 32, handle, blocks.address)

    def landed(self) -> int:
        """The count of layers landed, read now by the host (on a GPU a synchronous copy of one word: for tests
        and tools, not a model's loop)."""
        if SIMULATOR:
            return int(self._words[0])
        out = np.zeros(1, np.uint32)
        with on_device(self.device):
            check(cu.cuMemcpyDtoH(out.ctypes.data, self._cu_address, 4), "cuMemcpyDtoH")
        return int(out[0])

    def __del__(self) -> None:
        # Collected signals keep their event and words until the next signal is made: the cycle collector may
        # run this in the middle of a CUDA graph capture, where cuEventDestroy and a cuMemFree of the words
        # (Numba frees in batches) would invalidate the capture.
        event = getattr(self, "_event", None)
        if event is not None and _retired is not None:
            _retired.append((event, self._words))


_retired: list[tuple[Any, Any]] = []  # (event, words) of collected signals, released by the next LayerSignal


def _release_retired() -> None:
    while _retired:
        event, _words = _retired.pop()
        cu.cuEventDestroy(event)


_GEQ = int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ) if cu is not None else 0
