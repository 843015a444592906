"""Where kvnumba runs: the GPU or Numba's CUDA simulator, and several GPUs."""
