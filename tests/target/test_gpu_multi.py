"""Several GPUs: every call runs on the device that owns its buffers, in that device's context and on
torch's current stream for that device, whatever device is current; buffers on two devices are
refused with an error naming them, and nothing is written. Needs two GPUs (skipped otherwise)."""
import threading

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from tests.helpers.placement import ON_GPU, gpu_count

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ON_GPU and gpu_count() < 2, reason="needs two GPUs")]

T, L, ITEM = 256, 4, 256
POISON = 0xA5


def _host_pool(rng):
    data = rng.integers(0, 256, (T, L, ITEM), dtype=np.uint8)
    return data, torch.from_numpy(data).pin_memory()


def _indices(rng, device, n=64):
    si = rng.choice(T, n, replace=False).astype(np.int64)
    di = rng.choice(T, n, replace=False).astype(np.int64)
    return si, di, torch.from_numpy(si).to(device), torch.from_numpy(di).to(device)


def _expect_load(data, si, di, layer):
    want = np.full((T, ITEM), POISON, np.uint8)
    reference.transfer_kv_per_layer_mla_pf_lf(data, want, si, di, layer, ITEM, L * ITEM)
    return want


@pytest.mark.parametrize("form", ["plain", "prepared"])
def test_load_into_the_second_gpu_while_the_first_is_current(form):
    rng = np.random.default_rng(0)
    data, pool = _host_pool(rng)
    si, di, gsi, gdi = _indices(rng, "cuda:1")
    dst = torch.full((T, ITEM), POISON, dtype=torch.uint8, device="cuda:1")
    torch.cuda.set_device(0)
    if form == "plain":
        kv.transfer_kv_per_layer_mla_pf_lf(pool, dst, gsi, gdi, 2, ITEM, L * ITEM)
    else:
        kv.prepare(kv.transfer_kv_per_layer_mla_pf_lf, src=pool, dst=dst, item_size=ITEM,
                   src_layout_dim=L * ITEM)(gsi, gdi, 2)
    assert torch.cuda.current_device() == 0  # the caller's device is left as it was
    torch.cuda.synchronize(1)
    np.testing.assert_array_equal(dst.cpu().numpy(), _expect_load(data, si, di, 2))


def test_runs_on_torchs_current_stream_of_the_buffers_device():
    rng = np.random.default_rng(1)
    data, pool = _host_pool(rng)
    si, di, gsi, gdi = _indices(rng, "cuda:1")
    dst = torch.full((T, ITEM), POISON, dtype=torch.uint8, device="cuda:1")
    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(side):
        pass
    torch.cuda.set_device(0)
    with torch.cuda.stream(side):  # makes `side` the current stream of device 1
        kv.transfer_kv_per_layer_mla_pf_lf(pool, dst, gsi, gdi, 1, ITEM, L * ITEM)
        event = torch.cuda.Event()
        event.record(side)
    event.synchronize()  # waiting on the side stream alone is enough if the copy ran there
    np.testing.assert_array_equal(dst.cpu().numpy(), _expect_load(data, si, di, 1))


def test_all_layer_backup_and_tables_on_the_second_gpu():
    rng = np.random.default_rng(2)
    layers = [torch.from_numpy(rng.integers(0, 256, (T, ITEM), dtype=np.uint8)).to("cuda:1") for _ in range(L)]
    table = kv.layer_table(layers)
    assert table.device.index == 1
    si, di, gsi, gdi = _indices(rng, "cuda:1")
    host = torch.full((T, L, ITEM), POISON, dtype=torch.uint8).pin_memory()
    torch.cuda.set_device(0)
    kv.transfer_kv_all_layer_mla_lf_pf(table, host, gsi, gdi, ITEM, L * ITEM, L, check=True)
    want = np.full((T, L, ITEM), POISON, np.uint8)
    reference.transfer_kv_all_layer_mla_lf_pf([x.cpu().numpy() for x in layers], want, si, di, ITEM, L * ITEM, L)
    np.testing.assert_array_equal(host.numpy(), want)


def test_copy_engine_path_on_the_second_gpu():
    rng = np.random.default_rng(3)
    page = 4
    lf = [torch.from_numpy(rng.integers(0, 256, (T, ITEM), dtype=np.uint8)).to("cuda:1") for _ in range(2 * L)]
    pf = [torch.full((T // page, L, page, ITEM), POISON, dtype=torch.uint8).pin_memory() for _ in range(2)]
    pages = rng.choice(T // page, 8, replace=False)
    idx = torch.from_numpy((pages[:, None] * page + np.arange(page)).reshape(-1).astype(np.int64)).to("cuda:1")
    torch.cuda.set_device(0)
    side = torch.cuda.Stream(device=1)
    with torch.cuda.stream(side):
        kv.transfer_kv_all_layer_direct_lf_pf(lf, pf, idx, idx, page, check=True)
    want = [np.full((T // page, L, page, ITEM), POISON, np.uint8) for _ in range(2)]
    reference.transfer_kv_all_layer_direct_lf_pf([x.cpu().numpy() for x in lf], want, idx.cpu().numpy(),
                                                 idx.cpu().numpy(), page)
    for got, w in zip(pf, want):
        np.testing.assert_array_equal(got.numpy(), w)


@pytest.mark.parametrize("bad", ["dst", "indices", "table_layer"])
def test_buffers_on_two_gpus_are_refused_and_nothing_is_written(bad):
    rng = np.random.default_rng(4)
    src = torch.from_numpy(rng.integers(0, 256, (T, ITEM), dtype=np.uint8)).to("cuda:0")
    dst = torch.full((T, ITEM), POISON, dtype=torch.uint8, device="cuda:0")
    si, di, gsi, gdi = _indices(rng, "cuda:0")
    if bad == "dst":
        dst = dst.to("cuda:1")
        with pytest.raises(kv.DeviceMismatchError, match=r"src is on cuda:0 but dst is on cuda:1"):
            kv.transfer_kv_per_layer_mla(src, dst, gsi, gdi, ITEM)
    elif bad == "indices":
        with pytest.raises(kv.DeviceMismatchError, match=r"dst_indices is on cuda:1 but the buffers are on cuda:0"):
            kv.transfer_kv_per_layer_mla(src, dst, gsi, gdi.to("cuda:1"), ITEM)
    else:
        layers = [torch.zeros((T, ITEM), dtype=torch.uint8, device=f"cuda:{i % 2}") for i in range(2)]
        with pytest.raises(kv.DeviceMismatchError, match=r"layers\[0\] is on cuda:0 but layers\[1\] is on cuda:1"):
            kv.layer_table(layers)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert (dst.cpu().numpy() == POISON).all()
    kv.transfer_kv_per_layer_mla(src, dst.to("cuda:0"), gsi, gdi, ITEM, check=True)  # the context is fine


def test_threads_each_on_its_own_gpu():
    """A thread per device, each with its own torch stream, many calls: every result exact."""
    rng = np.random.default_rng(5)
    data, pool = _host_pool(rng)
    errors = []

    def worker(device):
        try:
            torch.cuda.set_device(device)
            si, di, gsi, gdi = _indices(np.random.default_rng(device), f"cuda:{device}")
            dst = torch.full((T, ITEM), POISON, dtype=torch.uint8, device=f"cuda:{device}")
            load = kv.prepare(kv.transfer_kv_per_layer_mla_pf_lf, src=pool, dst=dst, item_size=ITEM,
                              src_layout_dim=L * ITEM)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(200):
                    load(gsi, gdi, i % L)
            stream.synchronize()
            np.testing.assert_array_equal(dst.cpu().numpy(), _expect_load(data, si, di, (200 - 1) % L))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"device {device}: {error!r}")

    threads = [threading.Thread(target=worker, args=(device,)) for device in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
