"""HiCache's per-layer load events for a resident load: ``ResidentLayerLoadingEvent`` has the methods of SGLang's
``LayerLoadingEvent`` (``sglang.srt.managers.cache_controller``: one CUDA event per layer, recorded by the load
stream after each ``load_to_device_per_layer`` call and waited on by the model's stream), over one
``kv.load_resident`` and its ``LayerSignal``.

SGLang's consumer side stays as it is: ``LayerDoneCounter.wait_until(layer)`` calls ``wait(layer)``, which here
enqueues a stream memory operation on the current stream instead of an event wait. The producer's loop of
per-layer loads and ``complete(i)`` calls becomes one ``load_all_layers`` call; ``complete`` is kept (the
loader signals each layer itself, so it only checks the index). ``finish_event.query()`` answers whether every
layer has landed, as SGLang asks before reusing a counter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsIndex

from .integers import integer

if TYPE_CHECKING:
    from .api.resident import ResidentLoad
    from .types import ArrayLike, StreamLike

__all__ = ["ResidentLayerLoadingEvent"]


class ResidentLayerLoadingEvent:
    """SGLang's ``LayerLoadingEvent`` for loads of ``num_layers`` layers on GPU ``device``, served by one resident
    load a time (module docstring)."""

    def __init__(self, num_layers: int, device: int = 0) -> None:
        from .plan.layer_signal import LayerSignal

        self._num_layers = integer("num_layers", num_layers, minimum=1)
        self.signal = LayerSignal(self._num_layers, device)
        self.load: ResidentLoad | None = None

    def load_all_layers(self, host_view: Any, device_view: Any, host_indices: ArrayLike, device_indices: ArrayLike,
                        *, block_quota: SupportsIndex = 2, stream: StreamLike | None = None) -> ResidentLoad:
        """Every layer of ``host_view``'s tokens ``host_indices`` into ``device_view``'s ``device_indices``, in one
        ``kv.load_resident`` on ``stream`` (what SGLang's loop of ``load_to_device_per_layer`` calls does)."""
        from .api.resident import load_resident

        self.load = load_resident(host_view, device_view, host_indices, device_indices, block_quota=block_quota,
                                  signal=self.signal, stream=stream)
        return self.load

    def complete(self, layer_index: SupportsIndex) -> None:
        """Nothing to record: the loader marks each layer itself as it lands (the index is checked)."""
        integer("layer_index", layer_index, minimum=0, maximum=self._num_layers - 1)

    def wait(self, layer_index: SupportsIndex, stream: StreamLike | None = None) -> None:
        """The current stream (or ``stream``) waits on the GPU until layer ``layer_index`` has landed."""
        if self.load is None:
            raise RuntimeError("wait before any load: call load_all_layers first")
        self.load.wait(layer_index, stream)

    @property
    def finish_event(self) -> ResidentLayerLoadingEvent:
        """Itself: SGLang asks ``finish_event.query()`` before reusing a producer's events."""
        return self

    def query(self) -> bool:
        """Whether the last load has landed every layer (True before any load); reads one word from the GPU."""
        return self.load is None or self.load.landed() == len(self.load.layers)
