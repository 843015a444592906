"""Launching a compiled kernel with as little host time as possible.

On the GPU, Numba's dispatcher costs ~20 us per launch (it re-inspects every argument), more than
the transfers it launches take. kvnumba compiles each kernel once for its fixed all-int64
signature, keeps the driver handle, and calls ``cuLaunchKernel`` through ctypes with a prebuilt,
per-thread parameter block: a few microseconds.

On the simulator the dispatcher is the launcher (and the stream is ignored).
"""
import ctypes
import threading

from .target import SIMULATOR
from ..kernels.factory import SIGNATURE, KernelArgs

_NUM_ARGS = len(KernelArgs._fields)


if SIMULATOR:

    def launch(kernel, blocks, threads, stream, args):
        kernel[blocks, threads](*args)

else:
    from numba import cuda

    _driver_lock = threading.RLock()
    _driver = None
    _launchers = {}

    def _libcuda():
        global _driver
        with _driver_lock:
            if _driver is None:
                lib = ctypes.CDLL("libcuda.so.1")
                fn = lib.cuLaunchKernel
                fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
                fn.restype = ctypes.c_int
                lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
                lib.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
                _driver = lib
        return _driver

    class _Launcher:
        """One compiled kernel on the current device, and per-thread parameter blocks."""

        def __init__(self, kernel):
            compiled = kernel.compile(SIGNATURE)
            handle = int(compiled._codelibrary.get_cufunc().handle)
            self.driver = _libcuda()
            self.local = threading.local()
            # Numba loads kernels as library kernels (CUkernel); resolving one to the context's
            # CUfunction once here saves the driver that lookup on every launch.
            function = ctypes.c_void_p()
            if self.driver.cuKernelGetFunction(ctypes.byref(function), handle) == 0 and function.value:
                handle = function.value
            self.function = handle

        def _params(self):
            local = self.local
            values = getattr(local, "values", None)
            if values is None:
                cuda.current_context()  # make the primary context current on this thread
                values = local.values = (ctypes.c_int64 * _NUM_ARGS)()
                base = ctypes.addressof(values)
                local.pointers = (ctypes.c_void_p * _NUM_ARGS)(*[base + 8 * i for i in range(_NUM_ARGS)])
            return values, local.pointers

        def __call__(self, blocks, threads, stream, args):
            local = self.local
            try:
                values, pointers = local.values, local.pointers
            except AttributeError:
                values, pointers = self._params()
            values[:] = args
            err = self.driver.cuLaunchKernel(self.function, blocks, 1, 1, threads, 1, 1, 0, stream, pointers, None)
            if err:
                name = ctypes.c_char_p()
                self.driver.cuGetErrorName(err, ctypes.byref(name))
                raise RuntimeError(f"cuLaunchKernel failed: {(name.value or b'?').decode()} ({err})")

    def launch(kernel, blocks, threads, stream, args):
        launcher = _launchers.get(kernel)
        if launcher is None:
            with _driver_lock:
                launcher = _launchers.get(kernel) or _Launcher(kernel)
            _launchers[kernel] = launcher
        launcher(blocks, threads, stream, args)
