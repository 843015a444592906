"""One launch: the fast path's inlined launch (kvnumba.plan.per_call) launches as the driver layer's single
definition says (kvnumba.driver.launch.launch_shape, BoundKernel.launch_values) and writes the parameter
block as kvnumba.kernels.params names it: same grid, threads, shared bytes, function and parameters.

The fast path is built here with stand-ins for torch and cuLaunchKernel (its ``torch=`` and ``launch=``), so
its inlined launch runs on the simulator too; on a GPU the same code launches for real.
"""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config
from kvnumba.driver.launch import MAX_WARPS, WARP_SIZE, launch_shape
from kvnumba.kernels.params import PER_LAYER_ARGS, KernelArgs, StagedArgs
from kvnumba.plan.per_call import make_fast_call
from tests.helpers.safety_cases import OPS, build
from tests.helpers.torch_standin import Tensor as _Tensor
from tests.helpers.torch_standin import Torch as _Torch

pytestmark = pytest.mark.needs_target

def _launches(plan, count, quota, warps, layer_id):
    """What the fast call launches for ``count`` items: the cuLaunchKernel arguments and the block's values."""
    launched = []
    kernel, _ = plan.kernel_for(count, warps)  # binds the narrow build of one-warp blocks, as a first call does

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, address, extra):
        launched.append((function, (gx, gy, gz), (bx, by, bz), shared, address, tuple(kernel.blocks.values)))
        return (0,)

    call = make_fast_call(plan, torch=_Torch, launch=launch)
    if plan.spec.per_layer:
        plan.window_for(layer_id)  # the layer's limits, as an earlier call leaves them (the fast path reads them)
    src = _Tensor(np.arange(count), plan.device)
    dst = _Tensor(np.arange(count)[::-1], plan.device)
    call(src, dst, layer_id, quota, warps, stream=7)
    assert len(launched) == 1, "the fast path did not launch: it took plan.run"
    return launched[0], src, dst


def _expected(plan, count, quota, warps, layer_id, src, dst):
    items_per_warp, blocks, threads = launch_shape(count, quota, warps)
    kernel, _ = plan.kernel_for(count, warps)
    assert (kernel is plan.narrow_kernel) == (warps == 1)
    block, function, _, shared = kernel.launch_values
    window = plan.window_for(layer_id) if plan.spec.per_layer else plan.windows[0]
    values = list(kernel.blocks.values)
    values[:PER_LAYER_ARGS] = [src.data_ptr(), dst.data_ptr(), count, items_per_warp, *window.params]
    return (function, (blocks, 1, 1), (threads, 1, 1), shared, block.address, tuple(values))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("count, quota, warps", [(1, 2, 32), (6, 1, 1), (6, 2, 2), (7, 3, 2), (8, 2, 32)])
def test_the_inlined_launch_is_launch_shape(op, count, quota, warps):
    call = build(op, count=2, pool=8, num_layers=2)
    bound = {k: v for k, v in call.kwargs.items() if k not in ("src_indices", "dst_indices", "layer_id")}
    plan = kv.prepare(op, **bound)._plan
    layer_id = 1 if plan.spec.per_layer else None
    got, src, dst = _launches(plan, count, quota, warps, layer_id)
    assert got == _expected(plan, count, quota, warps, layer_id, src, dst)
    assert got[2][0] == warps * WARP_SIZE and got[1][0] <= quota


def test_the_staged_kernel_launches_alike(fresh_plans):
    """A staged plan: the staged kernel's block (StagedArgs) for enough items and warps, else the register one's."""
    call = build("transfer_kv_per_layer_pf_lf", item_size=64, count=2, pool=64, num_layers=2)
    bound = {k: v for k, v in call.kwargs.items() if k not in ("src_indices", "dst_indices", "layer_id")}
    with config.override(load_path="staged"):
        plan = kv.prepare("transfer_kv_per_layer_pf_lf", **bound)._plan
        assert plan.kernel is not plan.register_kernel, "the plan should be staged (KVNUMBA_LOAD_PATH=staged)"
        assert plan.kernel.blocks.count == len(StagedArgs._fields)
        assert plan.register_kernel.blocks.count == len(KernelArgs._fields)
        for count, quota, warps in [(32, 2, 4), (32, 2, 1), (5, 1, MAX_WARPS)]:
            got, src, dst = _launches(plan, count, quota, warps, 1)
            assert got == _expected(plan, count, quota, warps, 1, src, dst)


def test_a_check_turned_on_after_the_fast_call_is_made_reaches_it():
    """``KVNUMBA_CHECK`` turned on by ``config.override`` after the fast call was made: the call goes through the
    plan's checked run (which reads a prepared transfer's tables again), not the inlined launch."""
    call = build("transfer_kv_all_layer_mla", count=2, pool=8, num_layers=2)
    bound = {k: v for k, v in call.kwargs.items() if k not in ("src_indices", "dst_indices")}
    plan = kv.prepare("transfer_kv_all_layer_mla", **bound)._plan
    launched, ran = [], []

    def run(*args):
        ran.append(args[-2])  # the check the run was handed
        return 0

    plan.run = run
    fast = make_fast_call(plan, torch=_Torch, launch=lambda *args: launched.append(args) or (0,))
    src, dst = _Tensor(np.arange(2), plan.device), _Tensor(np.arange(2), plan.device)
    fast(src, dst, None, 2, 32, stream=7)
    assert (len(launched), ran) == (1, []), "with checks off the call should launch inline"
    with config.override(check=True):
        fast(src, dst, None, 2, 32, stream=7)
    assert (len(launched), ran) == (1, [False]), "KVNUMBA_CHECK did not reach the fast call"
