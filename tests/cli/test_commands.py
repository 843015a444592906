"""The ``kvnumba`` command line as a newcomer meets it: ``--version``, help with every option's default, and
every failure one line with exit code 2 (bad options) or 1 (a failed command). Pure logic: no CUDA needed.
(Settings and the target: tests/target/test_choice.py; convert: tests/convert/test_files.py.)"""
import argparse

import pytest

from kvnumba import __version__
from tests.helpers.cli_run import run_cli
from kvnumba.tools import cli

pytestmark = pytest.mark.smoke  # in the one-minute subset



def test_version(capsys):
    code, out, err = run_cli(["--version"], capsys)
    assert code == 0 and out == f"kvnumba {__version__}\n" and err == []


def _options(parser):
    """(command, action) for every option and argument of every command."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                yield name, action


def test_every_option_says_what_it_does_and_its_default():
    parser = cli.build_parser()
    missing = [(name, action.dest) for name, action in _options(parser)
               if not action.help or not ("default" in action.help or "required" in action.help)]
    assert not missing, f"options without help text and a default: {missing}"
    assert len(list(_options(parser))) == 5 + 10 + 1  # demo, convert, info


def test_demo_help_shows_the_defaults(capsys):
    code, out, _ = run_cli(["demo", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for option in ("--layers N", "--tokens N", "--item-size BYTES", "--page-size N", "--pool N"):
        assert option in text
    assert "default: 32 on a GPU, 2 on the simulator" in text and "default: 8,192 on a GPU, 16 on the simulator" in text


@pytest.mark.parametrize("argv,message", [
    ([], "the following arguments are required: COMMAND"),
    (["demo", "--layers"], "argument --layers: expected one argument"),
    (["demo", "--colour"], "unrecognized arguments: --colour"),
    (["convert", "a.npy"], "the following arguments are required: OUT, --from, --to"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
])
def test_a_bad_command_line_is_one_line(capsys, argv, message):
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == "" and len(err) == 1, err
    assert message in err[0] and err[0].endswith("--help)"), err[0]


def test_a_missing_input_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(["convert", str(tmp_path / "k.npy"), str(tmp_path / "o.npy"), "--from", "lf", "--to", "pf"],
                        capsys)
    assert code == 1 and err == [f"kvnumba convert: error: {tmp_path / 'k.npy'}: No such file or directory"]
