"""``python -m sim`` runs the command line (see sim.cli)."""

import sys

from sim.cli import main

sys.exit(main())
