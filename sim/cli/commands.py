"""Command line: ``sim run | check | plot | sweep | search | validate | schema | calibrate | import |
compare-trace`` (the last two, ``search --emit`` and ``calibrate --from-nccl-tests`` in ``sim.cli.ecosystem``).

In: argv. Out: files under the run directory (``summary.json``, ``trace.parquet``/``.csv``,
``scenario.resolved.yaml``, ``trace.json`` with ``--chrome``, plus what output plugins write, e.g. the Gantt
chart), a summary table on the terminal, and the exit code: 0 on success, non-zero with a one-line
``error: ...`` (no traceback) on a bad scenario, a deadlock, or out-of-memory with ``--fail-on-oom``.

Charts live in the ``analysis`` package, which ``sim`` never imports: ``analysis`` registers its writers
under the ``clustersim.outputs`` (after ``sim run``), ``clustersim.plot`` (``sim plot``) and
``clustersim.sweep_outputs`` (after ``sim sweep``), ``clustersim.search_outputs`` and
``clustersim.validate_outputs`` entry-point groups in pyproject.toml, and this module calls whatever is registered.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cli.ecosystem import (  # noqa: F401  # COMMAND_PLUGINS: the entry-point group, named here with the others
    COMMAND_PLUGINS,
    EMIT_FRAMEWORKS,
    EMIT_LIMITS,
    IMPORT_FRAMEWORKS,
    _emit_layouts,
    cmd_compare_trace,
    cmd_import,
    cmd_import_nccl_tests,
)
from sim.errors import ConfigError, OutOfMemory, SimError
from sim.explore.executors import DASK_TIMEOUT_S  # a light module: the parser's default

if TYPE_CHECKING:
    from rich.console import Console

# Start-up (issue 25): a command imports what it needs inside its function, so ``sim --help`` loads only argparse
# and ``sim check`` never loads pandas, pyarrow, networkx or matplotlib; the chart plugins load when a chart is
# written. ``tests/test_cli_startup.py`` holds both to it.

OUTPUT_PLUGINS = "clustersim.outputs"
PLOT_PLUGINS = "clustersim.plot"
SWEEP_PLUGINS = "clustersim.sweep_outputs"
SEARCH_PLUGINS = "clustersim.search_outputs"
VALIDATE_PLUGINS = "clustersim.validate_outputs"
# Commands another installed package provides (sim never imports analysis): each entry point's name is the sim
# command it implements; analysis registers ``compare-trace`` (pyproject.toml).


def _plugins(group: str) -> list[Callable[..., Any]]:
    from importlib.metadata import entry_points

    return [entry.load() for entry in sorted(entry_points(group=group), key=lambda e: e.name)]


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
        return _run(args, console, charts)
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


def _run(args: argparse.Namespace, console: Console, charts: Any) -> int:
    from sim import runner
    from sim.cli.tables import memory_problem, summary_table, summary_title
    from sim.output import trace
    from sim.output.atomic import write_atomically, write_text_atomically
    from sim.spec.scenario import load_scenario, resolved_yaml

    scenario = load_scenario(args.scenario, args.set)
    out = _output_directory(Path(args.output))  # before the run: a bad path is reported at once
    began = time.perf_counter()
    result = runner.run(scenario, record_links=args.chrome or args.link_timeline, limits=_limits(args))
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
        for write in _plugins(OUTPUT_PLUGINS):
            write(out, result.trace, result.summary)
    console.print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in out.iterdir())))
    if not result.summary.fits_in_memory:
        problem = memory_problem(result.summary)
        if args.fail_on_oom:
            raise OutOfMemory(problem)
        console.print(f"warning: out of memory: {problem}", style="yellow")
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from sim import api
    from sim.cli.tables import memory_table, parameters_line
    from sim.spec.degrees import degrees

    checked = api.check(args.scenario, args.set)
    scenario = checked.scenario
    console.print(checked.resolved_yaml, markup=False, highlight=False)
    console.print(memory_table(scenario, checked.memory_plan))
    implied = degrees(scenario)
    console.print(parameters_line(scenario.model))
    if scenario.training.method != "full":
        share = checked.trainable_params / checked.model_params
        console.print(f"{scenario.training.method}: trainable parameters {checked.trainable_params:,.0f} of "
                      f"{checked.model_params:,.0f} ({share:.2%})")
    for note in checked.notes:
        console.print(note, markup=False, highlight=False)
    console.print(f"ok: {scenario.name}: {implied.num_gpus} GPUs, {implied.microbatches} micro-batches per step")
    return 0


def cmd_plot(args: argparse.Namespace, console: Console) -> int:
    from sim.output import trace

    run_dir = Path(args.run_dir)
    found = [p for p in (run_dir / "trace.parquet", run_dir / "trace.csv") if p.is_file()]
    if not found:
        raise ConfigError(f"run_dir: no trace.parquet or trace.csv in {str(run_dir)!r}")
    frame = trace.read_trace(found[0])
    ranks = _plot_selection(frame, args.ranks, args.start, args.end)
    plotters = _plugins(PLOT_PLUGINS)
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
                                limits=_limits(args), on_dashboard=_dashboard(args, console))
    counts = table["status"].str.split(":").str[0].value_counts().to_dict()
    console.print(f"{len(table)} points: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not args.no_plot:
        for write in _plugins(SWEEP_PLUGINS):
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
    out, only = Path(args.output), search.parse_only(args.only)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with stop_on_sigterm(), Progress(*columns, console=console, transient=True) as bar:
        screening = bar.add_task("screening layouts", total=None)
        task = bar.add_task("simulating the best layouts", total=None)
        found = search.run_search(Path(args.scenario), args.set, out, args.top, args.jobs, args.executor,
                                  args.scheduler, not args.no_bound, lambda row: bar.advance(task), only,
                                  args.dask_timeout, _limits(args), _dashboard(args, console),
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
        _emit_layouts(args, console, simulated[simulated["status"] == "ok"].head(args.show), out)
    if not args.no_plot:
        for write in _plugins(SEARCH_PLUGINS):
            write(out, screened, simulated)
    console.print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


def _limits(args: argparse.Namespace) -> Any:
    """The run budget of ``--max-tasks`` / ``--max-memory`` (sim.workload.size.Limits)."""
    from sim.api import limits

    return limits(args.max_tasks, args.max_memory, ("--max-tasks", "--max-memory"))


def limit_args(cmd: argparse.ArgumentParser) -> None:
    """``--max-tasks`` / ``--max-memory``: a run's budget, checked against its estimated size before it is built
    (sim.workload.size; docs/reliability.md)."""
    cmd.add_argument("--max-tasks", type=int, metavar="N", help="refuse a run estimated above N tasks (default "
                     "10,000,000)")
    cmd.add_argument("--max-memory", metavar="SIZE", help="refuse a run estimated above SIZE, e.g. '8 GiB' "
                     "(default: half the machine's memory)")


def executor_args(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("-j", "--jobs", type=int, default=1, help="points run in parallel (processes or Dask workers); "
                     "search also screens its layouts in this many local processes (at most the CPUs)")
    cmd.add_argument("--executor", choices=("process", "dask"), default="process",
                     help="process: local worker processes; dask: a Dask cluster (local unless --scheduler)")
    cmd.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://host:8786")
    cmd.add_argument("--dask-timeout", type=float, default=DASK_TIMEOUT_S, metavar="SECONDS",
                     help=f"how long to wait to connect to the Dask scheduler (default {DASK_TIMEOUT_S:g})")
    cmd.add_argument("--dask-dashboard", action="store_true",
                     help="serve the Dask dashboard (a local cluster's on 127.0.0.1) and print its link (default: off)")


def _dashboard(args: argparse.Namespace, console: Console) -> Callable[[str], None] | None:
    """With ``--dask-dashboard``: a callback printing the dashboard's link once; ConfigError without Dask."""
    if not args.dask_dashboard:
        return None
    if args.executor != "dask":
        raise ConfigError("--dask-dashboard: needs --executor dask")
    shown: set[str] = set()

    def show(link: str) -> None:
        if link not in shown:
            shown.add(link)
            console.print(f"Dask dashboard: {link}", markup=False, highlight=False)
    return show


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="sim", description="clustersim: simulate one LLM training step.")
    commands = top.add_subparsers(dest="command", required=True)

    def scenario_args(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("scenario", help="scenario YAML file")
        cmd.add_argument("--set", action="append", default=[], metavar="a.b=value",
                         help="override a scenario field (repeatable)")

    run = commands.add_parser("run", help="simulate a scenario and write summary, trace and Gantt chart")
    scenario_args(run)
    run.add_argument("-o", "--output", default="runs/latest", help="run directory (default runs/latest)")
    run.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="trace file format")
    run.add_argument("--chrome", action="store_true", help="also write trace.json for Perfetto (with link loads)")
    run.add_argument("--link-timeline", action="store_true",
                     help="contention network: also write link_timeline.csv, each link's load over time")
    run.add_argument("--no-plot", action="store_true", help="skip the Gantt chart")
    run.add_argument("--fail-on-oom", action="store_true", help="exit non-zero if a rank does not fit")
    limit_args(run)
    run.set_defaults(handler=cmd_run)

    check = commands.add_parser("check", help="validate a scenario and print it with every default filled")
    scenario_args(check)
    check.set_defaults(handler=cmd_check)

    plot = commands.add_parser("plot", help="draw the Gantt chart of a run directory")
    plot.add_argument("run_dir")
    plot.add_argument("--ranks", help="comma-separated global ranks to show")
    plot.add_argument("--start", type=float, help="window start, seconds")
    plot.add_argument("--end", type=float, help="window end, seconds")
    plot.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    plot.set_defaults(handler=cmd_plot)

    sweep_cmd = commands.add_parser("sweep", help="run a grid of scenario variants into a results table")
    sweep_cmd.add_argument("target", help="a scenario YAML (with --grid) or a sweep file (base, set, grid)")
    sweep_cmd.add_argument("--grid", action="append", default=[], metavar="a.b=v1,v2|a..b",
                           help="a grid axis: a.b=v1,v2, a.b=[v1,v2] or a.b=lo..hi (repeatable; later axes vary "
                           "fastest)")
    sweep_cmd.add_argument("--set", action="append", default=[], metavar="a.b=value",
                           help="override a field of the base scenario (repeatable)")
    executor_args(sweep_cmd)
    sweep_cmd.add_argument("-o", "--output", default="runs/sweep", help="sweep directory (default runs/sweep)")
    sweep_cmd.add_argument("--no-plot", action="store_true", help="skip the sweep plot")
    limit_args(sweep_cmd)
    sweep_cmd.set_defaults(handler=cmd_sweep)

    search_cmd = commands.add_parser("search", help="find the best layout: screen every tp/pp/dp/vpp/micro-batch/"
                                     "schedule/ZeRO/recompute/SP layout analytically, simulate the best")
    scenario_args(search_cmd)
    search_cmd.add_argument("--top", type=int, default=1000, help="layouts to confirm by simulation (default 1000)")
    search_cmd.add_argument("--no-bound", action="store_true",
                            help="simulate all --top layouts (default: skip those whose lower bound cannot win)")
    search_cmd.add_argument("--show", type=int, default=10, help="rows of the printed table")
    search_cmd.add_argument("-o", "--output", default="runs/search", help="output directory (default runs/search)")
    search_cmd.add_argument("--no-plot", action="store_true", help="skip the memory / step-time plot")
    search_cmd.add_argument("--emit", choices=EMIT_FRAMEWORKS, help="also write each shown layout's launch "
                            "configuration (Megatron-LM script, TorchTitan TOML, DeepSpeed JSON) under OUTPUT/emit/")
    search_cmd.add_argument("--only", action="append", default=[], metavar="KNOB=v1,v2",
                            help="search only these values of a knob, e.g. zero=0,1 or tp=4..8 (repeatable)")
    executor_args(search_cmd)
    limit_args(search_cmd)
    search_cmd.set_defaults(handler=cmd_search)

    imp = commands.add_parser("import", allow_abbrev=False, help="a scenario from a launch configuration: Megatron-LM "
                              "arguments or script, NeMo YAML, DeepSpeed JSON (+ HF Trainer arguments), TorchTitan "
                              "TOML; prints what became of every setting")
    imp.add_argument("framework", choices=IMPORT_FRAMEWORKS)
    imp.add_argument("inputs", nargs="*", metavar="FILE-or-ARGS",
                     help="the configuration file; Megatron: a launch script or the arguments themselves; DeepSpeed: "
                     "ds_config.json then the HF Trainer's arguments (--per_device_train_batch_size 4 ...)")
    imp.add_argument("-o", "--output", required=True, help="scenario YAML to write")
    imp.add_argument("--gpu", help="GPU preset (H100-SXM, A100-80GB-SXM, ...): the configurations do not say")
    imp.add_argument("--gpus", type=int, help="GPUs in all (default: what the configuration says, if anything)")
    imp.add_argument("--nodes", type=int, help="nodes (x --gpus-per-node, default the GPU's node preset)")
    imp.add_argument("--gpus-per-node", type=int, help="GPUs per node")
    imp.add_argument("--model", help="model preset or Hugging Face config.json: the shape the configuration does "
                     "not give (the vocabulary, or all of it)")
    imp.add_argument("--name", help="scenario name (default FRAMEWORK-import)")
    imp.set_defaults(handler=cmd_import)

    val = commands.add_parser("validate", help="run the validation set: predicted vs published iteration time and MFU")
    val.add_argument("folder", nargs="?", help="scenarios + published.csv (default scenarios/validation)")
    val.add_argument("--only", action="append", help="one scenario file name (repeatable)")
    val.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of every scenario, e.g. costs.end_to_end_factor=1 (repeatable)")
    val.add_argument("-o", "--output", help="write validation.csv here")
    val.set_defaults(handler=cmd_validate)
    trace_cmd = commands.add_parser("compare-trace", help="run a scenario and hold a torch.profiler trace of the real "
                                    "step against it, per step and kernel class (needs clustersim's analysis)")
    trace_cmd.add_argument("profiler", help="Chrome trace JSON (.json or .json.gz) written by torch.profiler")
    scenario_args(trace_cmd)
    trace_cmd.add_argument("-o", "--output", default="runs/compare-trace", help="run directory (default "
                           "runs/compare-trace)")
    trace_cmd.add_argument("--rank", type=int, help="simulated rank (default: the trace's distributedInfo rank, "
                           "else 0)")
    trace_cmd.add_argument("--device", type=int, help="the trace's GPU (pid) to read (default: the lowest)")
    trace_cmd.add_argument("--steps", help="ProfilerStep numbers to average, e.g. 5,6 (default: all)")
    trace_cmd.add_argument("--table", metavar="FILE", help="also write the markdown table here")
    trace_cmd.add_argument("--chart", metavar="FILE", help="also draw measured vs simulated bars here (PNG/SVG/PDF)")
    limit_args(trace_cmd)
    trace_cmd.set_defaults(handler=cmd_compare_trace)

    schema = commands.add_parser("schema", help="print a JSON Schema: of scenario files (default; for editors, "
                                 "e.g. sim schema > scenario.schema.json) or of summary.json")
    schema.add_argument("what", nargs="?", choices=("scenario", "summary"), default="scenario")
    schema.set_defaults(handler=cmd_schema)
    cal = commands.add_parser("calibrate", help="microbenchmark this machine (GEMMs, copies, collectives, numerics) "
                              "into a profile for costs: calibrated")
    cal.add_argument("-o", "--output", default="runs/calibration", help="output directory")
    cal.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when a GPU is visible")
    cal.add_argument("--quick", action="store_true", help="small fixed shapes and sizes (a CI smoke run, seconds; "
                     "ignores --model/--scenario)")
    cal.add_argument("--procs", type=int, default=2, help="CPU: gloo processes for the collectives")
    cal.add_argument("--no-collectives", action="store_true", help="skip the collectives")
    cal.add_argument("--model", default="llama2-7b", help="model preset whose layer GEMM shapes are timed")
    cal.add_argument("--scenario", help="take the model, tp, micro-batch and sequence length from this scenario")
    cal.add_argument("--tp", type=int, default=1)
    cal.add_argument("--micro-batch", type=int, default=1)
    cal.add_argument("--seq-len", type=int, default=4096)
    cal.add_argument("action", nargs="*", metavar="import-nccl-tests LOG", help="the same as --from-nccl-tests "
                     "LOG... (sim calibrate import-nccl-tests LOG...)")
    cal.add_argument("--from-nccl-tests", nargs="+", metavar="LOG", help="fit the link tiers of a profile from "
                     "your own nccl-tests outputs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
                     "alltoall_perf, sendrecv_perf stdout) instead of measuring: one host -> NVLink tiers, several "
                     "-> the NIC tier; written into -o DIR/profile.json (merged when it exists)")
    cal.add_argument("--base", metavar="PROFILE", help="with --from-nccl-tests: the profile to merge into "
                     "(default: -o DIR/profile.json if it exists, else the shipped profile of the logs' GPU)")
    cal.add_argument("--node", metavar="PRESET", help="with --from-nccl-tests: the node preset giving line rates, "
                     "NICs and the NVLink domain (default: the logs' GPU's, e.g. dgx-h100 for H100)")
    cal.add_argument("--nvls", action="store_true", help="with --from-nccl-tests: the one-host all-reduce runs "
                     "used NVLink SHARP (NCCL's default on NVSwitch H100 / H200): fit the nvls tier")
    cal.add_argument("--tier", choices=("intra_node", "inter_node", "nvls", "all_to_all"),
                     help="with --from-nccl-tests: the tier every log describes (default: from the hosts)")
    cal.add_argument("--in-place", action="store_true", help="with --from-nccl-tests: fit the in-place columns "
                     "(default: out-of-place)")
    cal.set_defaults(handler=cmd_calibrate)
    return top


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    """``sim schema [scenario|summary]``: the JSON Schema on stdout, plain (no console wrapping)."""
    if args.what == "summary":
        from sim.output.summary import json_schema
        document = json_schema()
    else:
        from sim.spec.json_schema import scenario_schema
        document = scenario_schema()
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return 0


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from sim.validation.validate import DEFAULT_FOLDER, error_stats, run_validation

    table = run_validation(args.folder or DEFAULT_FOLDER, args.only, args.overrides)
    view = Table(title="predicted vs published (iteration time; MFU where published)", header_style="bold")
    for column in ("scenario", "role", "GPUs", "published s", "predicted s", "error", "MFU pub / pred"):
        view.add_column(column, justify="left" if column == "scenario" else "right")
    for r in table.to_dict("records"):
        if r.get("error"):
            view.add_row(r["scenario"], r["role"], "", f"{r['published_iteration_time_s']:.3f}", "failed",
                         r["error"][:60], "")
            continue
        published_mfu = r["published_mfu"]
        mfu = f"{published_mfu:.3f} / {r['predicted_mfu']:.3f}" if published_mfu == published_mfu else ""  # not NaN
        view.add_row(r["scenario"], r["role"], str(r["gpus"]), f"{r['published_iteration_time_s']:.3f}",
                     f"{r['predicted_iteration_time_s']:.3f}", f"{r['iteration_time_error']:+.1%}", mfu)
    console.print(view)
    stats = error_stats(table)
    console.print(f"{stats['rows']:.0f} validation rows: mean absolute error {stats['mean_abs']:.1%}, maximum "
                  f"{stats['max_abs']:.1%}, signed mean {stats['signed_mean']:+.1%} "
                  f"({stats['optimistic_share']:.0%} predicted too short)")
    for key, value in stats.items():
        if ":" in key:
            console.print(f"{key.replace('_abs', ' absolute error')}: {value:.1%}")
    if args.output:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        table.to_csv(Path(args.output) / "validation.csv", index=False)
        for write in _plugins(VALIDATE_PLUGINS):
            write(args.output, table)
        console.print(f"wrote {args.output}/: " + ", ".join(sorted(p.name for p in Path(args.output).iterdir())))
    return 1 if (table["error"] != "").any() else 0


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    if args.action:  # sim calibrate import-nccl-tests LOG... (issue 26's spelling)
        if args.action[0] != "import-nccl-tests" or len(args.action) < 2:
            raise ConfigError(f"calibrate: {' '.join(args.action)!r}: expected import-nccl-tests LOG... (or no "
                              "argument, to measure this machine)")
        args.from_nccl_tests = [*args.action[1:], *(args.from_nccl_tests or [])]
    if args.from_nccl_tests:
        return cmd_import_nccl_tests(args, console)
    from sim.calibrate.run import CalibrationOptions, calibrate, resolve_device
    from sim.model.transformer import MODEL_PRESETS
    from sim.spec.degrees import degrees
    from sim.spec.scenario import load_scenario

    device = resolve_device(args.device)
    if not args.scenario and args.model not in MODEL_PRESETS:
        raise ConfigError(f"calibrate: --model {args.model!r} is not a model preset "
                          f"(known: {', '.join(MODEL_PRESETS)})")
    model, tp, micro_batch, seq_len = args.model, args.tp, args.micro_batch, args.seq_len
    if args.scenario:  # the GEMM shapes of that scenario's layer
        scenario = load_scenario(args.scenario)
        model, tp, micro_batch, seq_len = (scenario.model, scenario.parallel.tp, scenario.training.micro_batch,
                                           degrees(scenario).seq_len)
    options = CalibrationOptions(Path(args.output), device, args.quick, args.procs, model, tp, micro_batch, seq_len,
                                 not args.no_collectives)
    result = calibrate(options)
    if result is None:  # a non-zero torchrun rank: rank 0 reports
        return 0
    measured = result.profile
    table = Table(title=f"calibration: {measured.device.name}", header_style="bold")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    for dtype, curve in sorted(measured.gemm.items()):
        table.add_row(f"GEMM {dtype}", f"{curve.rate[0][1] / 1e9:,.1f} .. {curve.rate[-1][1] / 1e9:,.1f} GFLOP/s")
    table.add_row("device copy", f"{(measured.copy_bandwidth or 0) / 1e9:,.1f} GB/s")
    for tier in ("intra_node", "inter_node"):
        fields = getattr(measured, tier)
        if fields:
            table.add_row(f"collectives ({tier})",
                          f"busbw plateau {fields['bandwidth'] * fields['efficiency'] / 1e9:,.2f}"
                          f" GB/s, base {fields['base_latency'] * 1e6:.0f} us")
    for row in result.numerics.itertuples(index=False):
        table.add_row(f"{row.dtype}: {row.check}", f"{row.value:.3g} {row.note if isinstance(row.note, str) else ''}")
    console.print(table)
    console.print(f"wrote {args.output}/: " + ", ".join(sorted(p.name for p in Path(args.output).iterdir())))
    return 0


def main(argv: list[str] | None = None, background: bool | None = None) -> int:
    """Run one command; its exit code. ``background``: draw ``sim run``'s charts in a forked process
    (``sim.cli.background``); by default only when this is the process's own command line (``argv`` None), so a
    caller's process (a test, a notebook) is never forked."""
    top = parser()
    args, extra = top.parse_known_args(argv)
    if extra:  # only ``sim import`` takes a framework's own flags (Megatron's, the HF Trainer's) as its inputs
        if args.command != "import":
            top.parse_args(argv)  # argparse's own error for an unknown flag (exit 2)
        args.inputs = list(args.inputs) + extra
    args.background = argv is None if background is None else background
    from rich.console import Console

    from sim.cli.console import TableConsole

    console = TableConsole()
    try:
        return int(args.handler(args, console))
    except SimError as error:
        Console(stderr=True).print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        return error.exit_code
    except OSError as error:  # an output path that cannot be written, a disk that is full (inputs are read
        # behind the boundary, sim.spec.scenario.read_text and sim.costs.profile.load, which name their field)
        target = f" {error.filename!r}" if error.filename else ""
        Console(stderr=True).print(f"error: cannot write{target}: {error.strerror or error}", markup=False,
                                   highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
