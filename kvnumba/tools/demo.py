"""``kvnumba demo``: a HiCache-style round trip, verified byte for byte: every layer of a paged KV cache backed
up from the GPU into a page-first pinned-host pool (``transfer_kv_all_layer_lf_pf``), loaded back layer by
layer (``transfer_kv_per_layer_pf_lf``), checked against ``kvnumba.reference``, with bytes, time and GB/s.
On the simulator (no GPU) the same steps run at a tiny size; the times there mean nothing.
"""
from dataclasses import dataclass

import numpy as np

from ..driver.target import SIMULATOR


@dataclass
class DemoShape:
    layers: int = 32
    item_size: int = 2048  # 8 KV heads x 128 x bf16
    page_size: int = 64
    tokens: int = 8192  # moved each way
    pool: int = 16384  # token slots on each side
    block_quota: int = 2
    num_warps_per_block: int = 32


SIMULATOR_SHAPE = DemoShape(layers=2, item_size=64, page_size=4, tokens=16, pool=32, block_quota=2,
                            num_warps_per_block=2)


def _page_aligned_tokens(rng, shape):
    pages = rng.choice(shape.pool // shape.page_size, shape.tokens // shape.page_size, replace=False)
    return (pages[:, None] * shape.page_size + np.arange(shape.page_size)).reshape(-1).astype(np.int64)


def run(shape=None, seed=0, out=print):
    """Run the demo; returns a dict of results. Raises AssertionError if any byte is wrong."""
    from .. import reference  # here, not at import: ``kvnumba demo --help`` reads only the shapes above
    from ..arrays import device_array, pinned
    from ..testing import to_numpy
    from ..api import entry_points
    from ..api.tables import layer_table
    from .timing import CLOCK, GpuTimer

    shape = shape or (SIMULATOR_SHAPE if SIMULATOR else DemoShape())
    rng = np.random.default_rng(seed)
    L, item = shape.layers, shape.item_size
    dim = L * item
    out(f"kvnumba demo on {'the CUDA simulator (tiny size; times mean nothing)' if SIMULATOR else 'the GPU'}: "
        f"{L} layers, item {item} B, page {shape.page_size}, {shape.tokens} of {shape.pool} tokens")

    k_np = [rng.integers(0, 256, (shape.pool, item), dtype=np.uint8) for _ in range(L)]
    v_np = [rng.integers(0, 256, (shape.pool, item), dtype=np.uint8) for _ in range(L)]
    gpu_k = [device_array(a) for a in k_np]
    gpu_v = [device_array(a) for a in v_np]
    host_k = pinned(np.zeros((shape.pool, L, item), np.uint8))
    host_v = pinned(np.zeros((shape.pool, L, item), np.uint8))
    device_tokens = _page_aligned_tokens(rng, shape)
    host_tokens = _page_aligned_tokens(rng, shape)
    d_idx, h_idx = device_array(device_tokens), device_array(host_tokens)
    launch = (shape.block_quota, shape.num_warps_per_block)

    # 1. backup: all layers, device -> host, page-first
    k_table, v_table = layer_table(gpu_k), layer_table(gpu_v)
    entry_points.transfer_kv_all_layer_lf_pf(k_table, host_k, v_table, host_v, d_idx, h_idx, item, dim, L, *launch)  # warm-up
    with GpuTimer() as backup:
        entry_points.transfer_kv_all_layer_lf_pf(k_table, host_k, v_table, host_v, d_idx, h_idx, item, dim, L, *launch)

    # 2. load back: layer by layer, host -> device, into fresh poisoned buffers
    load_k = [device_array(np.full((shape.pool, item), 0xA5, np.uint8)) for _ in range(L)]
    load_v = [device_array(np.full((shape.pool, item), 0xA5, np.uint8)) for _ in range(L)]
    scratch = device_array(np.zeros((shape.pool, item), np.uint8))  # warm-up: compile, first touch
    entry_points.transfer_kv_per_layer_pf_lf(host_k, scratch, host_v, scratch, h_idx, d_idx, 0, item, dim, *launch)
    with GpuTimer() as load:
        for layer in range(L):
            entry_points.transfer_kv_per_layer_pf_lf(host_k, load_k[layer], host_v, load_v[layer], h_idx, d_idx, layer,
                                            item, dim, *launch)

    # 3. verify every byte against the reference
    want_k = np.zeros((shape.pool, L, item), np.uint8)
    want_v = np.zeros_like(want_k)
    reference.transfer_kv_all_layer_lf_pf(k_np, want_k, v_np, want_v, device_tokens, host_tokens, item, dim, L)
    np.testing.assert_array_equal(to_numpy(host_k), want_k, err_msg="backup differs from the reference")
    np.testing.assert_array_equal(to_numpy(host_v), want_v, err_msg="backup differs from the reference")
    for layer in range(L):
        want = np.full((shape.pool, item), 0xA5, np.uint8)
        want[device_tokens] = k_np[layer][device_tokens]
        np.testing.assert_array_equal(to_numpy(load_k[layer]), want, err_msg=f"K layer {layer} differs")
        want[device_tokens] = v_np[layer][device_tokens]
        np.testing.assert_array_equal(to_numpy(load_v[layer]), want, err_msg=f"V layer {layer} differs")

    moved = 2 * shape.tokens * L * item  # K and V, each way
    results = {}
    for name, clock in (("backup  all layers  device->host (lf->pf)", backup),
                        ("load    per layer   host->device (pf->lf)", load)):
        gbps = moved / clock.seconds / 1e9
        out(f"{name}: {moved:>12,} B in {clock.seconds * 1e3:9.3f} ms = {gbps:8.3f} GB/s")
        results[name.split()[0]] = {"bytes": moved, "seconds": clock.seconds, "gbps": gbps}
    out(f"times from {CLOCK}")
    out("verified: every byte matches kvnumba.reference")
    return results
