"""kv.load_resident with a kv.Nvfp4View on a side: one launch of the resident loader's NVFP4 build
(kernels.nvfp4.get_kernel(..., resident=True)), every layer published as it lands. Loads (dequantising), backups
(quantising) and page-to-page copies byte for byte against kvnumba.quant_reference.copy, destinations poisoned."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.driver.launch import BoundKernel
from tests.helpers.placement import PLACE
from tests.helpers.view_cases import POISON as PLAIN_POISON, make_view, view_bytes
from tests.quant.test_nvfp4_copy import POISON, finite_view, make_nvfp4, nvfp4_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 3, 8, 4, 2, 64


def _indices(rng, count=3):
    return tuple(PLACE["device"](rng.choice(T, count, replace=False).astype(np.int64)) for _ in range(2))


def _counted_load(monkeypatch, src, dst, si, di, layers=None):
    """The load, waited for layer by layer: ``(its launches, the layers it published)``."""
    launches = []
    launch = BoundKernel.launch
    monkeypatch.setattr(BoundKernel, "launch", lambda self, *args: (launches.append(self), launch(self, *args))[1])
    done = kv.load_resident(src, dst, si, di, layers, block_quota=1, num_warps_per_block=2,
                            signal=kv.LayerSignal(L))
    for layer in done.layers:
        done.wait(layer)
    done.synchronize()
    assert done.route == "kernel" and done.moved_by == "register"
    return launches, done.landed()


@pytest.mark.parametrize("plain_name, layout", [("LayerFirstList", "HND"), ("PageFirst", "NHD")])
def test_a_load_dequantises_every_layer_in_one_launch(monkeypatch, plain_name, layout):
    rng = np.random.default_rng(0)
    src_np, src = make_nvfp4(L=L, layout=layout, rng=rng)
    dst_np, dst = make_view(plain_name, L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = _indices(rng)
    launches, landed = _counted_load(monkeypatch, src, dst, si, di)
    assert len(launches) == 1 and landed == L
    qr.copy(src_np, dst_np, np.asarray(si), np.asarray(di))
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want, err_msg=f"NVFP4 {layout} -> {plain_name}")


def test_a_backup_quantises_some_layers(monkeypatch):
    rng = np.random.default_rng(1)
    src_np, src = finite_view("LayerFirst", rng, L)
    dst_np, dst = make_nvfp4(L=L, layout="HND")
    si, di = _indices(rng)
    launches, landed = _counted_load(monkeypatch, src, dst, si, di, range(1, 3))
    assert len(launches) == 1 and landed == 2
    qr.copy(src_np, dst_np, np.asarray(si), np.asarray(di), range(1, 3))
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)
    assert (nvfp4_bytes(dst)[0] == POISON).all()  # layer 0 untouched


def test_pages_go_to_pages_of_another_order(monkeypatch):
    rng = np.random.default_rng(2)
    src_np, src = make_nvfp4(L=L, layout="NHD", rng=rng)
    dst_np, dst = make_nvfp4(L=L, layout="HND")
    si, di = _indices(rng, 4)
    launches, landed = _counted_load(monkeypatch, src, dst, si, di)
    assert len(launches) == 1 and landed == L
    qr.copy(src_np, dst_np, np.asarray(si), np.asarray(di))
    for got, want in zip(nvfp4_bytes(dst), nvfp4_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_out_of_range_indices_write_nothing():
    rng = np.random.default_rng(3)
    _, src = make_nvfp4(L=L, layout="NHD", rng=rng)
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    signal = kv.LayerSignal(L)
    with pytest.raises(kv.errors.IndexOutOfRangeError, match=r"dst_indices\[1\] = 8"):
        kv.load_resident(src, dst, np.array([0, 1], np.int64), np.array([0, T], np.int64), signal=signal)
    for got in view_bytes(dst):
        assert (got.view(np.uint8) == PLAIN_POISON).all()
    assert signal.landed() == 0
