"""A stand-in for torch, just what the fast call (``kvnumba.plan.per_call.make_fast_call``) reads of a torch
index tensor, over a NumPy int64 array: with it (and a stand-in for cuLaunchKernel) the fast call runs on the
simulator too."""
import numpy as np

INT64 = object()  # the stand-in torch's int64


class Tensor:
    """A 1-D int64 "tensor" on ``device`` over a NumPy array (``values``)."""

    def __init__(self, values, device, dtype=INT64):
        self.values = np.ascontiguousarray(values, dtype=np.int64)
        self.dtype, self.device = dtype, device

    def data_ptr(self):
        return self.values.ctypes.data

    def numel(self):
        return self.values.size

    def stride(self):
        return (1,)

    def get_device(self):
        return self.device


class _C:
    @staticmethod
    def _cuda_getCurrentRawStream(device):
        return 0


class Torch:
    Tensor, int64, _C = Tensor, INT64, _C
