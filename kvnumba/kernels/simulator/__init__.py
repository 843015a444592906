"""The simulator's twins of the kernels' GPU intrinsics: plain Python with the same names, which Numba's CUDA
simulator runs as it runs the kernels. Each public module (``kernels.memory``, ``kernels.tma``) chooses once,
at import, between its inline-PTX intrinsics and its twin here; ``tests/kernels/test_twins.py`` checks that
both expose the same names."""
