"""``python -m sim`` runs the command line (see sim.cli.commands)."""

import sys

from sim.cli.commands import main

sys.exit(main())
