"""kvnumba.compat.ResidentLayerLoadingEvent: SGLang's per-layer load events over one resident load (the
producer's one call, the consumer's waits as SGLang makes them), byte for byte against the reference."""
import numpy as np
import pytest

from kvnumba import reference
from kvnumba.compat import ResidentLayerLoadingEvent
from tests.helpers.placement import PLACE
from tests.helpers.view_cases import POISON, assert_same_bytes, make_view, view_bytes

pytestmark = [pytest.mark.needs_target]

L, T, P, H, D = 3, 16, 4, 2, 8


def test_a_load_through_sglangs_events():
    rng = np.random.default_rng(4)
    src_np, src = make_view("PageHead", L, T, P, H, D, rng, poison=False, mla=False, place=("host", "numba"))
    dst_np, dst = make_view("LayerFirstList", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = rng.choice(T, 5, replace=False).astype(np.int64), rng.choice(T, 5, replace=False).astype(np.int64)
    events = ResidentLayerLoadingEvent(L)
    assert events.finish_event.query()  # no load yet: free to use
    with pytest.raises(RuntimeError, match="load_all_layers first"):
        events.wait(0)
    events.load_all_layers(src, dst, PLACE["device"](si), PLACE["device"](di), block_quota=1)
    for layer in range(L):
        events.complete(layer)
        events.wait(layer)
    assert events.finish_event.query()
    reference.copy(src_np, dst_np, si, di, None)
    assert assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, "PageHead -> LayerFirstList") > 0
    with pytest.raises(ValueError, match="layer_index must be"):
        events.complete(L)
