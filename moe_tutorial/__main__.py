"""``python -m moe_tutorial bench|tune``: see :mod:`moe_tutorial.cli`."""
import sys

from .cli import main

sys.exit(main())
