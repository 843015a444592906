"""SM lanes (kv.SmLanes): a GPU split by CUDA green contexts into a transfer lane and a compute lane. On the
simulator, stand-in streams with the same API; on a GPU, real green contexts: disjoint SM counts adding up to the
GPU's, transfers on the transfer lane byte for byte right while torch computes on the compute lane."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import PLACE, synchronize, to_numpy

pytestmark = pytest.mark.needs_target


# Every public entry's edges: each bad value is refused by name, on the simulator as on a GPU.
@pytest.mark.parametrize("value, error, match", [(0, ValueError, "transfer_sms must be"),
                                                 (-8, ValueError, "transfer_sms must be"),
                                                 (10**6, ValueError, "transfer_sms must be"),
                                                 (8.0, TypeError, "transfer_sms must be an integer, got float"),
                                                 ("8", TypeError, "transfer_sms must be an integer, got str"),
                                                 (None, TypeError, "transfer_sms must be an integer, got NoneType"),
                                                 (True, TypeError, "transfer_sms must be an integer, got bool")])
def test_bad_sm_counts_are_refused_by_name(value, error, match):
    with pytest.raises(error, match=match):
        kv.SmLanes(value)


BAD_DEVICES = [("a", TypeError, "device must be an integer, got str"),
               ("cuda:0", TypeError, "device must be an integer, got str"),
               (-1, ValueError, "device must be >= 0, got -1"),
               (-3, ValueError, "device must be >= 0, got -3"),
               (1.5, TypeError, "device must be an integer, got float"),
               (None, TypeError, "device must be an integer, got NoneType"),
               (True, TypeError, "device must be an integer, got bool"),
               (99, ValueError, r"device must be < \d+ \(the number of GPUs.*got 99")]


@pytest.mark.parametrize("device, error, match", BAD_DEVICES)
def test_sm_count_refuses_a_device_that_is_not_a_gpu_present(device, error, match):
    with pytest.raises(error, match=match):
        kv.sm_count(device)


@pytest.mark.parametrize("device, error, match", BAD_DEVICES)
def test_lanes_refuse_a_device_that_is_not_a_gpu_present(device, error, match):
    with pytest.raises(error, match=match):
        kv.SmLanes(8, device=device)


def test_numpy_integers_are_integers():
    assert kv.sm_count(np.int64(0)) == kv.sm_count(0) >= 1
    with kv.SmLanes(np.int64(8), device=np.int32(0)) as lanes:
        assert type(lanes.transfer_sms) is int and lanes.transfer_sms >= 8 and type(lanes.device) is int
    lane = kv.LaneStream(np.uint64(0), np.int16(8), "t")
    assert type(lane.handle) is int and type(lane.sms) is int and "t: 8 SMs, handle 0x0" in repr(lane)


@pytest.mark.parametrize("args, error, match", [
    (("abc", 8, "t"), TypeError, "handle must be an integer, got str"),
    ((-1, 8, "t"), ValueError, "handle must be >= 0, got -1"),
    ((2**70, 8, "t"), ValueError, "handle must be <= 18446744073709551615"),
    ((1.0, 8, "t"), TypeError, "handle must be an integer, got float"),
    ((0, -5, "t"), ValueError, "sms must be >= 1, got -5"),
    ((0, 0, "t"), ValueError, "sms must be >= 1, got 0"),
    ((0, 2.5, "t"), TypeError, "sms must be an integer, got float"),
    ((0, 10**6, "t"), ValueError, "sms must be <= 1024"),
    ((0, 8, 123), TypeError, "name must be a str, got int"),
    ((0, 8, None), TypeError, "name must be a str, got NoneType"),
])
def test_lane_streams_refuse_bad_fields_when_made(args, error, match):
    with pytest.raises(error, match=match):
        kv.LaneStream(*args)


def test_a_lane_stream_cannot_be_changed_after_its_checks():
    lane = kv.LaneStream(0, None, "compute")
    with pytest.raises(AttributeError, match="LaneStream is read-only: handle"):
        lane.handle = -1
    assert lane.handle == 0 and "compute: None SMs" in repr(lane)


def test_transfers_run_on_the_transfer_lane():
    rng = np.random.default_rng(0)
    k, v = (rng.integers(0, 256, (64, 4, 16), dtype=np.uint8) for _ in range(2))
    src = kv.PageFirst(PLACE["host"](k), PLACE["host"](v))
    dst = kv.LayerFirst([PLACE["device"](np.zeros((64, 16), np.uint8)) for _ in range(4)],
                        [PLACE["device"](np.zeros((64, 16), np.uint8)) for _ in range(4)])
    idx = PLACE["device"](np.arange(32, dtype=np.int64))
    with kv.SmLanes(8) as lanes:
        assert lanes.simulated == SIMULATOR and lanes.transfer_sms >= 8
        assert int(lanes.transfer) == lanes.transfer.handle and lanes.transfer.__cuda_stream__() == (0, lanes.transfer.handle)
        kv.copy(src, dst, idx, idx, 2, block_quota=lanes.transfer_sms, stream=lanes.transfer)
        kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=3)(idx, idx, stream=lanes.transfer)
        synchronize()
    assert lanes.closed
    lanes.close()  # again: nothing
    np.testing.assert_array_equal(to_numpy(dst.k[2])[:32], k[:32, 2])
    np.testing.assert_array_equal(to_numpy(dst.v[3])[:32], v[:32, 3])
    assert "transfer" in repr(lanes.transfer) and "SmLanes" in repr(lanes)


@pytest.mark.gpu
def test_green_contexts_split_the_sms_and_both_lanes_work():
    torch = pytest.importorskip("torch")
    total = kv.sm_count()
    assert total == torch.cuda.get_device_properties(0).multi_processor_count
    with pytest.raises(ValueError, match=f"transfer_sms must be between 1 and {total - 1}"):
        kv.SmLanes(total)
    lanes = kv.SmLanes(8)
    try:
        assert lanes.transfer_sms >= 8 and lanes.transfer_sms + lanes.compute_sms == total
        assert lanes.transfer.handle not in (0, lanes.compute.handle)
        compute = torch.cuda.ExternalStream(lanes.compute.handle)
        a = torch.randn(2048, 2048, device="cuda")
        host = torch.randint(0, 256, (4096, 2, 256), dtype=torch.uint8).pin_memory()
        layers = [torch.zeros(4096, 256, dtype=torch.uint8, device="cuda") for _ in range(2)]
        idx = torch.randperm(4096, device="cuda")[:2048]
        torch.cuda.synchronize()
        with torch.cuda.stream(compute):
            product = a @ a
        for layer in range(2):
            kv.transfer_kv_per_layer_mla_pf_lf(host, layers[layer], idx, idx, layer, 256, 512,
                                               block_quota=lanes.transfer_sms, stream=lanes.transfer)
        torch.cuda.synchronize()
        for layer in range(2):
            assert torch.equal(layers[layer][idx].cpu(), host[idx.cpu(), layer])
        torch.testing.assert_close(product, a @ a)
    finally:
        torch.cuda.synchronize()
        lanes.close()
