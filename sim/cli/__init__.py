"""The command line: ``sim run/check/plot/sweep/search/calibrate/validate`` and its terminal tables."""

from sim.cli.commands import main

__all__ = ["main"]
