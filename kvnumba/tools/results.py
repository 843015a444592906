"""Saved benchmark results (``scripts/results/*.json`` of a checkout), found wherever the code runs: the
notebooks read them through ``find``, whatever their working folder.

Looked for, in order: ``$KVNUMBA_RESULTS`` (a folder); ``scripts/results`` of the checkout kvnumba was
imported from (the README's install); ``scripts/results`` in the working folder or any folder above it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import config

__all__ = ["find", "folders", "load"]


def folders() -> list[Path]:
    """Where ``find`` looks, in order (the ones that exist)."""
    here = Path.cwd().resolve()
    candidates = []
    given = config.results_dir()
    if given:
        candidates.append(Path(given))
    candidates.append(Path(__file__).resolve().parents[2] / "scripts" / "results")
    candidates += [folder / "scripts" / "results" for folder in (here, *here.parents)]
    seen, found = set(), []
    for folder in candidates:
        if folder.is_dir() and folder.resolve() not in seen:
            seen.add(folder.resolve())
            found.append(folder)
    return found


def find(name: str) -> Path | None:
    """The saved result file ``name`` (e.g. ``"h200.json"``), or None when none of ``folders()`` has it."""
    for folder in folders():
        if (folder / name).is_file():
            return folder / name
    return None


def load(name: str) -> Any:
    """``find(name)`` read as JSON; ``FileNotFoundError`` naming where it looked."""
    path = find(name)
    if path is None:
        where = ", ".join(str(f) for f in folders()) or "no scripts/results folder"
        raise FileNotFoundError(f"{name} not found (looked in: {where}); set KVNUMBA_RESULTS to the folder of "
                                "scripts/results")
    return json.loads(path.read_text())
