"""Solution to the exercise of notebooks/06_transfers_under_load.ipynb: which route ``kv.copy``'s ``auto`` takes for
three index patterns, predicted from the run lengths and checked by copying (``python
notebooks/solutions/06_transfers_under_load.py``; tests/test_notebooks.py runs it, on the simulator)."""
import numpy as np

import kvnumba as kv
from kvnumba.plan.routes import COPY_ENGINE_MIN_BYTES
from kvnumba.testing import device_array, pinned, synchronize, to_numpy

ITEM = 8 * 128 * 2  # bytes of one token's K in one layer: 8 heads of 128 bf16

PATTERNS = {"tokens 0-63 and 128-191": np.r_[0:64, 128:192],
            "every fourth token, 0 to 252": np.arange(0, 256, 4),
            "runs of 16 tokens, 16 apart": (np.arange(0, 256, 32)[:, None] + np.arange(16)).reshape(-1)}


def predict(tokens):
    """Consecutive tokens (on both sides: the same indices here) make one copy a layer: runs of 64 tokens are
    128 KiB copies, past ``COPY_ENGINE_MIN_BYTES`` (64 KiB), so the copy engine; single tokens are 2 KiB and
    runs of 16 are 32 KiB copies, below it, so the kernel."""
    breaks = np.flatnonzero(np.diff(tokens) != 1)
    copies = len(breaks) + 1
    return "copy_engine" if len(tokens) * ITEM / copies >= COPY_ENGINE_MIN_BYTES else "kernel"


def check():
    rng = np.random.default_rng(0)
    k, v = (rng.integers(0, 2**16, (2, 256, 8, 128), dtype=np.uint16) for _ in range(2))
    host = kv.LayerFirst(pinned(k), pinned(v))
    out = {}
    for name, tokens in PATTERNS.items():
        gpu = kv.LayerFirst(device_array(np.zeros_like(k)), device_array(np.zeros_like(v)))
        tokens = tokens.astype(np.int64)
        kv.copy(host, gpu, tokens, tokens)
        synchronize()
        out[name] = (predict(tokens), kv.last_route())
        assert out[name][0] == out[name][1], (name, out[name])
        assert (to_numpy(gpu.k)[:, tokens] == k[:, tokens]).all()
    return out


if __name__ == "__main__":
    for name, (predicted, took) in check().items():
        print(f"{name:30s} predicted {predicted:12s} took {took}")
