"""Running ``kvnumba`` commands in-process for the command-line tests."""
from kvnumba.tools import cli


def run_cli(argv, capsys):
    """``(exit code, stdout, stderr lines)`` of ``kvnumba <argv>``."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err.splitlines()
