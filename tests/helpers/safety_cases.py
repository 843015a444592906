"""Valid calls of every kernel entry point, by argument name, to break one argument at a time.

``build(op)`` draws a small valid call (random sources, poisoned destinations) with the same
buffers for kvnumba (placed on the device or in pinned host memory, tables from
``kvnumba.layer_table``) and for ``kvnumba.reference`` (NumPy, per-layer lists).
"""
import inspect
from dataclasses import dataclass

import numpy as np

import kvnumba
from tests.helpers.cases import ENTRY_POINTS, POISON, Case, _args, _as_dtype, _buffers, _draw_indices
from kvnumba import reference
from tests.helpers.placement import PLACE, to_numpy


@dataclass
class Call:
    op: str
    kwargs: dict  # kvnumba's arguments by name
    ref_kwargs: dict  # the reference's, on NumPy copies
    dsts: list  # kvnumba destination buffers (per layer for tables)
    ref_dsts: list  # the reference's, same order
    case: Case

    def run(self, **override):
        getattr(kvnumba, self.op)(**{**self.kwargs, **override})

    def run_reference(self, **override):
        getattr(reference, self.op)(**{**self.ref_kwargs, **override})

    def dst_bytes(self):
        return [to_numpy(d).view(np.uint8).reshape(-1) for d in self.dsts]

    def untouched(self):
        return all((b == POISON).all() for b in self.dst_bytes())

    def matches_reference(self):
        return all(np.array_equal(got, want.view(np.uint8).reshape(-1))
                   for got, want in zip(self.dst_bytes(), self.ref_dsts))


def _named(fn, args):
    return dict(inspect.signature(fn).bind(*args).arguments)


def build(op, *, item_size=16, num_layers=2, pool=8, page_size=2, head_num=2, count=4, seed=0,
          src_place="device", dst_place="device", idx_place="device", dtype="fp16", block_quota=1,
          num_warps_per_block=1, layer_id=1, paged=False):
    headed = "ph" in op
    c = Case(op, item_size=item_size, num_layers=num_layers, page_size=page_size if headed or paged else 1,
             head_num=head_num if headed else 1, pool=pool, count=count, paged=paged, src_place=src_place,
             dst_place=dst_place, dtype=dtype, block_quota=block_quota, num_warps_per_block=num_warps_per_block,
             seed=seed, layer_id=layer_id)
    rng = np.random.default_rng(seed)
    src_l, dst_l, _, _ = c.layouts
    src = _buffers(src_l, c, rng, poison=False)
    dst = _buffers(dst_l, c, rng, poison=True)
    si, di = _draw_indices(c, rng), _draw_indices(c, rng)
    ref_dst = [None if side is None else [b.copy() for b in side] for side in dst]
    ref_kwargs = _named(getattr(reference, op), _args(c, src, ref_dst, si, di, tables=lambda bufs: bufs))

    def place(side, where):
        return None if side is None else [PLACE[where](_as_dtype(b, dtype)) for b in side]

    gpu_src = [place(side, src_place) for side in src]
    gpu_dst = [place(side, dst_place) for side in dst]
    idx = PLACE[idx_place]
    args = _args(c, gpu_src, gpu_dst, idx(si), idx(di), tables=kvnumba.layer_table)
    kwargs = _named(getattr(kvnumba, op), args)
    dsts = [b for side in gpu_dst if side is not None for b in side]
    ref_dsts = [b for side in ref_dst if side is not None for b in side]
    return Call(op, kwargs, ref_kwargs, dsts, ref_dsts, c)


OPS = list(ENTRY_POINTS)
