"""``python -m moe_tutorial bench|tune``: see :mod:`moe_tutorial.perf.cli`."""
import sys

from .perf.cli import main

sys.exit(main())
