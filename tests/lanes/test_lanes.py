"""SM lanes (kv.SmLanes): a GPU split by CUDA green contexts into a transfer lane and a compute lane. On the
simulator, stand-in streams with the same API; on a GPU, real green contexts: disjoint SM counts adding up to the
GPU's, transfers on the transfer lane byte for byte right while torch computes on the compute lane."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from tests.helpers.placement import PLACE, synchronize, to_numpy

pytestmark = pytest.mark.needs_target


@pytest.mark.parametrize("value, error, match", [(0, ValueError, "transfer_sms must be"),
                                                 (-8, ValueError, "transfer_sms must be"),
                                                 (8.0, TypeError, "transfer_sms must be an int, got float"),
                                                 (True, TypeError, "transfer_sms must be an int, got bool")])
def test_bad_sm_counts_are_refused_by_name(value, error, match):
    with pytest.raises(error, match=match):
        kv.SmLanes(value)


def test_a_device_that_is_not_an_int_is_refused():
    with pytest.raises(TypeError, match="device must be an int, got str"):
        kv.SmLanes(8, device="cuda:0")


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
