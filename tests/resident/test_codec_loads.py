"""kv.load_resident with an FP8 view on a side: kv.copy's FP8 kernels launched layer by layer on the stream, each
launch followed by its layer's count. Loads (dequantising) and backups (quantising) byte for byte against
kvnumba.quant_reference.copy with the destinations poisoned; the layers published; errors with nothing written."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import quant_reference as qr
from kvnumba.driver.launch import BoundKernel
from tests.fp8.cases import FP8_POISON, fp8_bytes, make_fp8, make_view, view_bytes
from tests.helpers.placement import PLACE, synchronize
from tests.helpers.view_cases import POISON, assert_same_bytes

pytestmark = pytest.mark.needs_target

L, T, P, H, D = 3, 8, 4, 2, 8


def _indices(rng, count=3):
    return (rng.choice(T, count, replace=False).astype(np.int64), rng.choice(T, count, replace=False).astype(np.int64))


def _waited(done):
    for layer in done.layers:
        done.wait(layer)
    done.synchronize()
    assert done.landed() == len(done.layers) and done.route == "kernel"


@pytest.mark.parametrize("fp8_name,plain_name", [("PageFirst", "LayerFirst"), ("PageHead", "LayerFirstList"),
                                                 ("LayerFirst", "LayerFirst")])
@pytest.mark.parametrize("where", ["host", "device"])
def test_a_load_dequantises_every_layer(fp8_name, plain_name, where):
    rng = np.random.default_rng(0)
    src_np, src = make_fp8(fp8_name, L, T, P, H, D, rng=rng, special_codes=False)
    dst_np, dst = make_view(plain_name, L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = _indices(rng)
    done = kv.load_resident(src, dst, PLACE[where](si), PLACE[where](di), signal=kv.LayerSignal(L))
    _waited(done)
    assert done.layers == range(L)
    qr.copy(src_np, dst_np, si, di)
    for got, want in zip(view_bytes(dst), view_bytes(dst_np)):
        np.testing.assert_array_equal(got, want)


def test_an_fp8_load_is_a_launch_a_layer(monkeypatch):
    rng = np.random.default_rng(3)
    _, src = make_fp8("PageHead", L, T, P, H, D, rng=rng, special_codes=False)
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    si, di = _indices(rng)
    launches = []
    launch = BoundKernel.launch
    monkeypatch.setattr(BoundKernel, "launch", lambda self, *args: (launches.append(self), launch(self, *args))[1])
    done = kv.load_resident(src, dst, PLACE["device"](si), PLACE["device"](di), signal=kv.LayerSignal(L))
    _waited(done)
    assert len(launches) == L and done.moved_by == "register"


def test_a_backup_quantises_some_layers():
    rng = np.random.default_rng(1)
    src_np, src = make_view("LayerFirst", L, T, P, H, D, rng, poison=False, mla=False, place=("device", "numba"))
    dst_np, dst = make_fp8("PageFirst", L, T, P, H, D)
    si, di = _indices(rng)
    done = kv.load_resident(src, dst, PLACE["device"](si), PLACE["device"](di), range(1, 3))
    _waited(done)
    assert done.layers == range(1, 3)
    qr.copy(src_np, dst_np, si, di, range(1, 3))
    assert_same_bytes(fp8_bytes(dst), fp8_bytes(dst_np), FP8_POISON, "LayerFirst -> FP8 PageFirst")


@pytest.mark.parametrize("change,error,message", [
    ({"route": "copy_engine"}, ValueError, "route='copy_engine' cannot quantise or dequantise"),
    ({"src_indices": np.array([0, T], np.int64)}, kv.errors.IndexOutOfRangeError, r"src_indices\[1\] = 8"),
])
def test_bad_input_writes_nothing(change, error, message):
    rng = np.random.default_rng(2)
    _, src = make_fp8("PageFirst", L, T, P, H, D, rng=rng, special_codes=False)
    _, dst = make_view("LayerFirst", L, T, P, H, D, rng, poison=True, mla=False, place=("device", "numba"))
    args = {"src_indices": np.arange(2, dtype=np.int64), "dst_indices": np.arange(2, dtype=np.int64), **change}
    signal = kv.LayerSignal(L)
    with pytest.raises(error, match=message):
        kv.load_resident(src, dst, signal=signal, **args)
    synchronize()
    for got in view_bytes(dst):
        assert (got.view(np.uint8) == POISON).all()
    assert signal.landed() == 0
