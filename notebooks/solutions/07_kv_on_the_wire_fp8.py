"""Solution to the exercise of notebooks/07_kv_on_the_wire_fp8.ipynb: a token's bytes in bf16 and in FP8
(``python notebooks/solutions/07_kv_on_the_wire_fp8.py``; tests/test_notebooks.py runs it)."""
import ml_dtypes
import numpy as np

import kvnumba as kv


def qwen_token_bytes():
    """Qwen2.5-7B: 28 layers, 4 KV heads of 128.

    - bf16: 28 x 2 (K and V) x 4 x 128 x 2 bytes = 57,344;
    - FP8: 28 x 2 x (4 x 128 one-byte codes + 4 float32 scales of 4 bytes) = 28 x 2 x 528 = 29,568, a ratio of
      0.516: the scales add 16 bytes to every 512 of codes.
    """
    bf16, fp8 = 28 * 2 * 4 * 128 * 2, 28 * 2 * (4 * 128 + 4 * 4)
    view = kv.LayerFirst(*(np.zeros((28, 1, 4, 128), ml_dtypes.bfloat16) for _ in range(2)))
    quantised = kv.fp8_like(view, "e4m3")
    assert bf16 == view.k.nbytes + view.v.nbytes
    assert fp8 == sum(b.nbytes for part in (quantised.codes, quantised.scales) for w in ("k", "v")
                      for b in part.buffers(w))
    return bf16, fp8


if __name__ == "__main__":
    bf16, fp8 = qwen_token_bytes()
    print(f"a token of Qwen2.5-7B: {bf16:,} bytes in bf16, {fp8:,} in FP8 ({fp8 / bf16:.3f})")
