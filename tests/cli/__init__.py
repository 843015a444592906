"""The ``kvnumba`` command line: its commands, the demo, info and progress reporting."""
