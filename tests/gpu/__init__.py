"""Tests that need a real CUDA GPU (and torch): every test here is marked ``gpu`` and skipped, with a
reason, on the simulator and on machines without a GPU (tests/conftest.py decides)."""
