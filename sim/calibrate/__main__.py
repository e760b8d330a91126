"""``python -m sim.calibrate`` (also under ``torchrun``): the same as ``sim calibrate``."""

import sys

from sim.cli.commands import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", *sys.argv[1:]]))
