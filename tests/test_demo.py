"""``kvnumba demo`` (the README's main job): runs, verifies every byte, and reports what it moved."""
import pytest

from kvnumba.tools import cli, demo

pytestmark = pytest.mark.needs_target


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
