"""The resident loader's staged build (``KVNUMBA_LOAD_PATH=staged`` forces it, so these run on the simulator's twin
too): page-first and page-head sources, into a layer-first view or a list of layer buffers, MLA, byte for byte
against the reference; bulk pieces and direct batches in every layer (the ring made again per layer), blocks of few
runs through registers; every layer published."""
import numpy as np
import pytest

import kvnumba as kv
from kvnumba import config, reference
from kvnumba.kernels import staged
from tests.helpers.placement import PLACE
from tests.helpers.view_cases import POISON, assert_same_bytes, make_view, view_bytes

pytestmark = [pytest.mark.needs_target]

L, T, P, H, D = 3, 64, 16, 2, 64  # items of 2 heads x 64 uint16 = 256 bytes
# A small ring: pieces of 4 to 16 tokens, two buffers behind eight posts, two store warps; every block on it.
RING = staged.StagedShape(stages=2, stage_bytes=8 * 1024, slots=8, store_warps=2, direct_batch=8,
                          min_bulk_bytes=1024, fallback_runs=0)
MIXED = np.concatenate([np.arange(s, s + n) for s, n in ((0, 1), (4, 2), (9, 3), (14, 9), (30, 5), (40, 17))])


@pytest.fixture
def staged_path(fresh_plans):
    with config.override(load_path="staged"):
        yield


def run_load(src_name, dst_name, sources, *, mla=False, warps=3, block_quota=2):
    rng = np.random.default_rng(len(sources))
    src_np, src = make_view(src_name, L, T, P, H, D, rng, poison=False, mla=mla, place=("host", "numba"))
    dst_np, dst = make_view(dst_name, L, T, P, H, D, rng, poison=True, mla=mla, place=("device", "numba"))
    si = np.asarray(sources, np.int64)
    di = rng.permutation(T)[:len(si)].astype(np.int64)
    done = kv.load_resident(src, dst, PLACE["device"](si), PLACE["device"](di), block_quota=block_quota,
                            num_warps_per_block=warps)
    done.synchronize()
    reference.copy(src_np, dst_np, si, di, None)
    assert assert_same_bytes(view_bytes(dst), view_bytes(dst_np), POISON, f"{src_name} -> {dst_name}") > 0
    assert done.landed() == L
    return done


@pytest.mark.parametrize("src_name,dst_name,mla", [("PageFirst", "LayerFirstList", False),
                                                   ("PageHead", "LayerFirstList", False),
                                                   ("PageFirst", "LayerFirst", False),
                                                   ("PageFirst", "LayerFirst", True)])
def test_bulk_pieces_and_direct_batches_in_every_layer(staged_path, staged_ring, src_name, dst_name, mla):
    staged_ring(RING)
    assert run_load(src_name, dst_name, MIXED, mla=mla).staged


def test_blocks_of_few_runs_copy_through_registers(staged_path, staged_ring):
    staged_ring(RING._replace(fallback_runs=10))
    assert run_load("PageFirst", "LayerFirstList", np.random.default_rng(1).choice(T, 24, replace=False)).staged


def test_layouts_the_ring_cannot_read_take_the_register_build(staged_path, staged_ring):
    staged_ring(RING)
    assert not run_load("LayerFirst", "LayerFirstList", MIXED).staged  # a layer-first map pictures one layer
    assert not run_load("PageFirst", "LayerFirstList", MIXED, warps=1).staged  # a ring needs two warps
