"""Solution to the exercise of notebooks/05_disaggregated_handoff.ipynb: the NIXL descriptors of pulling layers 1
and 2 of the notebook's request from a page-first pool into vLLM blocks, by each route, predicted from the
layouts' shapes and checked against ``kvnumba.remote.plan_copy`` (``python
notebooks/solutions/05_disaggregated_handoff.py``; tests/test_notebooks.py runs it; no NIXL needed: the plan is
arithmetic on the layouts)."""
import numpy as np

import kvnumba as kv
from kvnumba.remote import plan_copy
from kvnumba.remote.plan import STAGED_GAIN

L, T, P, H, D = 4, 256, 8, 2, 16                  # the notebook's pool and cache (uint16: bf16 bits)
ITEM = H * D * 2                                  # 64 bytes: one token's K (or V) in one layer
BLOCKS = np.array([13, 2, 9, 5, 11])
REQUEST = np.arange(96, 136)                      # 40 tokens of the prefill's pool
SLOTS = (BLOCKS[:, None] * P + np.arange(P)).ravel()
LAYERS = range(1, 3)


def predict():
    """- direct: in the page-first pool ``[T, L, H, D]`` a token's layers sit side by side, so token t's layer 1 and
      token t + 1's layer 1 are L items apart; in a vLLM layer ``[2, blocks, P, H, D]`` consecutive slots of a
      block are adjacent, but layers are separate buffers. No two items are adjacent on both sides: one
      descriptor per token, layer and K/V, 40 x 2 x 2 = 160 of 64 bytes.
    - staged: the pool's own runs: each token's layers 1 and 2 are adjacent (128 bytes), but its layer 3 and the
      next token's layer 0 are not moved, so the runs break at every token: 40 x 2 (K, V) = 80 of 128 bytes.
    - auto: 80 x 2 <= 160, exactly half, so it stages. (With all 4 layers, a token's whole row and the next
      token's row are adjacent: one run for K and one for V, 2 descriptors against 320.)"""
    tokens, layers, k_and_v = REQUEST.size, len(LAYERS), 2
    direct = tokens * layers * k_and_v
    staged = tokens * k_and_v
    return direct, staged, "staged" if staged * STAGED_GAIN <= direct else "direct"


def check():
    pool = kv.PageFirst(*(np.zeros((T, L, H, D), np.uint16) for _ in range(2)))
    cache = kv.VllmFlashAttn([np.zeros((2, T // P, P, H, D), np.uint16) for _ in range(L)])
    planned = plan_copy(pool, cache, REQUEST, SLOTS, LAYERS, remote="src")   # a READ, as the decode's
    direct, staged, auto = predict()
    assert (planned.direct, planned.staged, planned.route) == (direct, staged, auto), planned
    assert planned.smallest == planned.largest == len(LAYERS) * ITEM   # the staged runs: one token's two layers
    forced = plan_copy(pool, cache, REQUEST, SLOTS, LAYERS, remote="src", route="direct")
    assert forced.smallest == forced.largest == ITEM and forced.bytes == planned.bytes
    return planned


if __name__ == "__main__":
    direct, staged, auto = predict()
    planned = check()
    print(f"direct {direct} descriptors of {ITEM} B, staged {staged} of {len(LAYERS) * ITEM} B, auto takes {auto}")
    print(f"kvnumba.remote plans the same: {planned}")
