"""The documentation as a newcomer meets it.

- Every Python block of the README and of docs/ runs as written, each in a fresh interpreter, without
  ``NUMBA_ENABLE_CUDASIM`` set (kvnumba picks the simulator itself where there is no CUDA driver), so an
  import-order mistake shows.
- ``mkdocs build --strict`` builds the site; every internal link and anchor of the built pages resolves.
- Headless Chromium (Debian's ``chromium``) renders the home page, an API page and a notebook page from a
  local server, every file they load answers, and their screenshots are saved in ``build/docs-screenshots/``.
- The documents name no issue numbers and count no rounds of work; "How it is built" names every module.

Without MkDocs or Chromium a test says so in one line and is skipped, except in CI (``CI`` set), where
``.ci/run`` installs both and their absence fails.
"""
import functools
import html.parser
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SCREENSHOTS = ROOT / "build" / "docs-screenshots"
IN_CI = bool(os.environ.get("CI"))
# What the browser opens: (name, path on the site, text the rendered page must hold)
RENDERED = [("home", "/", "Which API do I want?"),
            ("api", "/reference/entry-points/", 'id="kvnumba.api.entry_points.transfer_kv_per_layer_pf_lf"'),
            ("notebook", "/notebooks/01_layouts/", "executed on Numba"),
            ("kernel notebook", "/notebooks/00_the_copy_kernel/", "ld.global.nc"),
            ("glossary", "/glossary/", "block_quota")]


def _unavailable(reason):
    """A tool the test needs is missing: a failure in CI, which installs it; else a skip saying so."""
    if IN_CI:
        pytest.fail(f"{reason} (CI installs it: .ci/run)", pytrace=False)
    pytest.skip(reason)


# --- Python blocks, as written ----------------------------------------------------------------------

def _blocks():
    for path in [ROOT / "README.md", *PAGES]:
        for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)):
            name = f"{path.relative_to(ROOT)}:{i}"
            yield pytest.param(block, id=name, marks=[pytest.mark.nixl] if "kvnumba.remote" in block else [])


@pytest.mark.needs_target
@pytest.mark.parametrize("block", list(_blocks()))
def test_python_block_runs_as_written(block, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM" and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout
    run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, f"the block fails as written:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


# --- the site, built ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        _unavailable("MkDocs is not installed (the docs extra: pip install -e \".[docs]\")")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr[-6000:]}"
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ["index.html", "guides/layouts/index.html", "reference/entry-points/index.html",
                 "notebooks/index.html", "performance/index.html"]:
        assert (site / page).is_file(), page
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):  # every notebook is a page, with no line in mkdocs.yml
        assert (site / "notebooks" / notebook.stem / "index.html").is_file(), notebook.name
    figures = sorted(p.name for p in (site / "figures").glob("*.svg"))
    assert figures, "no performance plots"
    performance = (site / "performance" / "index.html").read_text()
    for name in figures:
        assert name in performance
    assert performance.count("code at commit") >= len(figures), "every plot names its date, commit and machine"


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])


@functools.lru_cache(maxsize=None)
def _parsed(path):
    parser = _Links()
    parser.feed(path.read_text(errors="replace"))
    return parser


def _target(site, page, link):
    """The file an internal link of ``page`` names, and its anchor; None for an outside link."""
    url = urllib.parse.urlsplit(link)
    if url.scheme or url.netloc or link.startswith(("mailto:", "data:", "javascript:")):
        return None
    if not url.path:
        return page, url.fragment
    base = site if url.path.startswith("/") else page.parent
    path = (base / urllib.parse.unquote(url.path).lstrip("/")).resolve()
    return (path / "index.html" if path.is_dir() else path), url.fragment


def test_every_internal_link_and_anchor_resolves(site):
    broken = []
    for page in site.rglob("*.html"):
        if page.name == "404.html":
            continue  # its links are written for any folder of the site
        for link in _parsed(page).links:
            found = _target(site, page, link)
            if found is None:
                continue
            path, anchor = found
            if not path.is_file():
                broken.append(f"{page.relative_to(site)}: {link}")
            elif anchor and path.suffix == ".html" and anchor not in _parsed(path).ids:
                broken.append(f"{page.relative_to(site)}: {link} (no #{anchor})")
    assert not broken, "broken internal links:\n" + "\n".join(sorted(set(broken)))


# --- the site, in a browser -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(site):
    """The built site on a local port; every request that failed is recorded in ``server.failed``."""
    failed = []

    class Handler(SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-"):
            if str(code).isdigit() and int(code) >= 400:
                failed.append(f"{code} {self.path}")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.failed = failed
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def chromium():
    found = next(filter(None, map(shutil.which, ["chromium", "chromium-browser"])), None)
    if found is None:
        _unavailable("headless Chromium not found (Debian: apt-get install chromium): the site's browser test")
    return found


def _browse(chromium, tmp_path, *args):
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"  # a fresh profile per run
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--window-size=1280,1000", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{' '.join(command)}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.parametrize("name, path, expected", RENDERED, ids=[r[0] for r in RENDERED])
def test_chromium_renders_the_page(chromium, server, tmp_path, name, path, expected):
    dom = _browse(chromium, tmp_path, "--dump-dom", server.url + path)
    assert expected in dom, f"{path}: rendered without {expected!r}"
    assert "<nav" in dom and 'class="md-content"' in dom, f"{path}: not a page of the site's theme"
    if name.endswith("notebook"):
        assert "data:image/png;base64," in dom, "the notebook page shows no saved picture"
    # Every file of the site the rendered page links to or loads answers.
    parser = _Links()
    parser.feed(dom)
    page = urllib.parse.urljoin(server.url, path)
    for link in parser.links:
        url = urllib.parse.urljoin(page, link)
        if url.startswith(server.url):
            with urllib.request.urlopen(url.split("#")[0], timeout=30) as answer:
                assert answer.status == 200, url
    assert not server.failed, f"{path}: requests that failed: {server.failed}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    _browse(chromium, tmp_path, f"--screenshot={shot}", server.url + path)
    assert shot.is_file() and shot.stat().st_size > 20_000, f"{shot}: no screenshot"


# --- what the documents say ---------------------------------------------------------------------------------

WORK_WORDS = re.compile(r"\bissues? ?#?\d+|\bsessions?\b|\brounds? (one|two|three|four|five|six|seven)\b"
                        r"|\b(first|second|third) (round|session)|\b(fourth|fifth|sixth|seventh|eighth|ninth)\b", re.I)


def _notebook_prose(path):
    import json

    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_the_documents_speak_of_the_project_alone():
    """Results belong to a date, a commit and a machine: no issue numbers, no counted rounds of work."""
    texts = {p.relative_to(ROOT): p.read_text() for p in
             [ROOT / "README.md", ROOT / "scripts" / "RESULTS.md", ROOT / "mkdocs.yml", *PAGES, DOCS / "hooks.py",
              *(ROOT / "kvnumba").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]}
    texts.update({p.relative_to(ROOT): _notebook_prose(p) for p in (ROOT / "notebooks").glob("*.ipynb")})
    names = [p.relative_to(ROOT / "scripts" / "results") for p in (ROOT / "scripts" / "results").iterdir()]
    found = [f"{path}: {m.group(0)!r}" for path, text in texts.items() for m in WORK_WORDS.finditer(text)]
    found += [f"scripts/results/{n}" for n in names if WORK_WORDS.search(str(n).replace("-", " "))]
    assert not found, "\n".join(found)


def test_how_it_is_built_names_every_module():
    """docs/architecture.md's tree lists every module of the package."""
    text = (DOCS / "architecture.md").read_text()
    tree = text.split("\n## The modules\n", 1)[1].split("```", 2)[1]
    package = ROOT / "kvnumba"
    modules = sorted(p.relative_to(package) for p in package.rglob("*.py") if p.name != "__init__.py"
                     or p.parent == package)
    missing = [str(m) for m in modules if not re.search(rf"(^|\s){re.escape(m.name)}\s", tree, flags=re.M)]
    assert not missing, f"not in docs/architecture.md's file tree: {missing}"


@pytest.mark.parametrize("path", ["site/index.html", "site/notebooks/01_layouts/index.html"])
def test_the_built_site_is_not_tracked(path):
    """``mkdocs build`` writes the site into ``site/`` (mkdocs.yml sets no other ``site_dir``): git ignores it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert "site_dir" not in (ROOT / "mkdocs.yml").read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, timeout=60)
    assert ignored.returncode == 0, f"{path} is not git-ignored: add /site/ to .gitignore"
