"""Callbacks the garbage collector runs while their own thread holds the lock they take. A layer's weakref
callback (``kvnumba.checks.tables``) and a tensor-map block's finalizer (``kvnumba.plan.tensor_maps``) run
whenever a collection finds their object dead, which can be inside ``register_layers`` or ``MapStore.take``,
on the thread that holds the lock: with a plain lock that thread waits for itself forever (a test run hung
so, in ``kv.layer_table``). Each case runs in a thread with a time limit, so a deadlock fails the test."""
import threading

import numpy as np

from kvnumba.arrays import array_info
from kvnumba.checks import tables
from kvnumba.plan import tensor_maps

LIMIT_SECONDS = 30


def _finishes(scenario):
    """Whether ``scenario()`` returns within ``LIMIT_SECONDS`` in a thread of its own (an exception there
    counts as not finishing)."""
    done = []

    def run():
        scenario()
        done.append(True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT_SECONDS)
    return bool(done)


def test_a_layer_collected_while_the_registry_is_locked():
    seen = []

    def scenario():
        layer = np.zeros(64, np.uint8)
        address = layer.ctypes.data
        tables.register_layers([array_info(layer, "layer")])
        seen.append(tables.lookup(address) is not None)
        with tables._lock:  # as during register_layers, when a collection finds a registered layer dead
            del layer  # the last reference: its callback runs here, on this thread
            seen.append(tables.lookup(address) is None)

    assert _finishes(scenario)
    assert seen == [True, True]  # registered, then forgotten by its callback


def test_a_map_block_retired_while_the_store_is_locked():
    store = tensor_maps.MapStore()
    seen = []

    def scenario():
        block = store.take()
        maps = tensor_maps.SourceMaps(block, (block, 0, 1), store)
        with store._lock:  # as during take, when a collection finds a plan's maps dead
            del maps  # its finalizer retires the block here, on this thread
            seen.append(list(store._retired) == [block])

    assert _finishes(scenario)
    assert seen == [True]
