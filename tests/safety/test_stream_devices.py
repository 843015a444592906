"""A stream that says it belongs to another GPU than a call's buffers (an SM lane's ``device``, a torch
stream's ``device``) is refused on every route with ``DeviceMismatchError`` naming both, before anything is
written; buffers on two GPUs are named by ``one_device``. On the simulator every buffer is on cuda:0, so a
lane stream made for cuda:1 stands for a stream of the second card."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.arrays import HOST
from kvnumba.checks.devices import one_device, stream_device
from tests.fp8.cases import FP8_POISON, fp8_bytes, make_fp8
from tests.helpers.placement import PLACE, synchronize, to_numpy
from tests.helpers.view_cases import POISON, make_view, view_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 2, 8, 4, 2, 8
ITEM = 32
REFUSED = r"stream is on cuda:1 but the buffers are on cuda:0: pass a stream of cuda:0"


class TorchStreamOfCard1:
    """What kvnumba reads of a ``torch.cuda.Stream(device=1)``: its module, ``device.index``, ``cuda_stream``."""

    __module__ = "torch.cuda.streams"

    class device:  # noqa: N801 - torch's attribute name
        index = 1

    cuda_stream = 0


def _views(route):
    rng = np.random.default_rng(0)
    _, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    if route == "fp8":
        _, dst = make_fp8("LayerFirst", L, T, P, H, D, place="device")
        return src, dst, lambda: fp8_bytes(dst), FP8_POISON
    _, dst = make_view("PageFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    return src, dst, lambda: view_bytes(dst), POISON


def _call(route, stream, keep):
    """A call by ``route`` on cuda:0's (simulated) buffers with ``stream``; ``keep`` gets ``reader`` (the
    destination's bytes, read back) and ``poison`` (its bytes before the call) before the call is made."""
    idx = np.arange(4, dtype=np.int64)
    if route in ("entry_point", "direct"):
        src = [PLACE["device"](np.arange(T * ITEM, dtype=np.uint8).reshape(T, ITEM)) for _ in range(L)]
        dst = [PLACE["device"](np.full((T, ITEM), POISON, np.uint8)) for _ in range(L)]
        keep["reader"], keep["poison"] = (lambda: [to_numpy(d) for d in dst]), POISON
        if route == "direct":
            kv.transfer_kv_direct(src, dst, idx, idx, P, stream=stream)
        else:
            kv.transfer_kv_per_layer_mla(src[0], dst[0], PLACE["device"](idx), PLACE["device"](idx), ITEM,
                                         stream=stream)
        return
    src, dst, keep["reader"], keep["poison"] = _views(route)
    if route == "prepared":
        kv.prepare(kv.copy, src_view=src, dst_view=dst)(PLACE["device"](idx), PLACE["device"](idx), stream=stream)
    elif route == "copy_engine":
        kv.copy(src, dst, idx, idx, route="copy_engine", stream=stream)
        assert kv.last_route() == "copy_engine"
    else:  # kernel, fp8
        kv.copy(src, dst, PLACE["device"](idx), PLACE["device"](idx), stream=stream)


ROUTES = ["entry_point", "direct", "kernel", "copy_engine", "prepared", "fp8"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", ["lane", "torch"])
def test_a_stream_of_another_gpu_is_refused_and_nothing_is_written(route, stream):
    other = kv.LaneStream(0, 8, "transfer", device=1) if stream == "lane" else TorchStreamOfCard1()
    refused, control = {}, {}
    with pytest.raises(kv.DeviceMismatchError, match=REFUSED):
        _call(route, other, refused)
    _call(route, kv.LaneStream(0, 8, "transfer", device=0), control)  # a stream of the buffers' own GPU: runs
    synchronize()
    assert all((b == refused["poison"]).all() for b in refused["reader"]()), f"{route}: the refused call wrote"
    assert any((b != control["poison"]).any() for b in control["reader"]()), f"{route}: the control wrote nothing"


def test_a_lane_says_its_device():
    lane = kv.LaneStream(0, 8, "transfer", device=1)
    assert lane.device == 1 and "cuda:1" in repr(lane)
    assert kv.LaneStream(0, 8, "t").device == 0
    with kv.SmLanes(8) as lanes:
        assert lanes.transfer.device == lanes.compute.device == lanes.device == 0
    with pytest.raises(ValueError, match="device must be >= 0, got -1"):
        kv.LaneStream(0, 8, "t", device=-1)
    with pytest.raises(TypeError, match="device must be an integer, got str"):
        kv.LaneStream(0, 8, "t", device="cuda:1")


def test_stream_device_reads_what_a_stream_says():
    assert stream_device(None) is None and stream_device(7) is None
    assert stream_device(kv.LaneStream(0, None, "compute", device=3)) == 3
    assert stream_device(TorchStreamOfCard1()) == 1

    class Unknown:  # Numba's streams and others say nothing of their device
        handle = 5
    assert stream_device(Unknown()) is None


@pytest.mark.parametrize("placed, match", [
    ([("src", 0), ("dst", 1)], r"src is on cuda:0 but dst is on cuda:1"),
    ([("src", HOST), ("dst", 1), ("dst_v", 0)], r"dst is on cuda:1 but dst_v is on cuda:0"),
    ([("src.k", 1), ("src.v", 1), ("dst.k", 0)], r"src\.k is on cuda:1 but dst\.k is on cuda:0"),
])
def test_one_device_names_the_first_buffer_on_each_of_two_gpus(placed, match):
    with pytest.raises(kv.DeviceMismatchError, match=match + ": kvnumba copies within one GPU"):
        one_device(placed)


def test_one_device_of_host_memory_and_one_gpu():
    assert one_device([("src", HOST), ("dst", 1)]) == 1
    assert one_device([("src", 2), ("dst", 2)]) == 2


def test_a_torch_streams_handle_and_device_are_read_on_every_call():
    """Nothing is remembered per stream object: torch (2.11) leaves a collected stream's weak references alive, so
    a stream made at its address cannot be told from it, and a remembered handle ran a load on the dead object's
    stream. Here one object stands for both: what it says changes between calls, and each call reads it."""
    from kvnumba.driver.streams import stream_handle

    class TorchStream:
        __module__ = "torch.cuda.streams"

        def __init__(self, handle, index):
            self.cuda_stream, self.device_index = handle, index

    stream = TorchStream(0x1234, 0)
    assert stream_handle(stream) == 0x1234 and stream_device(stream) == 0
    stream.cuda_stream, stream.device_index = 0x5678, 1
    assert stream_handle(stream) == 0x5678 and stream_device(stream) == 1
