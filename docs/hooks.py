"""MkDocs hooks of kvnumba's site (mkdocs.yml: ``hooks``): the notebooks as pages, and the performance plots.

- Every ``notebooks/*.ipynb`` becomes a page under ``notebooks/``, listed in the nav's "Notebooks" section
  and on ``notebooks/index.md`` (where it says ``<!-- notebooks -->``). mkdocs-jupyter renders them as saved,
  with their outputs: nothing is executed at build time.
- A notebook's relative links are written for the repository (GitHub shows them so): ``01_layouts.ipynb``,
  ``../docs/glossary.md``, ``../kvnumba/kernels/factory.py``. On its page they become the site's: the notebook's
  page, the guide's page, and a copy of the source file under ``source/`` (``NOTEBOOK_LINK``).
- ``<!-- figure: NAME -->`` in a page becomes the plot ``NAME`` of ``FIGURES``, drawn from the saved benchmark
  data in ``scripts/results`` when the site is built, and a caption with the run's date, commit and machine
  (from the file's ``meta``: a file without them fails the build).
"""
from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "scripts" / "results"
NOTEBOOK_SECTION = "Notebooks"


# --- notebooks ---------------------------------------------------------------------------------------

def notebooks():
    """``(src_uri, title)`` of every notebook, in file-name order; the title is its first Markdown heading."""
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        heading = next((line for c in cells if c["cell_type"] == "markdown"
                        for line in "".join(c["source"]).splitlines() if line.startswith("# ")), None)
        found.append((f"notebooks/{path.name}", heading[2:].strip() if heading else path.stem))
    return found


def on_config(config):
    _drawn.clear()  # `mkdocs serve` rebuilds: draw the plots again from the data as it is now
    for entry in config.nav or []:
        if isinstance(entry, dict) and NOTEBOOK_SECTION in entry:
            listed = {v if isinstance(v, str) else next(iter(v.values())) for v in entry[NOTEBOOK_SECTION]}
            entry[NOTEBOOK_SECTION] += [{title: uri} for uri, title in notebooks() if uri not in listed]
    return config


NOTEBOOK_LINK = re.compile(r'href="(?![a-z]+:|#|/)([^"#]+)(#[^"]*)?"')  # a relative link of a notebook's page
MARKDOWN_LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)#\s]+)(#[^)\s]*)?\)")  # [text](relative) in a notebook's prose


def _repo_path(target):
    """The checkout's file a notebook's relative link names (links are written from ``notebooks/``)."""
    return (NOTEBOOKS / target).resolve()


def notebook_sources():
    """Files outside docs/ and notebooks/*.ipynb that the notebooks link (modules, solutions, scripts): the site
    carries a copy of each under ``source/``."""
    found = set()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for cell in cells:
            if cell["cell_type"] == "markdown":
                for match in MARKDOWN_LINK.finditer("".join(cell["source"])):
                    target = _repo_path(match.group(1))
                    if target.is_file() and target.suffix != ".ipynb" and (ROOT / "docs") not in target.parents:
                        found.add(target.relative_to(ROOT).as_posix())
    return sorted(found)


def _site_link(match):
    """A notebook page's relative link, as the site has it (the page is ``notebooks/<stem>/``)."""
    target, anchor = _repo_path(match.group(1)), match.group(2) or ""
    if not target.is_relative_to(ROOT) or not target.is_file():
        return match.group(0)  # already the site's
    relative = target.relative_to(ROOT)
    if target.suffix == ".ipynb" and target.parent == NOTEBOOKS:
        return f'href="../{target.stem}/{anchor}"'
    if relative.parts[0] == "docs" and target.suffix == ".md":
        page = relative.relative_to("docs").with_suffix("")
        page = page.parent if page.name == "index" else page
        return f'href="../../{page.as_posix()}/{anchor}"'.replace("/./", "/")
    return f'href="../../source/{relative.as_posix()}{anchor}"'


def on_page_content(html, page, config, files):
    if page.file.src_uri.startswith("notebooks/") and page.file.src_uri.endswith(".ipynb"):
        return NOTEBOOK_LINK.sub(_site_link, html)
    return html


@event_priority(50)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    for uri in notebook_sources():  # the modules and solutions the notebooks link, as plain files
        files.append(File.generated(config, f"source/{uri}", content=(ROOT / uri).read_bytes()))
    for uri, _ in notebooks():
        # A file of the checkout, not a generated one: mkdocs-jupyter wraps it and reads it from src_dir.
        files.append(File(uri, src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    for name in FIGURES:
        files.append(File.generated(config, f"figures/{name}.svg", content=figure(name)[0]))
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- notebooks -->" in markdown:
        listing = "\n".join(f"- [{title}]({Path(uri).name})" for uri, title in notebooks())
        markdown = markdown.replace("<!-- notebooks -->", listing)
    markdown = re.sub(r"<!-- table: (\w+) -->", lambda m: _table_markdown(m.group(1), page), markdown)
    return re.sub(r"<!-- figure: (\w+) -->", lambda m: _figure_markdown(m.group(1), page), markdown)


def _figure_markdown(name, page):
    if name not in FIGURES:
        raise ValueError(f"{page.file.src_uri}: no figure {name!r} (docs/hooks.py FIGURES has {sorted(FIGURES)})")
    _, caption = figure(name)
    depth = page.file.src_uri.count("/")
    return f"![{FIGURES[name][0]}]({'../' * depth}figures/{name}.svg)\n\n*{caption}*"


def _table_markdown(name, page):
    if name not in TABLES:
        raise ValueError(f"{page.file.src_uri}: no table {name!r} (docs/hooks.py TABLES has {sorted(TABLES)})")
    return TABLES[name]()


# --- figures and tables from the saved benchmark data -----------------------------------------------------------

def saved(name):
    """A results file's data, and a caption naming its date, commit and machine (``meta``'s ``date``,
    ``commit`` of the code measured, ``machine`` or ``device``; without ``commit``, the commit that saved
    the file, from git). A file that cannot say them fails the build."""
    data = json.loads((RESULTS / name).read_text())
    meta = data.get("meta", {})
    commit = f"code at commit {meta['commit']}" if meta.get("commit") else _saved_in(name)
    machine = meta.get("machine") or meta.get("device")
    if not (meta.get("date") and commit and machine):
        raise ValueError(f"scripts/results/{name}: a figure names its date, commit and machine; meta lacks some")
    return data, f"{machine}, {meta['date']}, {commit}; data: scripts/results/{name}"


def _saved_in(name):
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "--", f"scripts/results/{name}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"saved in commit {out}" if out else None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvnumba"  # the same SVG for the same data
    return plt


def _svg(fig):
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight")
    _plt().close(fig)
    return out.getvalue()


def _label(record):
    return record["case"].removeprefix("transfer_kv_")


def per_layer_loads(data):
    """The full-size per-layer host->device loads of a bench run that have a reference to compare with."""
    return [r for r in data["records"] if r["direction"] == "h2d" and r["op"].startswith("transfer_kv_per_layer")
            and r["case"].endswith(("mha", "mla")) and r.get("reference_gbps")]


def _grouped_bars(rows, series, title, xlabel, row_height):
    """Horizontal bars, a group per record, a bar per ``(key, label)`` of ``series``; returns ``(fig, ax)``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, row_height * len(rows) + 1))
    width = 0.8 / len(series)
    for n, (key, name) in enumerate(series):
        shift = (n - (len(series) - 1) / 2) * width
        ax.barh([i + shift for i in range(len(rows))], [r[key] for r in rows], width, label=name)
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return fig, ax


def _loads():
    data, caption = saved("h200.json")
    series = [("kvnumba_gbps", "kvnumba"), ("reference_gbps", "SGLang's kernels")]
    fig, ax = _grouped_bars(per_layer_loads(data), series, "Per-layer loads, pinned host -> GPU",
                            "GB/s (8192 tokens, 32 layers, block_quota=2)", 0.45)
    ax.axvline(data["meta"]["ceilings_gbps"]["h2d"], color="black", linewidth=1, label="copy ceiling")
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig), caption


def _against_sglang():
    data, caption = saved("h200.json")
    rows = sorted((r for r in data["records"] if r.get("ratio_to_reference")), key=lambda r: r["ratio_to_reference"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.24 * len(rows) + 1))
    ax.barh(range(len(rows)), [r["ratio_to_reference"] for r in rows], color="tab:blue")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=7)
    ax.set_xlabel("kvnumba GB/s / SGLang's kernels' GB/s (> 1: kvnumba faster)")
    ax.set_title("Every case against SGLang's kernels")
    return _svg(fig), caption


def _host_time():
    data, caption = saved("h200.json")
    rows = [r for r in data["records"] if r.get("reference_host_us") and r.get("prepared_host_us")
            and r["op"].startswith("transfer_kv_") and "direct" not in r["op"]]
    fig, ax = _grouped_bars(rows, [("host_us", "plain call"), ("prepared_host_us", "prepared call"),
                                   ("reference_host_us", "SGLang's kernels")],
                            "Host time per call", "host time per call, us (lower is better)", 0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig), caption


def _block_quota():
    data, caption = saved("h200-block-quota.json")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, row in data["gbps"].items():
        ax.plot(data["block_quota"], row, "o-", label=name.replace("seed", "SGLang's kernels"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(data["block_quota"], [str(q) for q in data["block_quota"]])
    ax.set_xlabel("block_quota (blocks, so SMs, the load may take)")
    ax.set_ylabel("GB/s")
    ax.set_title("Page-first per-layer load by block_quota")
    ax.legend(fontsize=8)
    return _svg(fig), caption


def loads_table():
    """The per-layer loads of the saved full run as a Markdown table, with its caption."""
    data, caption = saved("h200.json")
    rows = ["| load, block_quota=2 | kvnumba GB/s | SGLang's kernels GB/s | ratio |", "|---|---|---|---|"]
    for r in per_layer_loads(data):
        rows.append(f"| {_label(r)} | {r['kvnumba_gbps']:.1f} | {r['reference_gbps']:.1f} | "
                    f"{r['kvnumba_gbps'] / r['reference_gbps']:.2f}x |")
    return "\n".join(rows) + f"\n\n*{caption}*"


OVERLAP = "h200-2026-12-01-overlap.json"


def _overlap_rows(data):
    return [r for r in data["records"] if r["case"].startswith("overlap") and r["tokens"] == 8192]


def _overlap():
    data, caption = saved(OVERLAP)
    rows = sorted(_overlap_rows(data), key=lambda r: (r["impl"] != "kvnumba", -r["prefill_gbps"]))
    fig, ax = _grouped_bars(rows, [("idle_gbps", "idle"), ("prefill_gbps", "beside GEMMs"),
                                   ("decode_gbps", "beside decode")],
                            "32 per-layer loads of 8192 tokens, host -> GPU", "GB/s", 0.34)
    ax.set_yticks(range(len(rows)), [r["route"] for r in rows], fontsize=7)
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig), caption


def overlap_table():
    """The overlap run's best kvnumba route per layout, and SGLang's kernels', as a Markdown table."""
    data, caption = saved(OVERLAP)
    rows = ["| route | idle GB/s | beside GEMMs GB/s | compute x | beside decode GB/s | compute x | host us |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(_overlap_rows(data), key=lambda r: (r["impl"] != "kvnumba", -r["prefill_gbps"])):
        rows.append(f"| {r['route']} | {r['idle_gbps']:.1f} | {r['prefill_gbps']:.1f} | {r['prefill_x']:.2f} | "
                    f"{r['decode_gbps']:.1f} | {r['decode_x']:.2f} | {r['host_us']:.0f} |")
    return ("\n".join(rows) + "\n\n*compute x: the compute's time beside the loads over its time alone (SM lanes: "
            "over its time alone on every SM). " + caption + "*")


TABLES = {"loads": loads_table, "overlap": overlap_table}

# name: (alt text, drawing function)
FIGURES = {
    "loads": ("Per-layer host-to-device loads, kvnumba against SGLang's kernels", _loads),
    "against_sglang": ("Every benchmark case, kvnumba's GB/s over SGLang's kernels'", _against_sglang),
    "host_time": ("Host time per call: plain, prepared, SGLang's kernels", _host_time),
    "block_quota": ("Page-first load GB/s by block_quota", _block_quota),
    "overlap": ("Per-layer loads idle, beside GEMMs and beside a decode stream, by route", _overlap),
}
_drawn = {}


def figure(name):
    """``(svg, caption)`` of figure ``name``, drawn once per build process."""
    if name not in _drawn:
        _drawn[name] = FIGURES[name][1]()
    return _drawn[name]
