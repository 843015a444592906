"""Tuning settings: set from Python with kvnumba.config.override, read where kernels and plans are built, and
restored (with the plans built under them dropped) when the block ends."""
import pytest

from kvnumba import config
from kvnumba.errors import SettingError
from kvnumba.kernels import factory, staged
from kvnumba.kernels.layouts import LAYER_FIRST, PAGE_FIRST
from kvnumba.kernels.warp_copy import CopyShape
from kvnumba.plan import staged_plan, tensor_maps


def test_copy_shape_forces_every_kernels_shape():
    tuned = factory.copy_shape_for(PAGE_FIRST, LAYER_FIRST, False)
    forced = CopyShape(words=4, wide=True, paired=False)
    assert forced != tuned
    with config.override(copy_shape=forced):
        assert factory.copy_shape_for(PAGE_FIRST, LAYER_FIRST, False) == forced
        assert factory.copy_shape_for(PAGE_FIRST, LAYER_FIRST, True) == forced
    assert factory.copy_shape_for(PAGE_FIRST, LAYER_FIRST, False) == tuned


def test_staged_shape_is_the_ring_plans_use():
    ring = staged.StagedShape(stages=2, slots=4)
    assert staged_plan.ring_in_force() is staged.SHAPE
    with config.override(staged_shape=ring):
        assert staged_plan.ring_in_force() is ring
    assert staged_plan.ring_in_force() is staged.SHAPE


def test_map_store_and_l2_promotion():
    store = tensor_maps.MapStore()
    with config.override(map_store=store, l2_promotion="L2_128B"):
        assert config.tuning("map_store") is store and config.tuning("l2_promotion") == "L2_128B"
        maps = tensor_maps.source_maps(PAGE_FIRST, 1 << 20, 2 << 20, 64 * 1024, 256, 1024, 1, 1, False, (4, 1),
                                       64 * 1024)
        assert maps is not None and store._slabs  # written to the store in force
    assert config.tuning("map_store") is None and config.tuning("l2_promotion") is None


def test_a_bad_tuning_value_changes_nothing():
    with pytest.raises(SettingError, match="l2_promotion must be one of"):
        with config.override(l2_promotion="L2_512B", copy_shape=CopyShape(2, True, True)):
            pass
    assert config.tuning("copy_shape") is None
    with pytest.raises(TypeError, match="unknown settings copy_shapes"):
        with config.override(copy_shapes=None):
            pass


def test_override_drops_the_plans():
    dropped = []
    config.on_change(lambda: dropped.append(1))
    try:
        with config.override(host_index_checks=False):
            assert config.tuning("host_index_checks") is False
        assert len(dropped) == 2  # on entry and on exit
    finally:
        config._listeners.pop()
