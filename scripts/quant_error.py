"""The error of each quantised format against bfloat16, from the NumPy references (no GPU): FP8 e4m3 and e5m2
(one float32 scale per head, ``kvnumba.quant.fp8``) and vLLM's NVFP4 (e4m3 scales per 16 elements, global scale
1.0, ``kvnumba.quant.nvfp4``), on standard normal values in heads of 128 (docs/guides/fp8.md quotes its output).

    python scripts/quant_error.py [--tokens N] [--seed S]
"""
import argparse

import ml_dtypes
import numpy as np

from kvnumba.quant import fp8, nvfp4

BYTES = {"e4m3": 1 + 4 / 128, "e5m2": 1 + 4 / 128, "nvfp4": 0.5 + 1 / 16}  # per element, scales included


def errors(x):
    """``{format: (bytes per element, relative RMS error, largest |error|)}`` of bfloat16 values ``x`` [..., 128]."""
    wide = x.astype(np.float32)
    out = {}
    for name in ("e4m3", "e5m2", "nvfp4"):
        back = fp8.dequantise(*fp8.quantise(x, name), fmt=name) if name != "nvfp4" else nvfp4.dequantise(*nvfp4.quantise(x))
        error = back.astype(np.float32) - wide
        out[name] = (BYTES[name], float(np.sqrt((error ** 2).mean() / (wide ** 2).mean())), float(np.abs(error).max()))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    x = np.random.default_rng(args.seed).normal(size=(args.tokens, 8, 128)).astype(ml_dtypes.bfloat16)
    print("| format | bytes per element | relative RMS error | largest error |")
    print("|---|---|---|---|")
    for name, (size, rms, largest) in errors(x).items():
        print(f"| {name} | {size:.3f} | {rms:.4f} | {largest:.3f} |")


if __name__ == "__main__":
    main()
