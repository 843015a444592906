"""The kernel entry points against the NumPy reference, their inner-loop shapes, their PTX, the oracle and the table of entry points."""
