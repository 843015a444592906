"""A pytest plugin that hides NIXL, as on a machine where it is not installed:
``python -m pytest -p tests.helpers.no_nixl ...`` (tests/test_without_nixl.py runs the suite so).

Importing ``nixl``, ``nixl_cu12`` or ``nixl_cu13`` (or anything under them) raises ``ModuleNotFoundError``.
"""
import sys

HIDDEN = ("nixl", "nixl_cu12", "nixl_cu13")


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests.helpers.no_nixl)", name=name)
        return None


sys.meta_path.insert(0, _Hide())
