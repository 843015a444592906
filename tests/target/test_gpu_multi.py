"""Several GPUs: every call runs on the device that owns its buffers, in that device's context and on
torch's current stream for that device, whatever device is current; buffers on two devices are
refused with an error naming them, and nothing is written. Needs two GPUs (skipped otherwise).

Every route is run on the second card while the first is current (the register and staged kernels, the copy
engine's entry points and ``kv.copy(route="copy_engine")``, FP8, prepared calls, ``kv.copy`` between views,
SM lanes), checked byte for byte against ``kvnumba.reference`` / ``kvnumba.quant_reference``; and every route
refuses buffers, indices or a stream on the other card (``REFUSALS``), its destinations still poisoned."""
import threading

import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config, reference
from kvnumba import quant_reference as qr
from kvnumba.plan import kernel_plan
from tests.helpers.mixed_devices import expected, first_on
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


# --- every route on the second card while the first is current ----------------------------------------------

H, D = 2, 64  # kv.copy's views: items of 2 heads of 64 bfloat16 (256 bytes)
FP8_POISON = 0xAB


def _bf16(bits, device):
    """A bfloat16 tensor on ``device`` holding the uint16 ``bits`` (the NumPy mirror keeps the bits)."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).to(device)


def _bytes(t):
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().reshape(-1)


def _mirror_bytes(a):
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


def _plain_views(rng, device, *, poison=False, kind="LayerFirst"):
    """``(numpy view, torch view on device)`` of K and V, L layers of T tokens: random or poisoned bits."""
    shape = (L, T, H, D) if kind == "LayerFirst" else (T, L, H, D)
    make = kv.LayerFirst if kind == "LayerFirst" else kv.PageFirst
    bits = [np.full(shape, POISON * 257, np.uint16) if poison else rng.integers(0, 2**16, shape, dtype=np.uint16)
            for _ in range(2)]
    if device == "host":
        placed = [torch.from_numpy(b.view(np.int16)).view(torch.bfloat16).pin_memory() for b in bits]
    else:
        placed = [_bf16(b, device) for b in bits]
    return make(*bits), make(*placed)


def _view_bytes(view):
    return [_bytes(view.k), _bytes(view.v)]


def _fp8_views(rng, device, *, poison):
    """``(numpy Fp8View, torch Fp8View on device)``, LayerFirst: random codes (no NaN codes) and scales, or poison."""
    codes_shape, scales_shape = (L, T, H, D), (L, T, H, 1)

    def codes():
        if poison:
            return np.full(codes_shape, FP8_POISON, np.uint8)
        c = rng.integers(0, 256, codes_shape, dtype=np.uint8)
        c[(c & 0x7F) >= 0x7C] ^= 0x08
        return c

    def scales():
        if poison:
            return np.full(scales_shape[:-1] + (4,), FP8_POISON, np.uint8).view(np.float32)
        return (np.exp(rng.normal(0, 3, scales_shape)) / 448).astype(np.float32)

    c, sc = [codes(), codes()], [scales(), scales()]
    mirror = kv.Fp8View(kv.LayerFirst(*c), kv.LayerFirst(*sc), dtype="bfloat16")
    placed = kv.Fp8View(kv.LayerFirst(*(torch.from_numpy(x).to(device) for x in c)),
                        kv.LayerFirst(*(torch.from_numpy(x).to(device) for x in sc)))
    return mirror, placed


def _fp8_bytes(view):
    return [_bytes(x) for x in (view.codes.k, view.codes.v, view.scales.k, view.scales.v)]


def _fp8_mirror_bytes(view):
    return [_mirror_bytes(x) for x in (view.codes.k, view.codes.v, view.scales.k, view.scales.v)]


def _assert_same(got, want, what):
    moved = 0
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: buffer {i}")
        moved += int((w != POISON).sum())
    assert moved, f"{what}: the reference moved nothing"


def _from_card_0():
    """The caller's state: cuda:0 current (checked unchanged by ``_still_on_card_0``)."""
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)


def _still_on_card_0():
    assert torch.cuda.current_device() == 0, "a call on cuda:1 left cuda:1 current"
    torch.cuda.synchronize(1)


@pytest.mark.parametrize("path", ["register", "staged"])
@pytest.mark.parametrize("form", ["plain", "prepared"])
def test_register_and_staged_loads_on_the_second_gpu(path, form, fresh_plans):
    rng = np.random.default_rng(10)
    data, pool = _host_pool(rng)
    si, di, gsi, gdi = _indices(rng, "cuda:1", n=128)
    dst = torch.full((T, ITEM), POISON, dtype=torch.uint8, device="cuda:1")
    made = []
    _from_card_0()
    with config.override(load_path=path), kernel_plan.watching(made.append):
        if form == "plain":
            kv.transfer_kv_per_layer_mla_pf_lf(pool, dst, gsi, gdi, 3, ITEM, L * ITEM)
        else:
            kv.prepare(kv.transfer_kv_per_layer_mla_pf_lf, src=pool, dst=dst, item_size=ITEM,
                       src_layout_dim=L * ITEM)(gsi, gdi, 3)
    _still_on_card_0()
    assert made and all(plan.device == 1 for plan in made)
    staged = [plan.source_maps is not None and len(si) >= plan.staged_from for plan in made]
    assert all(staged) if path == "staged" else not any(staged), f"{path}: the plans chose {staged}"
    np.testing.assert_array_equal(dst.cpu().numpy(), _expect_load(data, si, di, 3))


@pytest.mark.parametrize("entry", ["transfer_kv_direct", "per_layer_direct_pf_lf"])
@pytest.mark.parametrize("where", ["host", "cuda:1"])
def test_copy_engine_entry_points_on_the_second_gpu(entry, where):
    """The copy engines' entry points, host or cuda:1 indices, on a side stream of cuda:1."""
    rng = np.random.default_rng(11)
    page = 4
    pages = rng.choice(T // page, 8, replace=False)
    idx = (pages[:, None] * page + np.arange(page)).reshape(-1).astype(np.int64)
    put = (lambda a: torch.from_numpy(a)) if where == "host" else (lambda a: torch.from_numpy(a).to("cuda:1"))
    side = torch.cuda.Stream(device=1)
    if entry == "transfer_kv_direct":
        src_np = [rng.integers(0, 256, (T, ITEM), dtype=np.uint8) for _ in range(L)]
        dst_np = [np.full((T, ITEM), POISON, np.uint8) for _ in range(L)]
        src = [torch.from_numpy(a).to("cuda:1") for a in src_np]
        dst = [torch.from_numpy(a).pin_memory() for a in dst_np]
        dst_idx = idx[::-1].copy()
        _from_card_0()
        kv.transfer_kv_direct(src, dst, put(idx), put(dst_idx), page, stream=side, check=True)
        reference.transfer_kv_direct(src_np, dst_np, idx, dst_idx, page)
    else:
        src_np = [rng.integers(0, 256, (T // page, L, page, ITEM), dtype=np.uint8) for _ in range(2)]
        dst_np = [np.full((T, ITEM), POISON, np.uint8) for _ in range(2 * (L - 1))]
        src = [torch.from_numpy(a).pin_memory() for a in src_np]
        dst = [torch.from_numpy(a).to("cuda:1") for a in dst_np]
        _from_card_0()
        kv.transfer_kv_per_layer_direct_pf_lf(src, dst, put(idx), put(idx), 1, page, stream=side, check=True)
        reference.transfer_kv_per_layer_direct_pf_lf(src_np, dst_np, idx, idx, 1, page)
    _still_on_card_0()
    side.synchronize()
    _assert_same([_bytes(d) for d in dst], [_mirror_bytes(d) for d in dst_np], entry)


@pytest.mark.parametrize("direction", ["load", "store", "device"])
def test_kv_copy_by_copy_engine_on_the_second_gpu(direction):
    """``kv.copy(route="copy_engine")`` with host indices on a non-default stream of cuda:1."""
    rng = np.random.default_rng(12)
    places = {"load": ("host", "cuda:1"), "store": ("cuda:1", "host"), "device": ("cuda:1", "cuda:1")}[direction]
    src_np, src = _plain_views(rng, places[0], kind="PageFirst")
    dst_np, dst = _plain_views(rng, places[1], poison=True)
    si, di = (rng.choice(T, 32, replace=False).astype(np.int64) for _ in range(2))
    side = torch.cuda.Stream(device=1)
    _from_card_0()
    kv.copy(src, dst, si, di, route="copy_engine", stream=side)
    assert kv.last_route() == "copy_engine"
    _still_on_card_0()
    side.synchronize()
    reference.copy(src_np, dst_np, si, di)
    _assert_same(_view_bytes(dst), [_mirror_bytes(dst_np.k), _mirror_bytes(dst_np.v)], f"copy engine, {direction}")


@pytest.mark.parametrize("route", ["kernel", "auto"])
@pytest.mark.parametrize("layers", [None, 2, range(1, 3)])
def test_kv_copy_between_views_on_the_second_gpu(route, layers):
    rng = np.random.default_rng(13)
    src_np, src = _plain_views(rng, "cuda:1", kind="PageFirst")
    dst_np, dst = _plain_views(rng, "cuda:1", poison=True)
    si, di, gsi, gdi = _indices(rng, "cuda:1", n=32)
    _from_card_0()
    kv.copy(src, dst, gsi, gdi, layers, route=route)
    assert kv.last_route() == "kernel"  # GPU indices: the kernel, whatever the route asked
    _still_on_card_0()
    reference.copy(src_np, dst_np, si, di, layers)
    _assert_same(_view_bytes(dst), [_mirror_bytes(dst_np.k), _mirror_bytes(dst_np.v)], f"kv.copy layers={layers}")


@pytest.mark.parametrize("what", ["copy", "copy_engine", "fp8"])
def test_prepared_copies_on_the_second_gpu(what):
    rng = np.random.default_rng(14)
    src_np, src = _plain_views(rng, "host" if what == "copy_engine" else "cuda:1", kind="PageFirst")
    if what == "fp8":
        dst_np, dst = _fp8_views(rng, "cuda:1", poison=True)
    else:
        dst_np, dst = _plain_views(rng, "cuda:1", poison=True)
    si, di, gsi, gdi = _indices(rng, "cuda:1", n=32)
    side = torch.cuda.Stream(device=1)
    _from_card_0()
    call = kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=range(0, 3),
                      route="copy_engine" if what == "copy_engine" else "auto")
    if what == "copy_engine":
        call(si, di, stream=side)
        assert kv.last_route() == "copy_engine"
    else:
        call(gsi, gdi)
    _still_on_card_0()
    side.synchronize()
    if what == "fp8":
        qr.copy(src_np, dst_np, si, di, range(0, 3))
        for got, want in zip(_fp8_bytes(dst), _fp8_mirror_bytes(dst_np)):
            np.testing.assert_array_equal(got, want, err_msg="prepared FP8 quantise")
    else:
        reference.copy(src_np, dst_np, si, di, range(0, 3))
        _assert_same(_view_bytes(dst), [_mirror_bytes(dst_np.k), _mirror_bytes(dst_np.v)], f"prepared {what}")


@pytest.mark.parametrize("mode", ["quantise", "dequantise", "fp8_like"])
@pytest.mark.parametrize("where", ["host", "cuda:1"])
def test_fp8_copies_on_the_second_gpu(mode, where):
    """FP8 quantising and dequantising ``kv.copy``s on cuda:1 (indices on the host or the card), against
    ``kvnumba.quant_reference``; ``kv.fp8_like`` makes its twin on the view's card."""
    rng = np.random.default_rng(15)
    si, di, gsi, gdi = _indices(rng, "cuda:1", n=32)
    indices = (si, di) if where == "host" else (gsi, gdi)
    if mode == "dequantise":
        src_np, src = _fp8_views(rng, "cuda:1", poison=False)
        dst_np, dst = _plain_views(rng, "cuda:1", poison=True)
    else:
        src_np, src = _plain_views(rng, "cuda:1")
        if mode == "fp8_like":
            dst = kv.fp8_like(src)
            assert all(t.device == torch.device("cuda:1") for t in (dst.codes.k, dst.codes.v, dst.scales.k,
                                                                     dst.scales.v))
            dst_np = kv.Fp8View(kv.LayerFirst(*(np.zeros((L, T, H, D), np.uint8) for _ in range(2))),
                                kv.LayerFirst(*(np.zeros((L, T, H, 1), np.float32) for _ in range(2))),
                                dtype="bfloat16")
        else:
            dst_np, dst = _fp8_views(rng, "cuda:1", poison=True)
    _from_card_0()
    kv.copy(src, dst, *indices)
    _still_on_card_0()
    qr.copy(src_np, dst_np, si, di)
    if mode == "dequantise":
        got, want = _view_bytes(dst), [_mirror_bytes(dst_np.k), _mirror_bytes(dst_np.v)]
    else:
        got, want = _fp8_bytes(dst), _fp8_mirror_bytes(dst_np)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"FP8 {mode}, indices on {where}: buffer {i}")


@pytest.mark.parametrize("form", ["entry_point", "copy", "prepared"])
def test_sm_lanes_of_the_second_gpu(form):
    rng = np.random.default_rng(16)
    data, pool = _host_pool(rng)
    src_np, src = _plain_views(rng, "host", kind="PageFirst")
    dst_np, dst = _plain_views(rng, "cuda:1", poison=True)
    si, di, gsi, gdi = _indices(rng, "cuda:1", n=32)
    _from_card_0()
    with kv.SmLanes(8, device=1) as lanes:
        assert lanes.device == 1 and lanes.transfer.device == lanes.compute.device == 1
        assert torch.cuda.current_device() == 0, "making lanes on cuda:1 left cuda:1 current"
        if form == "entry_point":
            load = torch.full((T, ITEM), POISON, dtype=torch.uint8, device="cuda:1")
            kv.transfer_kv_per_layer_mla_pf_lf(pool, load, gsi, gdi, 1, ITEM, L * ITEM,
                                               block_quota=lanes.transfer_sms, stream=lanes.transfer)
        elif form == "copy":
            kv.copy(src, dst, gsi, gdi, 1, block_quota=lanes.transfer_sms, stream=lanes.transfer)
        else:
            kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=1)(gsi, gdi, stream=lanes.transfer)
        _still_on_card_0()
        torch.cuda.ExternalStream(lanes.transfer.handle, device="cuda:1").synchronize()
    if form == "entry_point":
        np.testing.assert_array_equal(load.cpu().numpy(), _expect_load(data, si, di, 1))
    else:
        reference.copy(src_np, dst_np, si, di, 1)
        _assert_same(_view_bytes(dst), [_mirror_bytes(dst_np.k), _mirror_bytes(dst_np.v)], f"lanes, {form}")


# --- mixed devices: refused on every route before anything is written --------------------------------------

def _filled(shape, device, rng=None):
    """uint8 ``shape`` on ``device`` ("host": pinned): random bytes with ``rng``, else poison."""
    a = rng.integers(0, 256, shape, dtype=np.uint8) if rng is not None else np.full(shape, POISON, np.uint8)
    t = torch.from_numpy(a)
    return t.pin_memory() if device == "host" else t.to(f"cuda:{device}")


def _index_pair(rng, device, n=32):
    return tuple(torch.from_numpy(rng.choice(T, n, replace=False).astype(np.int64)).to(f"cuda:{device}")
                 for _ in range(2))


def _refused_call(route, case, rng):
    """``(call, destinations)``: a call by ``route`` whose arguments lie as ``case`` says, and every tensor it
    could write. ``case``: ``src0_dst1`` / ``src1_dst0`` (the source on one card, the destination on the other),
    ``split`` (one side's buffers on both cards), ``indices`` (the buffers on cuda:1, the indices on cuda:0),
    ``stream`` (the buffers on cuda:1, the stream of cuda:0's)."""
    a, b = {"src0_dst1": (0, 1), "src1_dst0": (1, 0)}.get(case, (1, 1))
    idx = _index_pair(rng, 0 if case == "indices" else a)
    stream = torch.cuda.Stream(device=0) if case == "stream" else None
    if route == "kernel":
        src_k, src_v = (_filled((T, ITEM), a, rng) for _ in range(2))
        dst_k, dst_v = _filled((T, ITEM), b), _filled((T, ITEM), 0 if case == "split" else b)
        return lambda: kv.transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, *idx, ITEM, stream=stream), [dst_k, dst_v]
    if route == "staged":
        src_k, src_v = (_filled((T, L, ITEM), "host", rng) for _ in range(2))
        dst_k, dst_v = _filled((T, ITEM), b), _filled((T, ITEM), 0 if case == "split" else b)

        def staged():
            with config.override(load_path="staged"):
                kv.transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, *idx, 1, ITEM, L * ITEM, stream=stream)
        return staged, [dst_k, dst_v]
    if route == "direct":
        src = [_filled((T, ITEM), a, rng) for _ in range(L)]
        dst = [_filled((T, ITEM), 0 if case == "split" and i == L - 1 else b) for i in range(L)]
        return lambda: kv.transfer_kv_direct(src, dst, *idx, 4, stream=stream), dst
    if route == "direct_pf_lf":
        src = [_filled((T // 4, L, 4, ITEM), "host", rng) for _ in range(2)]
        dst = [_filled((T, ITEM), 0 if case == "split" and i == 0 else b) for i in range(2 * L)]
        pages = torch.arange(0, 32, dtype=torch.int64, device=idx[0].device)  # whole pages
        return lambda: kv.transfer_kv_per_layer_direct_pf_lf(src, dst, pages, pages, 0, 4, stream=stream), dst
    src_np, src = _plain_views(rng, f"cuda:{a}", kind="PageFirst")
    if route == "fp8":
        dst_np, dst = _fp8_views(rng, f"cuda:{b}", poison=True)
        if case == "split":  # codes on cuda:1, scales on cuda:0
            dst = kv.Fp8View(dst.codes, kv.LayerFirst(*(t.to("cuda:0") for t in (dst.scales.k, dst.scales.v))))
        written = [dst.codes.k, dst.codes.v, dst.scales.k, dst.scales.v]
    else:
        dst_np, dst = _plain_views(rng, f"cuda:{b}", poison=True)
        if case == "split":  # K on cuda:1, V on cuda:0
            dst = kv.LayerFirst(dst.k, dst.v.to("cuda:0"))
        written = [dst.k, dst.v]
    if route == "copy_engine":  # host indices, as the copy engines take them, unless the case puts them on a card
        host = [i.cpu() for i in idx] if case != "indices" else idx
        return lambda: kv.copy(src, dst, *host, route="copy_engine", stream=stream or torch.cuda.Stream(device=a)), \
            written
    if route == "prepared":
        return lambda: kv.prepare(kv.copy, src_view=src, dst_view=dst, layers=1)(*idx, stream=stream), written
    if route == "lanes":
        lane_card = 0 if case in ("stream", "src0_dst1") else 1  # a lane of the other card's, or of the source's

        def on_lane():
            with kv.SmLanes(8, device=lane_card) as lanes:
                try:
                    kv.copy(src, dst, *idx, 1, stream=lanes.transfer)
                finally:
                    torch.cuda.synchronize(lane_card)
        return on_lane, written
    return lambda: kv.copy(src, dst, *idx, stream=stream), written  # "copy", "fp8"






FIRST_ON = first_on(L)
ROUTES = list(FIRST_ON)
REFUSALS = [(route, case) for route in ROUTES for case in ("src0_dst1", "src1_dst0", "split", "indices", "stream")
            if not (FIRST_ON[route][0] is None and case in ("src0_dst1", "src1_dst0"))]  # a host source: no card


@pytest.mark.parametrize("route, case", REFUSALS, ids=[f"{r}-{c}" for r, c in REFUSALS])
def test_mixed_devices_are_refused_on_every_route_and_nothing_is_written(route, case, fresh_plans):
    rng = np.random.default_rng(20)
    _from_card_0()
    call, written = _refused_call(route, case, rng)
    with pytest.raises(kv.DeviceMismatchError, match=_message(route, case)):
        call()
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    for i, t in enumerate(written):
        assert (_bytes(t) == (FP8_POISON if route == "fp8" and t.dtype in (torch.uint8, torch.float32)
                              else POISON)).all(), f"{route}, {case}: destination {i} was written"


def _message(route, case):
    return expected(route, case, L)
