"""Progress reporting (kvnumba.tools.progress): tqdm's bar on a terminal, plain lines elsewhere or without
tqdm, nothing with --quiet; through ``kvnumba convert`` too."""
import io
import re
import sys

import numpy as np
import pytest
import tqdm  # noqa: F401 - the test extra installs it (the `progress` extra): its absence here is a failure

from kvnumba.tools import cli, progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture
def no_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError


def _run(reporter, steps, note=None):
    with reporter as bar:
        for n in steps:
            bar.advance(n, note)


def test_terminal_with_tqdm_draws_a_bar():
    term = Terminal()
    bar = progress.progress("k.npy", 3000, stream=term)
    assert isinstance(bar, progress.TqdmBar)
    _run(bar, [1000, 1000, 1000])
    text = term.getvalue()
    assert "\r" in text and "k.npy" in text  # redrawn in place
    assert re.search(r"100%.*3\.00k/3\.00k \[.*B/s\]", text.rsplit("\r", 1)[-1]), text  # left on screen, complete


def test_tqdm_decides_where_it_draws(monkeypatch):
    """kvnumba hands tqdm disable=None (tqdm draws on a terminal only) and prints its summary line where tqdm
    declines: the terminal test is tqdm's, not kvnumba's."""
    made = []
    real = tqdm.tqdm

    def recording(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tqdm, "tqdm", recording)
    assert isinstance(progress.progress("k.npy", 10, stream=Terminal()), progress.TqdmBar)
    assert isinstance(progress.progress("k.npy", 10, stream=io.StringIO()), progress.PlainLines)
    assert [kwargs["disable"] for kwargs in made] == [None, None]


def test_terminal_with_tqdm_clears_the_bar_on_failure():
    term = Terminal()
    with pytest.raises(OSError):
        with progress.progress("k.npy", 3000, stream=term) as bar:
            bar.advance(1000)
            raise OSError("disk full")
    text = term.getvalue()
    assert "k.npy" in text  # it was drawn
    assert "\n" not in text and text.endswith("\r") and text.split("\r")[-2].strip() == "", text  # then blanked


def test_not_a_terminal_gets_one_summary_line():
    log = io.StringIO()
    bar = progress.progress("k.npy", 3000, stream=log)
    assert isinstance(bar, progress.PlainLines)
    _run(bar, [1000, 1000, 1000])
    assert re.fullmatch(r"k\.npy: 3\.0 KB in \d+\.\d s\n", log.getvalue()), log.getvalue()


def test_not_a_terminal_writes_nothing_on_failure():
    log = io.StringIO()
    with pytest.raises(OSError):
        with progress.progress("k.npy", 3000, stream=log) as bar:
            bar.advance(1000)
            raise OSError("disk full")
    assert log.getvalue() == ""  # the error message that follows stands alone


def test_terminal_without_tqdm_prints_plain_lines(no_tqdm, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)  # a line at every step
    term = Terminal()
    bar = progress.progress("k.npy", 3000, stream=term)
    assert isinstance(bar, progress.PlainLines)
    _run(bar, [1000, 1000, 1000])
    text = term.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[:2] == ["k.npy: 33% 1.0 KB / 3.0 KB", "k.npy: 66% 2.0 KB / 3.0 KB"]
    assert re.fullmatch(r"k\.npy: 3\.0 KB in \d+\.\d s", lines[2]) and len(lines) == 3


def test_terminal_without_tqdm_throttles_its_lines(no_tqdm):
    term = Terminal()
    _run(progress.progress("k.npy", 10**6, stream=term), [1] * 1000)
    assert len(term.getvalue().splitlines()) == 1  # a fast job: the summary only


def test_quiet_draws_nothing():
    bar = progress.progress("k.npy", 3000, stream=None)
    assert isinstance(bar, progress.Silent)
    _run(bar, [1000, 1000, 1000])  # nothing to look at: it must simply accept the calls


@pytest.mark.parametrize("where", ["log", "terminal-without-tqdm"])
def test_line_per_step_where_no_bar_is_drawn(where, monkeypatch, capsys):
    if where != "log":
        monkeypatch.setitem(sys.modules, "tqdm", None)
    stream = io.StringIO() if where == "log" else Terminal()
    with progress.progress("bench", 3, stream=stream, unit="case", line_per_step=True) as bar:
        for case in ("a h2d", "b d2h", "c d2d"):
            bar.write(f"row {case}")
            bar.advance(1, case)
    lines = stream.getvalue().splitlines()
    assert [re.sub(r" \(\d+\.\d s\)$", "", line) for line in lines[:3]] == [
        "bench [1/3] a h2d", "bench [2/3] b d2h", "bench [3/3] c d2d"]
    assert re.fullmatch(r"bench: 3 cases in \d+\.\d s", lines[3]) and len(lines) == 4
    assert capsys.readouterr().out.splitlines() == ["row a h2d", "row b d2h", "row c d2d"]


def test_line_per_step_on_a_terminal_with_tqdm_is_a_bar(capsys):
    term = Terminal()
    with progress.progress("bench", 2, stream=term, unit="case", line_per_step=True) as bar:
        bar.write("row 1")
        bar.advance(1, "a h2d")
        bar.advance(1, "b d2h")
    assert re.search(r"bench: 100%.*2/2.*b d2h", term.getvalue().rsplit("\r", 1)[-1]), term.getvalue()
    assert capsys.readouterr().out == "row 1\n"  # rows go to stdout, around the bar


@pytest.mark.parametrize("n,want", [(0, "0 B"), (999, "999 B"), (1536, "1.5 KB"), (2 * 10**9, "2.0 GB"),
                                    (5 * 10**15, "5000.0 TB")])
def test_format_bytes(n, want):
    assert progress.format_bytes(n) == want


# --- Through kvnumba convert ------------------------------------------------------------------------------

def _convert(tmp_path, *extra):
    np.save(tmp_path / "k.npy", np.arange(3 * 16 * 2 * 8, dtype=np.uint16).reshape(3, 16, 2, 8))
    return cli.main(["convert", str(tmp_path / "k.npy"), str(tmp_path / "o.npy"), "--from", "lf", "--to", "pf",
                     "--chunk-bytes", "256", *extra])


def test_convert_on_a_terminal_draws_tqdm(tmp_path, monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert _convert(tmp_path) == 0
    assert re.search(r"k\.npy: 100%.*1\.54k/1\.54k \[.*B/s\]", term.getvalue().rsplit("\r", 1)[-1]), term.getvalue()


def test_convert_on_a_terminal_without_tqdm(tmp_path, monkeypatch, no_tqdm):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert _convert(tmp_path) == 0
    assert re.fullmatch(r"k\.npy: 1\.5 KB in \d+\.\d s\n", term.getvalue()), term.getvalue()


@pytest.mark.parametrize("flag", ["--quiet", "-q"])
def test_convert_quiet_on_a_terminal(tmp_path, monkeypatch, flag):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert _convert(tmp_path, flag) == 0
    assert term.getvalue() == ""
