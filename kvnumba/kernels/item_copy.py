"""A warp's copy of items through registers, the loop both kernels run: each item's two indices, the bounds
guard, then every layer, K and V, head by head. The register kernel (``kernels.factory``) runs it over a
warp's share; the staged kernel (``kernels.staged``) over the items it does not move in bulk.
"""
from .jit import device_function
from .memory import load_i64, store_u64
from .warp_copy import make_copies


@device_function
def in_bounds(lane, src_token, dst_token, src_token_limit, dst_token_limit, error_flag):
    """The bounds guard: False (and the error flag set) when an index is outside its buffer; such an
    item is skipped, never followed (kvnumba.checks.guard reports the flag)."""
    if src_token < 0 or src_token >= src_token_limit or dst_token < 0 or dst_token >= dst_token_limit:
        if error_flag != 0 and lane == 0:
            store_u64(error_flag, 1)
        return False
    return True


def make_items_copy(src, dst, mla, copy_shape):
    """``copy_items(lane, first, j, count, step, src_indices, dst_indices, first_layer, num_layers,
    src_token_limit, dst_token_limit, src_k, dst_k, src_v, dst_v, item_size, src_layout_dim, dst_layout_dim,
    src_page_size, dst_page_size, head_num, error_flag)``: the warp copies items ``first + j``, ``first + j +
    step``, .. below ``first + count`` in layers ``[first_layer, first_layer + num_layers)``, skipping an item
    out of bounds (``src``/``dst``: ``LayoutParts``; ``copy_shape``: ``warp_copy.CopyShape``)."""
    src_layer_base, src_token_offset, src_head_stride = src.layer_base, src.token_offset, src.head_stride
    dst_layer_base, dst_token_offset, dst_head_stride = dst.layer_base, dst.token_offset, dst.head_stride
    headed = src.head_split or dst.head_split
    copy_item, copy_pair = make_copies(copy_shape)
    paired = copy_shape.paired and not mla

    @device_function
    def copy_tokens(lane, src_token, dst_token, first_layer, num_layers, src_k, dst_k, src_v, dst_v, item_size,
                    src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num):
        heads = head_num if headed else 1
        chunk = item_size // heads
        src_stride = src_head_stride(src_layout_dim, item_size, heads, src_page_size)
        dst_stride = dst_head_stride(dst_layout_dim, item_size, heads, dst_page_size)
        # Address parts are computed where they change: per item, per layer, per head.
        src_offset = src_token_offset(src_token, src_layout_dim, item_size, heads, src_page_size)
        dst_offset = dst_token_offset(dst_token, dst_layout_dim, item_size, heads, dst_page_size)
        for layer in range(first_layer, first_layer + num_layers):
            sk = src_layer_base(src_k, layer, src_layout_dim, item_size, heads, src_page_size) + src_offset
            dk = dst_layer_base(dst_k, layer, dst_layout_dim, item_size, heads, dst_page_size) + dst_offset
            if mla:
                for head in range(heads):
                    copy_item(lane, sk + head * src_stride, dk + head * dst_stride, chunk)
                continue
            sv = src_layer_base(src_v, layer, src_layout_dim, item_size, heads, src_page_size) + src_offset
            dv = dst_layer_base(dst_v, layer, dst_layout_dim, item_size, heads, dst_page_size) + dst_offset
            for head in range(heads):
                s_head = head * src_stride
                d_head = head * dst_stride
                if paired:  # K and V in one loop: twice the bytes in flight
                    copy_pair(lane, sk + s_head, dk + d_head, sv + s_head, dv + d_head, chunk)
                else:
                    copy_item(lane, sk + s_head, dk + d_head, chunk)
                    copy_item(lane, sv + s_head, dv + d_head, chunk)

    @device_function
    def copy_items(lane, first, j, count, step, src_indices, dst_indices, first_layer, num_layers, src_token_limit,
                   dst_token_limit, src_k, dst_k, src_v, dst_v, item_size, src_layout_dim, dst_layout_dim,
                   src_page_size, dst_page_size, head_num, error_flag):
        while j < count:
            item = first + j
            src_token = load_i64(src_indices + item * 8)  # both indices in flight together
            dst_token = load_i64(dst_indices + item * 8)
            if in_bounds(lane, src_token, dst_token, src_token_limit, dst_token_limit, error_flag):
                copy_tokens(lane, src_token, dst_token, first_layer, num_layers, src_k, dst_k, src_v, dst_v,
                            item_size, src_layout_dim, dst_layout_dim, src_page_size, dst_page_size, head_num)
            j += step

    return copy_items
