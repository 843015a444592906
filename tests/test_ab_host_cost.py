"""scripts/ab_host_cost.py runs end to end: two checkouts (here the same one twice) in worker processes taking
turns, one row per checkout and case (tiny sizes; on the simulator its figures mean nothing)."""
import importlib.util
import os
import shutil

import pytest

pytestmark = pytest.mark.needs_target

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _script():
    spec = importlib.util.spec_from_file_location("ab_host_cost", os.path.join(ROOT, "scripts", "ab_host_cost.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_checkouts_take_turns_and_every_case_is_timed(capsys):
    script = _script()
    script.main(["--before", ROOT, "--after", ROOT, "--rounds", "3", "--burst", "2", "--quick"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[1:]]
    assert sorted((case, tree) for case, tree, *_ in rows) == sorted(
        (case, tree) for case in script.CASES for tree in ("before", "after"))
    for _, _, calls, *figures in rows:
        assert int(calls) == 3 * 2  # every turn's calls came back
        low, p10, p25, median, cpu = map(float, figures)
        assert 0 < low <= p10 <= p25 <= median and cpu > 0


def test_a_worker_that_cannot_start_says_why(tmp_path):
    script = _script()
    with pytest.raises(SystemExit, match="did not start: .*No module named 'bench'"):
        script.start(str(tmp_path))  # not a checkout at all


def test_an_installed_kvnumba_does_not_stand_in_for_the_checkout(tmp_path):
    """A folder with the scripts but no kvnumba of its own: the installed kvnumba would answer, and the
    figures would be another checkout's."""
    script = _script()
    (tmp_path / "scripts").mkdir()
    for name in ("bench.py", "sglang_shapes.py"):
        shutil.copy(os.path.join(ROOT, "scripts", name), tmp_path / "scripts" / name)
    with pytest.raises(SystemExit, match="did not start: not a checkout of kvnumba: kvnumba from "):
        script.start(str(tmp_path))
