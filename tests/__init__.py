"""kvnumba's tests, one folder per subject; shared helpers in ``tests.helpers``. Tests marked ``gpu`` need a
real CUDA GPU (their files are named ``test_gpu_*.py``) and are skipped, with a reason, on the simulator and
on machines without a GPU (tests/conftest.py decides)."""
