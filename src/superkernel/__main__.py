"""``python -m superkernel``: the superkernel command line."""

import sys

from .cli import main

sys.exit(main())
