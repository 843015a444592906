"""A drop-in for SGLang: after ``install_sgl_kernel()``, ``sgl_kernel.kvcacheio`` resolves to kvnumba in this
process, a module holding kvnumba's thirteen entry points under SGLang's names (the same functions as
``kvnumba.transfer_kv_*``), so that SGLang's own code and its kvcacheio tests run on kvnumba.
docs/guides/sglang.md says what happens in each case (a real ``sgl_kernel`` installed or not, or a module
rather than a package, or ``sgl_kernel.kvcacheio`` imported already).

How: an import hook at the front of ``sys.meta_path`` that answers for ``sgl_kernel.kvcacheio``, and for
``sgl_kernel`` only when no real package can be found; while that stand-in serves, ``importlib.metadata``
knows an ``sgl-kernel`` distribution of version ``STAND_IN_VERSION`` (the local label ``+kvnumba``, so that
no check mistakes it for SGLang's). A real ``sgl_kernel`` first imported while the hook was in place keeps
kvnumba's functions in its own namespace.

``ResidentLayerLoadingEvent`` (``kvnumba.compat_layers``) stands in for HiCache's per-layer load events where a
resident load (``kvnumba.load_resident``) replaces its loop of per-layer loads.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from contextlib import contextmanager

from ._version import __version__
from .compat_layers import ResidentLayerLoadingEvent
from .plan.spec import DIRECT_ENTRY_POINTS, KERNEL_ENTRY_POINTS

PACKAGE = "sgl_kernel"
DISTRIBUTION = "sgl-kernel"
STAND_IN_VERSION = f"{__version__}+kvnumba"
MODULE = "sgl_kernel.kvcacheio"
# SGLang's kvcacheio names: its ten kernel entry points and three copy-engine ones.
ENTRY_POINTS = tuple(KERNEL_ENTRY_POINTS) + tuple(DIRECT_ENTRY_POINTS)
# What SGLang's sgl_kernel/__init__.py re-exports from kvcacheio.
PACKAGE_EXPORTS = ("transfer_kv_all_layer", "transfer_kv_all_layer_mla", "transfer_kv_per_layer",
                   "transfer_kv_per_layer_mla")

__all__ = ["ResidentLayerLoadingEvent", "install_sgl_kernel", "sgl_kernel_installed", "uninstall_sgl_kernel"]


def _build_modules():
    import kvnumba

    kvcacheio = types.ModuleType(MODULE, "kvnumba's stand-in for SGLang's sgl_kernel.kvcacheio "
                                         "(kvnumba.compat.install_sgl_kernel).")
    for name in ENTRY_POINTS:
        setattr(kvcacheio, name, getattr(kvnumba, name))
    setattr(kvcacheio, "__all__", list(ENTRY_POINTS))
    package = types.ModuleType(PACKAGE, "kvnumba's stand-in for SGLang's sgl_kernel, which is not installed: "
                                        "it holds only kvcacheio (kvnumba.compat.install_sgl_kernel).")
    for name in PACKAGE_EXPORTS:
        setattr(package, name, getattr(kvcacheio, name))
    setattr(package, "__version__", STAND_IN_VERSION)
    return {MODULE: kvcacheio, PACKAGE: package}


class _StandInDistribution(importlib.metadata.Distribution):
    """What ``importlib.metadata`` reports for the stand-in package: its name, version and summary."""

    def read_text(self, filename):
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {STAND_IN_VERSION}\n"
                    "Summary: kvnumba's stand-in for SGLang's sgl_kernel (kvnumba.compat.install_sgl_kernel): "
                    "only kvcacheio\n")
        return None

    def locate_file(self, path):
        return None


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the prebuilt modules: the same objects every time they are imported."""

    def __init__(self):
        self.modules = _build_modules()

    def find_spec(self, fullname, path=None, target=None):
        if fullname == MODULE:
            return importlib.machinery.ModuleSpec(MODULE, self, origin="kvnumba")
        if fullname == PACKAGE and _find_real(self) is None:
            return importlib.machinery.ModuleSpec(PACKAGE, self, origin="kvnumba", is_package=True)
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        """``importlib.metadata``'s view: the stand-in ``sgl-kernel`` while no real package can be found."""
        name = context.name
        wanted = name is None or name.lower().replace("_", "-") == DISTRIBUTION
        if wanted and _find_real(self) is None:
            return iter([_StandInDistribution()])
        return iter(())

    def create_module(self, spec):
        return self.modules[spec.name]

    def exec_module(self, module):
        if module.__name__ == PACKAGE:  # as SGLang's package does, import the submodule with it
            importlib.import_module(MODULE)


def _find_real(hook):
    """The spec of an ``sgl_kernel`` other finders than ``hook`` would import, or None."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if finder is not hook and find is not None:
            spec = find(PACKAGE, None)
            if spec is not None:
                return spec
    return None


def _refuse_a_plain_module(hook):
    """``ImportError`` if the ``sgl_kernel`` that is imported, or would be, is a module rather than a
    package: ``sgl_kernel.kvcacheio`` cannot live in it."""
    package = sys.modules.get(PACKAGE)
    if package is hook.modules[PACKAGE]:
        return
    if package is not None:
        where = getattr(package, "__file__", None) or repr(package)
        is_package = hasattr(package, "__path__")
    else:
        spec = _find_real(hook)
        if spec is None:
            return
        where, is_package = spec.origin or PACKAGE, spec.submodule_search_locations is not None
    if not is_package:
        raise ImportError(f"install_sgl_kernel: the {PACKAGE} found at {where} is a module, not a package, so "
                          f"{MODULE} cannot be installed in it; remove or rename it (nothing was installed)",
                          name=PACKAGE)


_hook: _Hook | None = None  # built on first install, then kept: the same module objects every time
_installed = False
_undo: list[tuple] = []  # (sys.modules or a module, key, previous value or _ABSENT), in the order done
_ABSENT = object()


def install_sgl_kernel(*, replace=False):
    """Make ``sgl_kernel.kvcacheio`` resolve to kvnumba in this process; returns that module.

    Parameters
    ----------
    replace : bool
        Keyword only. If a ``sgl_kernel.kvcacheio`` that is not kvnumba's is already imported, swap it
        out (else ``RuntimeError``). Names imported from it earlier keep the old functions.
    """
    global _hook, _installed
    hook = _hook = _hook or _Hook()
    _refuse_a_plain_module(hook)
    ours = hook.modules[MODULE]
    existing = sys.modules.get(MODULE)
    if existing is not None and existing is not ours:
        if not replace:
            raise RuntimeError(
                f"{MODULE} is already imported ({getattr(existing, '__file__', None) or existing!r}), and code "
                f"may hold its functions: call kvnumba.compat.install_sgl_kernel() before anything imports "
                f"{PACKAGE}, or pass replace=True to swap the module anyway")
        _displace(existing, ours)
    was_installed = _installed
    if hook not in sys.meta_path:
        sys.meta_path.insert(0, hook)
    _installed = True
    if PACKAGE in sys.modules:  # the package is loaded already: attach the submodule to it now
        try:
            importlib.import_module(MODULE)
        except BaseException:
            if not was_installed:  # leave nothing behind: no hook, nothing displaced
                uninstall_sgl_kernel()
            raise
    return ours


def _displace(existing, ours):
    _set(sys.modules, MODULE, None)
    package = sys.modules.get(PACKAGE)
    if package is None:
        return
    for name in ENTRY_POINTS:  # the package's re-exports of the old module's functions
        old = getattr(existing, name, None)
        if old is not None and getattr(package, name, None) is old:
            _set(package, name, getattr(ours, name))
    _set(package, "kvcacheio", ours)


def _set(target, key, value):
    """Set ``key`` of ``target`` (``sys.modules`` or a module) to ``value`` (None deletes it), remembering
    what was there for uninstall_sgl_kernel."""
    if target is sys.modules:
        _undo.append((target, key, sys.modules.pop(key, _ABSENT)))
        if value is not None:
            sys.modules[key] = value
    else:
        _undo.append((target, key, getattr(target, key, _ABSENT)))
        setattr(target, key, value)


def uninstall_sgl_kernel():
    """Undo ``install_sgl_kernel``: remove the hook and kvnumba's modules, and put back what it displaced.
    Does nothing when it is not installed."""
    global _installed
    if not _installed:
        return
    _installed = False
    hook = _hook
    assert hook is not None  # built by the install that set _installed
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)
    for name, module in hook.modules.items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
    package = sys.modules.get(PACKAGE)  # a real package that got kvnumba's submodule while installed
    if package is not None and getattr(package, "kvcacheio", None) is hook.modules[MODULE]:
        delattr(package, "kvcacheio")
    while _undo:
        target, key, previous = _undo.pop()
        if target is sys.modules:
            if previous is not _ABSENT:
                sys.modules[key] = previous
        elif previous is _ABSENT:
            if hasattr(target, key):
                delattr(target, key)
        else:
            setattr(target, key, previous)


@contextmanager
def sgl_kernel_installed(*, replace=False):
    """``install_sgl_kernel`` for the ``with`` block, then ``uninstall_sgl_kernel``; yields the module."""
    was_installed = _installed
    module = install_sgl_kernel(replace=replace)
    try:
        yield module
    finally:
        if not was_installed:
            uninstall_sgl_kernel()
