"""The simulator's twins of the kernels' GPU side, in plain Python with the same names (``kernels.tma`` and the
like choose once, at import, between their GPU code and their twin here)."""
