"""``python -m superkernel``: the superkernel command line."""

import sys

from superkernel.tools.cli import main

sys.exit(main())
