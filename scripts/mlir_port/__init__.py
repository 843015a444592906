"""kvnumba's kernel modules compiled by numba-cuda-mlir, everything else on numba-cuda: ``install(ports)``.

kvnumba's host side (plans, tensor maps, device tables, the launch through ``cuLaunchKernel``) stays on
numba-cuda. Every module of ``kvnumba.kernels`` (the simulator's twins aside) is loaded with its ``numba``
imports answered by numba-cuda-mlir: ``numba.cuda`` is ``numba_cuda_mlir.cuda``, ``numba.types`` and the
scalar types are its types, ``numba.cuda.extending`` its extending module. That is the change of import
numba-cuda-mlir's README asks for, made per module (each module's ``__import__``), so the rest of the
package keeps the real numba-cuda in the same process.

``ports`` names the kernel modules whose GPU branch (the ``else:`` of their top-level ``if SIMULATOR:``)
is replaced by this folder's file of the same name: ``("jit",)`` is the change of import alone (the
decorators), ``PORTS`` also swaps every llvmlite intrinsic for numba-cuda-mlir's ``inline_ptx``. The
kernel bodies, layouts and loops are kvnumba's own, unchanged. numba-cuda-mlir compiles a kernel at
its first launch; kvnumba's launcher takes the compiled kernel's ``_codelibrary.get_cufunc().handle`` as
it does numba-cuda's.
"""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
IMPORT_ONLY = ("jit",)
PORTS = ("jit", "memory", "tma", "async_copy", "words", "fp8")
_PREFIX = "kvnumba.kernels."


def _numba_alias():
    """The modules that a kernel module's ``numba`` imports get instead of numba-cuda's."""
    import numba_cuda_mlir.cuda as mcuda
    from numba_cuda_mlir.numba_cuda import extending as mext
    from numba_cuda_mlir.numba_cuda import types as mtypes

    class Numba(types.ModuleType):
        def __getattr__(self, name):  # numba.int64, numba.uint32, ...: numba-cuda-mlir's scalar types
            return getattr(mtypes, name)

    numba = Numba("numba")
    numba.cuda, numba.types = mcuda, mtypes
    return {"numba": numba, "numba.cuda": mcuda, "numba.types": mtypes, "numba.cuda.extending": mext}


def _importer(alias):
    real = builtins.__import__

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in alias:
            return alias[name] if fromlist else alias["numba"]
        return real(name, globals, locals, fromlist, level)

    return import_


def parts(path, port_file):
    """``path``'s module as three pieces of code, ``[(text, filename), ...]``, run in turn in one namespace: its
    source before the top-level ``if SIMULATOR:``, ``port_file``'s code in place of that ``if``'s GPU branch
    (``else:``), and its source after it. Line numbers stay those of each file (blank lines pad the third)."""
    with open(path) as f:
        lines = f.read().split("\n")
    if "if SIMULATOR:" not in lines or "else:" not in lines[lines.index("if SIMULATOR:"):]:
        raise ValueError(f"{path}: no top-level 'if SIMULATOR:' ... 'else:' to port")
    start = lines.index("if SIMULATOR:")
    other = next(i for i in range(start + 1, len(lines)) if lines[i] == "else:")
    end = next((i for i in range(other + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    with open(port_file) as f:
        port = f.read()
    return [("\n".join(lines[:start]), path), (port, port_file), ("\n" * end + "\n".join(lines[end:]), path)]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, ports):
        self.ports, self.alias = tuple(ports), _numba_alias()
        self.builtins = dict(vars(builtins), __import__=_importer(self.alias))

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX) or fullname.startswith(_PREFIX + "simulator"):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.submodule_search_locations is not None:  # a package: load it as usual
                    return spec
                return importlib.util.spec_from_file_location(fullname, spec.origin, loader=self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__[len(_PREFIX):]
        path = module.__spec__.origin
        if name in self.ports:
            pieces = parts(path, os.path.join(HERE, name + ".py"))
        else:
            with open(path) as f:
                pieces = [(f.read(), path)]
        module.__dict__["__builtins__"] = self.builtins
        for text, file in pieces:
            exec(compile(text, file, "exec"), module.__dict__)


def install(ports=PORTS):
    """Load kvnumba's kernel modules on numba-cuda-mlir from now on (before ``import kvnumba``), with the GPU
    branches of ``ports`` replaced by this folder's files."""
    if any(name.startswith(_PREFIX) for name in sys.modules):
        raise RuntimeError("install() must run before kvnumba's kernel modules are imported")
    finder = _Finder(ports)
    sys.meta_path.insert(0, finder)
    return finder
