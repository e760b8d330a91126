"""Command line: ``sim run | check | plot | sweep | search | validate | schema | calibrate | import |
compare-trace``: the parser and the dispatch.

In: argv. Out: the exit code of the command's handler: 0 on success, non-zero with a one-line ``error: ...`` (no
traceback) on a bad scenario, a deadlock, out-of-memory with ``--fail-on-oom``, or an output that cannot be written.

Each command's handler lives with its kind: ``sim.cli.run`` (``run``), ``sim.cli.check`` (``check``, ``schema``),
``sim.cli.plot``, ``sim.cli.explore`` (``sweep``, ``search``), ``sim.cli.validate``, ``sim.cli.calibrate``, and
``sim.cli.ecosystem`` (``import``, ``compare-trace``, ``search --emit``, ``calibrate --from-nccl-tests``); the
options several share are in ``sim.cli.options``, the entry-point groups that let ``analysis`` draw the charts in
``sim.cli.plugins``.
"""

from __future__ import annotations

import argparse
import sys

from sim.cli.calibrate import cmd_calibrate
from sim.cli.check import cmd_check, cmd_schema
from sim.cli.ecosystem import EMIT_FRAMEWORKS, IMPORT_FRAMEWORKS, cmd_compare_trace, cmd_import
from sim.cli.explore import cmd_search, cmd_sweep
from sim.cli.options import executor_args, limit_args, scenario_args
from sim.cli.plot import cmd_plot
from sim.cli.run import cmd_run
from sim.cli.validate import cmd_validate
from sim.errors import SimError

# Start-up (issue 25): a command imports what it needs inside its function, so ``sim --help`` loads only argparse
# and ``sim check`` never loads pandas, pyarrow, networkx or matplotlib; the chart plugins load when a chart is
# written. ``tests/test_cli_startup.py`` holds both to it.


def parser() -> argparse.ArgumentParser:
    """The ``sim`` command line: one subcommand per command, each with its handler (``args.handler``)."""
    top = argparse.ArgumentParser(prog="sim", description="clustersim: simulate one LLM training step.")
    commands = top.add_subparsers(dest="command", required=True)

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
        # behind the boundary, sim.spec.files.read_text and sim.costs.profile.load, which name their field)
        target = f" {error.filename!r}" if error.filename else ""
        Console(stderr=True).print(f"error: cannot write{target}: {error.strerror or error}", markup=False,
                                   highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
