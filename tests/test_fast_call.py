"""The fast call: the one hot path inlined beside the general form it copies is held to the general form's answers.

- ``run`` and the fast call (``kvnumba.plan.per_call``): for the same call, the same launch (kernel, grid,
  threads, every parameter), or the fast call hands the call to ``run``;
- the fast call's inlined launch and the driver's ``launch_shape``/``BoundKernel.launch``:
  ``tests/kernels/test_launch.py``.

The fast call runs here with stand-ins for torch and cuLaunchKernel (``tests/helpers/torch_standin.py``).
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba.driver.target import SIMULATOR
from kvnumba.plan.per_call import make_fast_call
from tests.helpers.safety_cases import OPS, build
from tests.helpers.torch_standin import Tensor, Torch

pytestmark = pytest.mark.needs_target


# --- run and the fast call ---------------------------------------------------------------------------------

def _plan(op):
    call = build(op, count=2, pool=8, num_layers=2)
    bound = {k: v for k, v in call.kwargs.items() if k not in ("src_indices", "dst_indices", "layer_id")}
    return kv.prepare(op, **bound)._plan


def _fast_answer(plan, src, dst, layer_id, quota, warps, **kwargs):
    """The fast call's launch ``(function, grid, threads, parameters)``, or "run" where it hands the call over."""
    launched, handed = [], []
    plan.kernel_for(len(src.values), warps)  # binds the narrow build, as a first call by run does
    block = plan.kernel_for(len(src.values), warps)[0].blocks

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, address, extra):
        launched.append((function, gx, bx, tuple(block.values)))
        return (0,)

    plan.run = lambda *args: handed.append(args)  # an instance attribute: make_fast_call takes plan.run
    try:
        make_fast_call(plan, torch=Torch, launch=launch)(src, dst, layer_id, quota, warps, **kwargs)
    finally:
        del plan.run
    assert len(launched) + len(handed) == 1
    return launched[0] if launched else "run"


def _run_answer(plan, src, dst, layer_id, quota, warps, monkeypatch):
    """``run``'s launch for the same call, with the same index arrays (NumPy, at the same addresses)."""
    launched = []
    kernel, _ = plan.kernel_for(len(src), warps)

    def launch(self, grid, threads, stream, address, *rest):
        launched.append((self.launch_values[1], grid, threads, tuple(self.blocks.values)))

    monkeypatch.setattr(type(kernel), "launch", launch)
    plan.run(src, dst, layer_id, quota, warps)
    monkeypatch.undo()
    assert len(launched) == 1
    return launched[0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("count, quota, warps", [(1, 2, 32), (6, 1, 1), (7, 3, 2)])
def test_the_fast_call_launches_what_run_launches(op, count, quota, warps, monkeypatch):
    plan = _plan(op)
    layer_id = 1 if plan.spec.per_layer else None
    if plan.spec.per_layer:
        plan.window_for(layer_id)  # the layer's limits, as an earlier call leaves them
    src_values, dst_values = np.arange(count, dtype=np.int64), np.arange(count, dtype=np.int64)[::-1].copy()
    fast = _fast_answer(plan, Tensor(src_values, plan.device), Tensor(dst_values, plan.device), layer_id, quota,
                        warps)
    assert fast != "run"
    ran = _run_answer(plan, src_values, dst_values, layer_id, quota, warps, monkeypatch)
    if SIMULATOR:
        assert fast == ran
    else:  # run copies host indices to the GPU first: only their two addresses differ
        assert fast[:3] == ran[:3] and fast[3][2:] == ran[3][2:]


@pytest.mark.parametrize("change", ["check", "quota", "warps", "layer", "numpy_layer", "dtype", "device", "empty",
                                    "stream", "route"])
def test_the_fast_call_hands_what_it_does_not_recognise_to_run(change):
    plan = _plan("transfer_kv_per_layer_pf_lf")  # per layer: layer_id picks the token limits
    plan.window_for(1)
    device, quota, warps, layer, kwargs, dtype = plan.device, 2, 2, 1, {}, None
    values = np.arange(4, dtype=np.int64)
    if change == "check":
        kwargs = {"check": True}
    elif change == "quota":
        quota = 0
    elif change == "warps":
        warps = 33
    elif change == "layer":
        layer = 5  # a layer no call has set up: run validates it
    elif change == "numpy_layer":
        layer = np.int64(1)
    elif change == "dtype":
        dtype = object()
    elif change == "device":
        device = plan.device + 1
    elif change == "empty":
        values = values[:0]
    elif change == "stream":
        kwargs = {"stream": object()}
    elif change == "route":
        kwargs = {"route": "copy_engine"}
    src = Tensor(values, device) if dtype is None else Tensor(values, device, dtype)
    assert _fast_answer(plan, src, Tensor(values, device), layer, quota, warps, **kwargs) == "run"
