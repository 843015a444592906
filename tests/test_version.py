"""The version is written once, in kvnumba/_version.py; pyproject.toml and ``kvnumba.__version__`` read it."""
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

import kvnumba
from kvnumba import _version

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvnumba._version.__version__"}


def test_package_version_is_the_one_in_version_py():
    assert kvnumba.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvnumba.__version__)


def test_no_other_file_writes_a_version():
    written = [str(path.relative_to(ROOT)) for path in ROOT.joinpath("kvnumba").rglob("*.py")
               if re.search(r"^__version__\s*=", path.read_text(), flags=re.M)]
    assert written == ["kvnumba/_version.py"]


def _installed_from(dist):
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    return Path(url.removeprefix("file://")).resolve() if url.startswith("file://") else None


def test_installed_metadata_matches_when_installed_from_this_checkout():
    """After ``pip install -e .`` (CI's install), the metadata pip wrote carries the same version. (The
    ``kvnumba.egg-info`` setuptools leaves in the checkout is also found, first, and has no install
    record: look at every distribution of that name.)"""
    dists = list(importlib.metadata.distributions(name="kvnumba"))
    if not dists:
        pytest.skip("kvnumba is not installed (run from a checkout on PYTHONPATH)")
    ours = [d for d in dists if _installed_from(d) == ROOT]
    if not ours:
        pytest.skip(f"the installed kvnumba comes from {[str(_installed_from(d)) for d in dists]}, not this checkout")
    assert [d.version for d in ours] == [kvnumba.__version__] * len(ours)
