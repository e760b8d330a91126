"""``sim run``: simulate one scenario and write its run directory.

In: the parsed arguments (the scenario, ``--set``, ``-o``, ``--format``, ``--chrome``, ``--link-timeline``,
``--no-plot``, ``--fail-on-oom``, the run budget). Out: under ``-o``, ``summary.json``, ``trace.parquet``/``.csv``,
``scenario.resolved.yaml``, ``trace.json`` with ``--chrome``, ``links.csv`` / ``link_timeline.csv`` on the
contention network, and what the ``clustersim.outputs`` plugins write (the Gantt chart, drawn in a forked process
while this one writes the rest: ``sim.cli.background``); the summary table on the console; exit code 0, or
``OutOfMemory`` with ``--fail-on-oom`` when a rank does not fit.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cli.options import run_limits
from sim.cli.plugins import OUTPUT_PLUGINS, plugins
from sim.errors import ConfigError, OutOfMemory, SimError

if TYPE_CHECKING:
    from rich.console import Console


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    own_process = getattr(args, "background", False)  # this process is the command (main() with argv None)
    collecting = gc.isenabled()
    if own_process:
        # The imports allocate 10^5 objects that live until the process exits, and the collector's passes over
        # them cost 0.05-0.1 CPU s of each run (2026-11-25): paused until the chart process is forked (which
        # keeps it paused: a short process drawing one figure), then those objects are frozen out of its later
        # passes (gc.freeze). runner.run pauses it for the run itself.
        gc.disable()
    charts = None
    try:
        import sim.runner  # noqa: F401 - numpy, pandas, pyarrow, pydantic: loaded before the fork, the child shares them

        if not args.no_plot and own_process:
            from sim.cli import background  # after numpy and pandas (the child shares them), before the scenario

            charts = background.start(OUTPUT_PLUGINS)
    finally:
        if own_process:
            gc.freeze()
        if collecting:
            gc.enable()
    try:
        return run_and_write(args, console, charts)
    except BaseException:
        if charts is not None:
            charts.cancel()
        raise


# The files ``sim run`` writes (with the chart plugins' gantt.png): a rerun into the same directory removes them
# first, so a trace.parquet from an earlier run never sits beside a new run's trace.csv (issue 27).
RUN_OUTPUTS = ("summary.json", "scenario.resolved.yaml", "trace.parquet", "trace.csv", "trace.json", "links.csv",
               "link_timeline.csv", "gantt.png")


def _output_directory(out: Path) -> Path:
    """``-o DIR`` made ready: created if missing; an earlier run's outputs removed, any other file kept."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o: {str(out)!r} is a file, not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        if (out / name).is_file() or (out / name).is_symlink():  # a directory of that name is the writer's error
            (out / name).unlink()
    return out


def run_and_write(args: argparse.Namespace, console: Console, charts: Any) -> int:
    """The run and its files, once the chart process is started (``charts``: its handle, ``sim.cli.background``; None
    to draw here, or not at all with ``--no-plot``). ``sim compare-trace`` runs its scenario through this too."""
    from sim import runner
    from sim.cli.tables import memory_problem, summary_table, summary_title
    from sim.output import trace
    from sim.output.atomic import write_atomically, write_text_atomically
    from sim.spec.scenario import load_scenario, resolved_yaml

    scenario = load_scenario(args.scenario, args.set)
    out = _output_directory(Path(args.output))  # before the run: a bad path is reported at once
    began = time.perf_counter()
    result = runner.run(scenario, record_links=args.chrome or args.link_timeline, limits=run_limits(args))
    wall = time.perf_counter() - began
    # Every file is written to a temporary name and renamed (sim.output.atomic): a killed run leaves none half-written.
    links, segments = result.links, result.link_segments
    if links is not None:  # contention network: which links carried what
        write_atomically(out / "links.csv", lambda path: links.to_csv(path, index=False))
    if segments is not None and args.link_timeline:  # (the Gantt chart reads it)
        write_atomically(out / "link_timeline.csv", lambda path: segments.to_csv(path, index=False))
    if charts is not None:  # the chart process draws while this one writes the rest
        charts.submit(out, result.trace, result.summary)
    write_text_atomically(out / "scenario.resolved.yaml", resolved_yaml(scenario))
    write_text_atomically(out / "summary.json", result.summary.to_json())
    write_atomically(out / f"trace.{args.format}", lambda path: trace.write_trace(result.trace, path))
    console.print(summary_title(result.summary), markup=False, highlight=False)
    console.print(summary_table(result.summary, wall))
    if args.chrome:
        write_atomically(out / "trace.json",
                         lambda path: trace.write_chrome_trace(result.trace, path, result.link_segments, result.graph))
    if charts is not None:
        error = charts.wait()
        if error:
            raise SimError(error)
    elif not args.no_plot:
        for write in plugins(OUTPUT_PLUGINS):
            write(out, result.trace, result.summary)
    console.print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in out.iterdir())))
    if not result.summary.fits_in_memory:
        problem = memory_problem(result.summary)
        if args.fail_on_oom:
            raise OutOfMemory(problem)
        console.print(f"warning: out of memory: {problem}", style="yellow")
    return 0
