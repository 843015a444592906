"""The simulator's twins of the kernels' GPU side: the intrinsics (``memory``, ``tma``) and Numba's decorators
(``jit``) in plain Python, with the same names, run by Numba's CUDA simulator as it runs the kernels. Each public
module (``kernels.memory``, ``kernels.tma``, ``kernels.jit``) chooses once, at import, between its GPU code and
its twin here; ``tests/kernels/test_twins.py`` checks that both define the same names."""
