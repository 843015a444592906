"""The kernel entry points against the NumPy reference, their inner-loop shapes, their PTX, the simulator twins
of the GPU code, the oracle and the table of entry points."""
