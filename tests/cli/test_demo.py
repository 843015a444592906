"""``kvnumba demo`` (the README's main job): runs, verifies every byte, and reports what it moved."""
import re

import pytest

from kvnumba.tools import cli, demo

pytestmark = [pytest.mark.needs_target, pytest.mark.smoke]  # smoke: in the one-minute subset


def test_demo_command_reports_bytes_time_and_bandwidth(capsys):
    assert cli.main(["demo", "--layers", "2", "--tokens", "8", "--page-size", "4", "--item-size", "32",
                     "--pool", "16"]) == 0
    out = capsys.readouterr().out
    # 2 directions, each 8 tokens x 2 layers x 32 B x K and V = 1,024 bytes
    assert out.count("1,024 B in") == 2 and out.count("GB/s") == 2
    assert "verified: every byte matches kvnumba.reference" in out


def test_demo_run_returns_measurements():
    shape = demo.DemoShape(layers=3, item_size=48, page_size=2, tokens=4, pool=8, block_quota=1,
                           num_warps_per_block=1)
    results = demo.run(shape, out=lambda line: None)
    assert results["backup"]["bytes"] == results["load"]["bytes"] == 2 * 4 * 3 * 48
    assert results["backup"]["seconds"] > 0 and results["load"]["gbps"] > 0


# The defaults this run's demo starts from (the simulator's are tiny, a GPU's full size).
BASE = demo.SIMULATOR_SHAPE if demo.SIMULATOR else demo.DemoShape()

# args, message (regex on the last line of stderr): every option's bad numbers, then options that do not fit
# together
BAD_OPTIONS = [
    (["--item-size", "12"], r"argument --item-size: expected a positive multiple of 8 \(the kernels move 8-byte "
                            r"words\), got 12"),
    (["--item-size", "0"], r"argument --item-size: expected a positive integer, got 0"),
    (["--tokens", "-4"], r"argument --tokens: expected a positive integer, got -4"),
    (["--tokens", "0"], r"argument --tokens: expected a positive integer, got 0"),
    (["--tokens", "1e3"], r"argument --tokens: expected a positive integer, got '1e3'"),
    (["--layers", "0"], r"argument --layers: expected a positive integer, got 0"),
    (["--layers", "two"], r"argument --layers: expected a positive integer, got 'two'"),
    (["--page-size", "0"], r"argument --page-size: expected a positive integer, got 0"),
    (["--page-size", "-1"], r"argument --page-size: expected a positive integer, got -1"),
    (["--pool", "0"], r"argument --pool: expected a positive integer, got 0"),
    (["--pool", "-32"], r"argument --pool: expected a positive integer, got -32"),
    (["--page-size", "3"], rf"--tokens {BASE.tokens} \(the default\) must be a multiple of --page-size 3: whole pages "
                           r"are moved"),
    (["--tokens", "6", "--page-size", "4"], r"--tokens 6 must be a multiple of --page-size 4: whole pages are moved"),
    (["--tokens", "8", "--page-size", "4", "--pool", "4"],
     r"--pool 4 is smaller than --tokens 8: the pool must hold every token moved"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[" ".join(args) for args, _ in BAD_OPTIONS])
def test_bad_options_are_usage_errors(capsys, monkeypatch, args, message):
    ran = []
    monkeypatch.setattr(demo, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", *args])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not ran
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err  # one line: the problem, and where the options are listed
    assert re.fullmatch(rf"kvnumba demo: error: {message} \(see: kvnumba demo --help\)", err.splitlines()[0]), err


def test_options_are_used_as_given(monkeypatch):
    shapes = []
    monkeypatch.setattr(demo, "run", shapes.append)
    assert cli.main(["demo", "--tokens", "8", "--page-size", "8", "--item-size", "8", "--layers", "1"]) == 0
    [shape] = shapes
    assert (shape.tokens, shape.page_size, shape.item_size, shape.layers) == (8, 8, 8, 1)
    assert shape.pool == max(BASE.pool, 2 * 8)


def test_a_failing_run_is_one_line(capsys, monkeypatch):
    def wrong_bytes(shape):
        import numpy as np

        np.testing.assert_array_equal(np.zeros(2), np.ones(2), err_msg="K layer 0 differs")

    monkeypatch.setattr(demo, "run", wrong_bytes)
    assert cli.main(["demo"]) == 1
    # one error line (after, where kvnumba chose the simulator itself, its one-line note saying so)
    [line] = [text for text in capsys.readouterr().err.splitlines() if not text.startswith("kvnumba: ")]
    assert line.startswith("kvnumba demo: error: verification failed: Arrays are not equal K layer 0 differs")
