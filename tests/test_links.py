"""The ways around, as a reader meets them: the lists of notebooks, every relative link, and each notebook's links
to the glossary and to the notebooks before and after it.

Links are checked as the repository holds them (GitHub shows them so): a notebook's from ``notebooks/``, a doc
page's from its folder, the README's from the root. The site rewrites a notebook's links for its pages
(docs/hooks.py) and tests/test_docs.py checks every link of the built site.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = ROOT / "docs"
LISTS = ["README.md", "docs/index.md", "docs/architecture.md"]  # each names every notebook
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s#]+)(?:#[^)\s]*)?\)")  # [text](relative target)


def _prose(path):
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def _target(page, link):
    """The file a relative link of ``page`` names. The site serves each notebook as ``docs/notebooks/<name>``."""
    path = (page.parent / link).resolve()
    if path.suffix == ".ipynb" and path.parent == DOCS / "notebooks":
        return ROOT / "notebooks" / path.name
    return path


def _documents():
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), *NOTEBOOKS]


def test_every_list_of_notebooks_names_each_one():
    names = {p.name for p in NOTEBOOKS}
    for document in LISTS:
        listed = set(re.findall(r"\b\d\d_\w+\.ipynb", (ROOT / document).read_text()))
        assert listed == names, f"{document}: missing {sorted(names - listed)}, not in notebooks/ {sorted(listed - names)}"


@pytest.mark.parametrize("page", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    texts = _prose(page) if page.suffix == ".ipynb" else [page.read_text()]
    links = [m.group(1) for text in texts for m in LINK.finditer(text)]
    broken = [link for link in links if not _target(page, link).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"


@pytest.mark.parametrize("index", range(len(NOTEBOOKS)), ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_links_the_glossary_and_its_neighbours(index):
    """Its opening cell: the glossary, the notebook before and the one after it."""
    opening = _prose(NOTEBOOKS[index])[0]
    linked = {_target(NOTEBOOKS[index], m.group(1)) for m in LINK.finditer(opening)}
    assert DOCS / "glossary.md" in linked
    neighbours = NOTEBOOKS[max(index - 1, 0): index] + NOTEBOOKS[index + 1: index + 2]
    assert set(neighbours) <= linked, f"{NOTEBOOKS[index].name}: link {[p.name for p in neighbours]} in its first cell"


def test_the_glossary_defines_the_words_of_the_tables():
    """Words the notebooks' outputs print ("seed", "bq", "MISS") are defined where every notebook links."""
    glossary = (DOCS / "glossary.md").read_text()
    for word in ("**SGLang's kernels (the seed)**", "**block_quota (bq)**", "PASS / MISS", "**copy engine**",
                 "**staged kernel**", "**route**", "**page-head (`ph`)**", "**MLA**", "**item**", "**warp, lane**"):
        assert word in glossary, word
