"""``sim sweep`` and ``sim search``: many variants of a scenario, run into a results table.

In: the parsed arguments (``sweep``: a scenario with ``--grid`` axes or a sweep file; ``search``: a scenario, its
``--top`` / ``--only`` / ``--emit`` options; both: the executor options and the run budget, ``sim.cli.options``).
Out: under ``-o``, the results table(s) (``sim.explore.sweep`` / ``sim.explore.search``) and what the
``clustersim.sweep_outputs`` / ``clustersim.search_outputs`` plugins draw; a progress bar, the status counts and
(search) the table of the best layouts on the console; with ``--emit``, each shown layout's launch configuration
(``sim.cli.ecosystem``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.ecosystem import EMIT_LIMITS, emit_layouts
from sim.cli.options import dashboard, run_limits
from sim.cli.plugins import SEARCH_PLUGINS, SWEEP_PLUGINS, plugins
from sim.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sim.explore import sweep
    from sim.explore.executors import stop_on_sigterm

    spec = sweep.make_spec(Path(args.target), args.grid, args.set)
    out = Path(args.output)
    columns = [TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with stop_on_sigterm(), Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("sweep", total=None)

        def started(total: int, done: int) -> None:
            bar.update(task, total=total, completed=done)
            if done:
                console.print(f"resuming: {done} of {total} points already in {out / sweep.RESULTS_CSV}")

        table = sweep.run_sweep(spec, out, args.jobs, on_start=started, on_row=lambda row: bar.advance(task),
                                executor=args.executor, scheduler=args.scheduler, dask_timeout=args.dask_timeout,
                                limits=run_limits(args), on_dashboard=dashboard(args, console))
    counts = table["status"].str.split(":").str[0].value_counts().to_dict()
    console.print(f"{len(table)} points: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not args.no_plot:
        for write in plugins(SWEEP_PLUGINS):
            write(out, table, list(spec.grid))
    console.print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


def cmd_search(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from sim.explore import search
    from sim.explore.executors import stop_on_sigterm

    if args.emit:  # search only what the framework can run, unless --only says otherwise for that knob
        given = {spec.split("=", 1)[0].strip() for spec in args.only}
        limits = EMIT_LIMITS[args.emit]
        args.only = list(args.only) + [f"{knob}={values}" for knob, values in limits.items() if knob not in given]
        console.print(f"--emit {args.emit}: searching " + ", ".join(f"{k}={v}" for k, v in limits.items()
                                                                     if k not in given), markup=False)
    if args.top < 1:  # --top 0 screened everything, then reported that no layout fits
        raise ConfigError(f"--top: {args.top} layouts; simulate at least 1")
    out, only = Path(args.output), search.parse_only(args.only)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with stop_on_sigterm(), Progress(*columns, console=console, transient=True) as bar:
        screening = bar.add_task("screening layouts", total=None)
        task = bar.add_task("simulating the best layouts", total=None)
        found = search.run_search(Path(args.scenario), args.set, out, args.top, args.jobs, args.executor,
                                  args.scheduler, not args.no_bound, lambda row: bar.advance(task), only,
                                  args.dask_timeout, run_limits(args), dashboard(args, console),
                                  lambda done, total: bar.update(screening, completed=done, total=total))
    screened, simulated = found.screened, found.simulated
    counts = screened["status"].str.split(":").str[0].value_counts().to_dict()
    console.print(f"screened {len(screened):,} layouts in {found.screen_s:.1f} s "
                  f"({len(screened) / found.screen_s:,.0f}/s): "
                  + ", ".join(f"{n:,} {k}" for k, n in sorted(counts.items())))
    console.print(f"simulated {len(simulated):,} in {found.simulate_s:.1f} s")
    table = Table(title=f"best layouts (of {len(simulated):,} simulated)", header_style="bold")
    for name in ("layout", "mb", "schedule", "ZeRO", "recompute", "SP", "step s", "est. s", "MFU", "GiB"):
        table.add_column(name, justify="left" if name in ("layout", "schedule", "recompute") else "right",
                         no_wrap=True)
    estimates = screened.set_index(list(search.LAYOUT_FIELDS))["est_step_time_s"]
    for _, row in simulated[simulated["status"] == "ok"].head(args.show).iterrows():
        v = {name: row[search.LAYOUT_KEYS[name]] for name in search.LAYOUT_FIELDS}
        layout = f"tp{v['tp']} pp{v['pp']} dp{v['dp']}" + (f" v{v['vpp']}" if v["vpp"] > 1 else "") \
            + (f" ep{v['ep']}" if v["ep"] > 1 else "")
        estimate = estimates.get(tuple(v.values()), float("nan"))
        table.add_row(layout, str(v["micro_batch"]), str(v["schedule"]), str(v["zero"]), str(v["recompute"]),
                      "yes" if v["sequence_parallel"] else "no", f"{row['step_time_s']:.4g}", f"{estimate:.4g}",
                      f"{row['mfu']:.1%}", f"{row['peak_memory_bytes'] / 2**30:.0f}")
    console.print(table)
    if args.emit:
        emit_layouts(args, console, simulated[simulated["status"] == "ok"].head(args.show), out)
    if not args.no_plot:
        for write in plugins(SEARCH_PLUGINS):
            write(out, screened, simulated)
    console.print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0
