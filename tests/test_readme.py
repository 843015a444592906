"""The README is a front page: the two set-up commands CI runs, a two-minute read, figures as saved, links
that lead somewhere. (Its Python blocks run as written with the docs' blocks: tests/test_docs.py.)"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_CHARS = 12_000

pytestmark = pytest.mark.smoke


def test_the_set_up_commands_are_the_newcomers():
    """CI runs the two lines under the set-up comments (.ci/run): an install mypy can follow, and the tests
    without any setting (kvnumba picks the simulator itself)."""
    lines = README.read_text().splitlines()
    install = lines[lines.index("# 1) install, then run the demo") + 1]
    tests = lines[lines.index("# 2) run the tests") + 1]
    assert "--config-settings editable_mode=compat" in install and install.endswith("kvnumba demo")
    assert tests == ".venv/bin/python -m pytest -q"


def test_a_two_minute_read():
    text = README.read_text()
    assert len(text) <= MAX_CHARS, f"README.md is {len(text):,} characters: keep it under {MAX_CHARS:,} (more: docs/)"


def test_links_lead_to_files_of_the_repository():
    text = README.read_text()
    assert "../" not in text, "the README cites a path outside the repository"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (ROOT / t).exists()]
    assert not missing, f"README links to files that are not there: {missing}"


def test_the_performance_table_quotes_the_saved_run():
    """Each GB/s figure of the README's table is the saved full run's, as the docs' table draws it."""
    saved = json.loads((ROOT / "scripts" / "results" / "h200.json").read_text())
    records, meta = saved["records"], saved["meta"]
    section = README.read_text().split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    assert f"{meta['date']}, code at commit `{meta['commit']}`" in section  # dated, and names its commit
    rows = re.findall(r"^\| ([^|]+) \| ([\d.]+) \| ([\d.]+) \|$", section, flags=re.M)
    cases = {"per-layer load, layer-first": "transfer_kv_per_layer h2d mha",
             "per-layer load, page-first pool": "transfer_kv_per_layer_pf_lf h2d mha",
             "per-layer load, page-head pool": "transfer_kv_per_layer_ph_lf h2d mha",
             "MLA per-layer load": "transfer_kv_per_layer_mla h2d mla",
             "all-layer backup, layer-first -> page-first": "transfer_kv_all_layer_lf_pf d2h mha"}
    assert len(rows) == 5
    for name, ours, theirs in rows:
        case = next(c for prefix, c in cases.items() if name.startswith(prefix))
        record = next(r for r in records if r["case"] == case)
        assert (ours, theirs) == (f"{record['kvnumba_gbps']:.1f}", f"{record['reference_gbps']:.1f}"), name
