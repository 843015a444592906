"""Random transfer cases for every entry point, run through kvnumba and the NumPy reference.

A case draws source buffers with random bytes, destination buffers filled with a poison pattern,
and token indices; ``run_case`` runs the entry point and the reference on identical copies and
compares every destination byte, so bytes outside the destination indices must stay poisoned.
"""
from dataclasses import dataclass, field

import numpy as np

import kvnumba
from kvnumba import reference
from kvnumba.plan.spec import KERNEL_ENTRY_POINTS, SPECS
from tests.helpers.placement import PLACE, TORCH_PLACE, to_numpy

# kernel entry point -> (source layout, destination layout, MLA, moves one layer), from kvnumba's table
ENTRY_POINTS = {name: (SPECS[name].src_layout.value, SPECS[name].dst_layout.value, SPECS[name].mla,
                       SPECS[name].one_layer) for name in KERNEL_ENTRY_POINTS}

DTYPES = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32, "int8": np.int8}
POISON = 0xA5


@dataclass
class Case:
    op: str
    item_size: int = 64
    num_layers: int = 2
    page_size: int = 1
    head_num: int = 1
    pool: int = 32  # token slots in each buffer
    count: int = 8  # tokens moved
    paged: bool = False
    src_place: str = "device"
    dst_place: str = "device"
    dtype: str = "fp16"
    block_quota: int = 2
    num_warps_per_block: int = 2
    seed: int = 0
    layer_id: int = field(default=None)
    indices: tuple = None  # (src, dst) token indices to use instead of drawn ones


    @property
    def layouts(self):
        return ENTRY_POINTS[self.op]


def _shape(layout, c):
    """NumPy shape of one buffer of ``layout`` in bytes-per-dtype units (last axis is the item)."""
    item = c.item_size
    if layout in ("lf", "lf_tbl"):
        return (c.pool, item)
    if layout == "pf":
        return (c.pool, c.num_layers, item)
    if layout == "ph":
        return (c.pool // c.page_size, c.head_num, c.page_size, c.num_layers, item // c.head_num)
    raise AssertionError(layout)


def _draw_indices(c, rng):
    if not c.paged:
        return rng.choice(c.pool, size=c.count, replace=False).astype(np.int64)
    pages = rng.choice(c.pool // c.page_size, size=c.count // c.page_size, replace=False)
    return (pages[:, None] * c.page_size + np.arange(c.page_size)).reshape(-1).astype(np.int64)


def _buffers(layout, c, rng, poison):
    """K and V (V None for MLA) as lists of byte arrays: one per layer for table layouts."""
    mla = c.layouts[2]
    n = c.num_layers if layout == "lf_tbl" else 1

    def one():
        shape = _shape(layout, c)
        if poison:
            return np.full(shape, POISON, dtype=np.uint8)
        return rng.integers(0, 256, size=shape, dtype=np.uint8)

    k = [one() for _ in range(n)]
    v = None if mla else [one() for _ in range(n)]
    return k, v


def _as_dtype(byte_array, dtype):
    return byte_array.view(DTYPES[dtype])


def _args(c, src, dst, si, di, tables):
    """Positional arguments of entry point ``c.op``, in the order of its ``SPECS`` entry, given K/V lists;
    ``tables`` builds table operands."""
    spec = SPECS[c.op]
    src_l, dst_l, mla, _ = c.layouts

    def operand(layout, buffers):
        if buffers is None:
            return None
        return tables(buffers) if layout == "lf_tbl" else buffers[0]

    sk, dk = operand(src_l, src[0]), operand(dst_l, dst[0])
    sv, dv = operand(src_l, src[1]), operand(dst_l, dst[1])
    dim = c.num_layers * c.item_size
    values = dict(zip(spec.buffers, (sk, dk) if mla else (sk, dk, sv, dv)),
                  src_indices=si, dst_indices=di, layer_id=c.layer_id, item_size=c.item_size, src_layout_dim=dim,
                  dst_layout_dim=dim, num_layers=c.num_layers, page_size=c.page_size, head_num=c.head_num,
                  block_quota=c.block_quota, num_warps_per_block=c.num_warps_per_block)
    return tuple(values[name] for name in spec.params)


def run_case(c, stream=None, framework="numba"):
    """Run ``c`` through kvnumba and the reference; assert every destination byte agrees.

    ``framework="torch"`` places buffers and indices as torch tensors (the fast per-call path)."""
    places = TORCH_PLACE if framework == "torch" else PLACE
    rng = np.random.default_rng(c.seed)
    if c.layer_id is None:
        c.layer_id = int(rng.integers(c.num_layers))
    src_l, dst_l, mla, _ = c.layouts
    src = _buffers(src_l, c, rng, poison=False)
    dst = _buffers(dst_l, c, rng, poison=True)
    if c.indices is not None:
        si, di = (np.asarray(i, dtype=np.int64) for i in c.indices)
    else:
        si, di = _draw_indices(c, rng), _draw_indices(c, rng)

    # Reference: on NumPy copies, with per-layer lists where kvnumba takes tables.
    ref_dst = [None if side is None else [b.copy() for b in side] for side in dst]
    getattr(reference, c.op)(*_args(c, src, ref_dst, si, di, tables=lambda bufs: bufs))

    # kvnumba: the same bytes placed on the device or in pinned host memory, viewed as c.dtype.
    def place(side, where):
        return None if side is None else [places[where](_as_dtype(b, c.dtype)) for b in side]

    gpu_src = [place(side, c.src_place) for side in src]
    gpu_dst = [place(side, c.dst_place) for side in dst]
    idx = places["device"]
    kw = {} if stream is None else {"stream": stream}
    getattr(kvnumba, c.op)(*_args(c, gpu_src, gpu_dst, idx(si), idx(di), tables=kvnumba.layer_table), **kw)

    moved = 0
    for got_side, want_side in zip(gpu_dst, ref_dst):
        if got_side is None:
            continue
        for got, want in zip(got_side, want_side):
            got = to_numpy(got).view(np.uint8).reshape(want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"{c}")
            moved += int((want != POISON).sum())
    # Guard against a vacuous pass: the reference must have written something (unless N == 0).
    assert c.count == 0 or moved > 0, "case moved no bytes"
