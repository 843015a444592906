"""The page-first-direct copies through each batch route, for real on a GPU: libcudart's
``cudaMemcpyBatchAsync`` with NumPy address arrays ("cudart"), cuda-bindings' own call with Python
lists ("bindings"; returns ``(err, failIdx)`` with cuda-bindings 12.x and ``(err,)`` with 13.x), and
page by page ("page"). All three move the same bytes as the reference. KVNUMBA_BATCH_COPY picks
the route for a process; the tests install each in turn."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import reference
from kvnumba.driver import batch_copy
from tests.helpers.placement import ON_GPU

torch = pytest.importorskip("torch") if ON_GPU else None
pytestmark = pytest.mark.gpu  # the real batch call

T, L, P, ITEM = 512, 4, 16, 128


@pytest.fixture(params=["cudart", "bindings", "page"])
def route(request, monkeypatch):
    """Each route in turn, chosen as a user chooses it: ``KVNUMBA_BATCH_COPY``."""
    monkeypatch.setenv("KVNUMBA_BATCH_COPY", request.param)
    return request.param, batch_copy.runtime()


@pytest.mark.parametrize("mla", [False, True])
def test_each_route_moves_the_reference_bytes(route, mla):
    name, runtime = route
    rng = np.random.default_rng(7)
    kinds = 1 if mla else 2
    lf = [rng.integers(0, 256, (T, ITEM), dtype=np.uint8) for _ in range(kinds * L)]
    pages = rng.choice(T // P, 6, replace=False)
    idx = (pages[:, None] * P + np.arange(P)).reshape(-1).astype(np.int64)
    pf = [torch.full((T // P, L, P, ITEM), 0xA5, dtype=torch.uint8).pin_memory() for _ in range(kinds)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kv.transfer_kv_all_layer_direct_lf_pf([torch.from_numpy(x).cuda() for x in lf], pf,
                                              torch.from_numpy(idx).cuda(), torch.from_numpy(idx).cuda(), P,
                                              check=True)
    assert kv.last_path() == ("page" if name == "page" else "batch")
    if name != "page":
        assert runtime.route == name
    want = [np.full((T // P, L, P, ITEM), 0xA5, np.uint8) for _ in range(kinds)]
    reference.transfer_kv_all_layer_direct_lf_pf(lf, want, idx, idx, P)
    for got, w in zip(pf, want):
        np.testing.assert_array_equal(got.numpy(), w)

    # and back, per layer, into fresh device buffers
    back = [torch.zeros((T, ITEM), dtype=torch.uint8, device="cuda") for _ in range(kinds)]
    with torch.cuda.stream(side):
        kv.transfer_kv_per_layer_direct_pf_lf(pf, back, torch.from_numpy(idx).cuda(), torch.from_numpy(idx).cuda(),
                                              2, P, check=True)
    for k, b in enumerate(back):
        np.testing.assert_array_equal(b.cpu().numpy()[idx], lf[k * L + 2][idx])
