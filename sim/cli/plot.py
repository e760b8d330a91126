"""``sim plot``: the Gantt chart of a run directory, drawn by the ``clustersim.plot`` plugins.

In: the parsed arguments (the run directory holding ``trace.parquet`` or ``trace.csv``, ``--ranks``, ``--start``,
``--end``, ``-o`` the image file). Out: the image each plugin writes; a one-line ConfigError naming the option when
nothing would be drawn, SimError when no chart plugin is installed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cli.plugins import PLOT_PLUGINS, plugins
from sim.errors import ConfigError, SimError

if TYPE_CHECKING:
    from rich.console import Console


def cmd_plot(args: argparse.Namespace, console: Console) -> int:
    from sim.output import trace

    run_dir = Path(args.run_dir)
    found = [p for p in (run_dir / "trace.parquet", run_dir / "trace.csv") if p.is_file()]
    if not found:
        raise ConfigError(f"run_dir: no trace.parquet or trace.csv in {str(run_dir)!r}")
    frame = trace.read_trace(found[0])
    ranks = _plot_selection(frame, args.ranks, args.start, args.end)
    plotters = plugins(PLOT_PLUGINS)
    if not plotters:
        raise SimError("plot: no chart plugin installed (pip install -e . installs the analysis package)")
    for plot in plotters:
        plot(frame, Path(args.output), ranks=ranks, start=args.start, end=args.end)
    console.print(f"wrote {args.output}")
    return 0


def _plot_selection(frame: Any, ranks_arg: str | None, start: float | None, end: float | None) -> list[int] | None:
    """``sim plot``'s --ranks as a list, checked against the trace with its window: ConfigError naming the option
    where nothing would be drawn (a rank the run did not simulate, a window outside the step or inverted)."""
    ranks = None
    if ranks_arg:
        try:
            ranks = [int(r) for r in ranks_arg.split(",")]
        except ValueError:
            raise ConfigError(f"--ranks: {ranks_arg!r} is not a comma-separated list of ranks (0,8,16)") from None
        present = set(frame["rank"].unique().tolist())
        absent = [r for r in ranks if r not in present]
        if absent:
            raise ConfigError(f"--ranks: rank {absent[0]} is not in the trace (its ranks: "
                              f"{', '.join(map(str, sorted(present)[:16]))}{', ...' if len(present) > 16 else ''})")
    if start is not None and end is not None and end <= start:
        raise ConfigError(f"--end: {end} s is not after --start {start} s")
    if start is not None and len(frame) and start >= frame["end_s"].max():
        raise ConfigError(f"--start: the trace ends at {frame['end_s'].max():.6g} s, before --start {start} s")
    return ranks
