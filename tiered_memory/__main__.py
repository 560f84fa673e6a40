"""``python -m tiered_memory`` runs the ``tiered-memory`` command line."""

import sys

from .cli import main

sys.exit(main())
