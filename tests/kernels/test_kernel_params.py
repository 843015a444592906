"""Named kernel parameters: every kernel takes the parameter block that kvnumba.kernels.params defines, in its
order, and the plans fill their blocks from it (KernelArgs, StagedArgs)."""
import pytest

from kvnumba.kernels import factory, layouts, params, staged
from kvnumba.layouts.page_unified import PageUnified
from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS

# Every source whose layout declares a map geometry (a page-unified pool's, of K and V in head groups)
STAGED_SOURCES = (layouts.LAYER_FIRST, layouts.PAGE_FIRST, layouts.PAGE_HEAD, PageUnified.arithmetic(2, 2))


@pytest.mark.parametrize("op", KERNEL_ENTRY_POINTS)
def test_register_kernels_take_kernel_args(op):
    spec = SPECS[op]
    kernel = factory.get_kernel(spec.src_layout, spec.dst_layout, spec.mla)
    assert params.parameters(kernel.py_func) == params.KernelArgs._fields


def test_the_staged_sources_are_those_that_declare_a_map_geometry():
    assert all(staged.stageable(parts) for parts in STAGED_SOURCES)
    assert not any(staged.stageable(parts) for parts in (layouts.LAYER_TABLE, PageUnified.arithmetic(1, 1)))


@pytest.mark.parametrize("src", STAGED_SOURCES, ids=lambda p: p.name)
@pytest.mark.parametrize("dst", staged.DESTINATIONS, ids=lambda p: p.name)
@pytest.mark.parametrize("mla", [False, True])
def test_staged_kernels_take_staged_args(src, dst, mla):
    kernel = staged.get_staged_kernel(src, dst, mla)
    assert params.parameters(kernel.py_func) == params.StagedArgs._fields
    assert params.StagedArgs._fields[:len(params.KernelArgs._fields)] == params.KernelArgs._fields


def test_signatures_count_the_fields():
    assert factory.SIGNATURE == params.signature(params.KernelArgs) == "void(" + ", ".join(["int64"] * 19) + ")"
    assert staged.SIGNATURE == params.signature(params.StagedArgs) == "void(" + ", ".join(["int64"] * 22) + ")"


def test_a_call_writes_the_leading_fields():
    fields = params.KernelArgs._fields
    assert fields[:params.PER_CALL_ARGS] == ("src_indices", "dst_indices", "num_items", "items_per_warp")
    assert fields[params.PER_CALL_ARGS:params.PER_LAYER_ARGS] == ("first_layer", "src_token_limit", "dst_token_limit")
    assert params.pack_call.__self__.size == 8 * params.PER_LAYER_ARGS


def test_a_kernel_in_another_order_is_refused():
    def transfer_kv(dst_indices, src_indices, *rest):
        pass

    with pytest.raises(TypeError, match="must take src_indices, dst_indices"):
        params.check_parameters(transfer_kv, params.KernelArgs)

