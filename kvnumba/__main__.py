"""``python -m kvnumba``: the ``kvnumba`` command line (``kvnumba.tools.cli``)."""
import sys

from .tools.cli import main

sys.exit(main())
