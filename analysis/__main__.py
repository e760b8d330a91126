"""``python -m analysis``: charts that need more than one run.

  compare SCENARIO -o FILE        stacked Gantt charts of GPipe, 1F1B, interleaved, ZB-H1 and ZB-H2
  dualpipe [-o FILE]              one DualPipe step, DualPipeV's and 1F1B's (docs/images/gantt-dualpipe.png)
  dualpipe-moe [-o FILE]          one DualPipe step of a MoE, pairs hiding dispatch/combine (gantt-dualpipe-moe.png)
  a2a-overlap [-o FILE]           one step of Megatron's combined 1F1B (moe.a2a_overlap) (gantt-a2a-overlap.png)
  sweep-plot DIR --x KEY [--hue KEY] [--metric M ...] -o FILE    a metric of a sweep against a swept key
  fsdp-report [-o FILE.md]        predicted vs published MFU of IBM/Meta's Llama-2 FSDP runs
  network-report [-o FILE.md]     predicted vs measured collective busbw on H100 (1 MiB .. 1 GiB)
  gemm-report [-o FILE.md]        predicted vs measured GEMM times on H100 and B200 (default profiles)
  compare-profile TRACE.json RUN_DIR [--rank R] [--steps N,..] [-o FILE.md] [--chart FILE.png]
                                  a torch.profiler (Kineto) trace of the real step against a simulated one: per
                                  kernel class (GEMM, attention, other compute, NCCL collectives, memcpy, idle)
  search-report [--scenario S] [--top N] [-o FILE.md]   sim search on a scenario (default the bundled GPT-3 175B):
                                  the best layouts and what sets each
  validate [--folder DIR] [--out DIR] [--mechanisms] [--moe-folder DIR]  run the validation set; write
                                  DIR/validation.md (with the calibration, the MoE rows of --moe-folder as their own
                                  section and, with --mechanisms, each mechanism's effect) and the parity plot
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import fsdp_report, gemm_report, network_report
from analysis.chart_file import chart_path
from analysis.compare import compare_schedules
from analysis.sweep_plot import plot_sweep
from sim.errors import ConfigError, SimError


def main(argv: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    compare = commands.add_parser("compare", help="Gantt charts of the pipeline schedules, stacked")
    compare.add_argument("scenario")
    compare.add_argument("-o", "--output", required=True)
    dualpipe = commands.add_parser("dualpipe", help="Gantt chart of one DualPipe step (and DualPipeV, 1F1B)")
    dualpipe.add_argument("-o", "--output", default="docs/images/gantt-dualpipe.png")
    dualpipe_moe = commands.add_parser("dualpipe-moe", help="Gantt chart of one DualPipe step of a MoE (ep overlap)")
    dualpipe_moe.add_argument("-o", "--output", default="docs/images/gantt-dualpipe-moe.png")
    a2a = commands.add_parser("a2a-overlap", help="Gantt chart of one step of Megatron's EP A2A overlap")
    a2a.add_argument("-o", "--output", default="docs/images/gantt-a2a-overlap.png")
    sweep = commands.add_parser("sweep-plot", help="plot a sweep's results table")
    sweep.add_argument("run_dir")
    sweep.add_argument("--x", required=True)
    sweep.add_argument("--hue")
    sweep.add_argument("--metric", action="append", help="repeatable; default step time, bubble, (host-bound,) MFU")
    sweep.add_argument("-o", "--output", required=True)
    fsdp = commands.add_parser("fsdp-report", help="predicted vs published MFU of FSDP runs")
    fsdp.add_argument("-o", "--output", help="also write the markdown table here")
    net = commands.add_parser("network-report", help="predicted vs measured collective busbw on H100")
    net.add_argument("-o", "--output", help="also write the markdown table here")
    gemm = commands.add_parser("gemm-report", help="predicted vs measured GEMM times (default profiles)")
    gemm.add_argument("-o", "--output", help="also write the markdown table here")
    profile = commands.add_parser("compare-profile", help="a torch.profiler trace against a simulated step, "
                                  "per kernel class, on one rank")
    profile.add_argument("trace", help="Chrome trace JSON (.json or .json.gz) written by torch.profiler")
    profile.add_argument("run_dir", help="a sim run output directory")
    profile.add_argument("--rank", type=int, help="simulated rank (default: the trace's distributedInfo rank, else 0)")
    profile.add_argument("--device", type=int, help="the trace's GPU (pid) to read (default: the lowest)")
    profile.add_argument("--steps", help="ProfilerStep numbers to average, e.g. 5,6 (default: all)")
    profile.add_argument("-o", "--output", help="also write the markdown table here")
    profile.add_argument("--chart", help="also draw measured vs simulated bars here (PNG/SVG/PDF)")
    search = commands.add_parser("search-report", help="the best layouts of GPT-3 175B on 1024 A100 (docs/scale.md)")
    search.add_argument("--scenario", default="scenarios/gpt3-175b_a100-1024.yaml")
    search.add_argument("--set", dest="overrides", action="append", default=[])
    search.add_argument("--top", type=int, default=1000, help="layouts to confirm by simulation (sim search --top)")
    search.add_argument("-o", "--output", help="also write the markdown here")
    val = commands.add_parser("validate", help="run scenarios/validation; write the report and parity plot")
    val.add_argument("--folder", default="scenarios/validation")
    val.add_argument("--out", default="docs", help="validation.md goes here, the plot under OUT/images/")
    val.add_argument("--moe-folder", default="scenarios/validation/moe",
                     help="the MoE validation folder, reported as its own section ('' to skip)")
    val.add_argument("--mechanisms", action="store_true",
                     help="also run the set once per mechanism switched off and add the ablation table")
    args = top.parse_args(argv)
    reports = {"fsdp-report": fsdp_report, "network-report": network_report, "gemm-report": gemm_report}
    try:
        if args.command in ("compare", "sweep-plot", "dualpipe", "dualpipe-moe", "a2a-overlap"):
            chart_path(args.output)  # before anything runs (analysis.chart_file)
        if args.command == "compare-profile" and args.chart:
            chart_path(args.chart, "--chart")
        if args.command in reports:
            module = reports[args.command]
            markdown = module.to_markdown(module.report())
            print(markdown)
            if args.output:
                Path(args.output).write_text(markdown)
                print(f"wrote {args.output}")
            return 0
        if args.command == "compare-profile":
            from analysis import profile_compare

            steps = None
            if args.steps:
                try:
                    steps = [int(step) for step in args.steps.split(",")]
                except ValueError:
                    raise SimError(f"--steps: {args.steps!r} is not a list of step numbers, e.g. 5,6") from None
            markdown, written = profile_compare.compare_trace(args.trace, args.run_dir, rank=args.rank,
                                                              device=args.device, steps=steps, table=args.output,
                                                              chart=args.chart)
            print(markdown)
            for path in written:
                print(f"wrote {path}")
            return 0
        if args.command == "search-report":
            from analysis import search_report

            screened, best = search_report.report(args.scenario, args.overrides, top=args.top)
            markdown = search_report.to_markdown(screened, best, f"`sim search {args.scenario}`"
                                                 + "".join(f" --set {o}" for o in args.overrides))
            print(markdown)
            if args.output:
                Path(args.output).write_text(markdown)
                print(f"wrote {args.output}")
            return 0
        if args.command == "validate":
            from analysis.validation_report import (
                calibration_markdown,
                mechanism_table,
                mechanisms_markdown,
                moe_markdown,
                write_validation_report,
            )
            from sim.validation.validate import run_validation

            table = run_validation(args.folder)
            write_validation_report(args.out, table, Path(args.out) / "images")
            report = Path(args.out) / "validation.md"
            extra = calibration_markdown()
            if args.moe_folder:
                extra += moe_markdown(run_validation(args.moe_folder), args.moe_folder)
            if args.mechanisms:
                extra += mechanisms_markdown(mechanism_table(args.folder, table), table)
            report.write_text(report.read_text() + extra)
            print(report.read_text())
            print(f"wrote {args.out}/validation.md, {args.out}/images/parity.png")
            return 0
        if args.command == "dualpipe":
            from analysis.dualpipe_chart import write_dualpipe_chart

            print(f"wrote {write_dualpipe_chart(args.output)}")
            return 0
        if args.command == "a2a-overlap":
            from analysis.dualpipe_chart import write_a2a_overlap_chart

            print(f"wrote {write_a2a_overlap_chart(args.output)}")
            return 0
        if args.command == "dualpipe-moe":
            from analysis.dualpipe_chart import write_dualpipe_moe_chart

            print(f"wrote {write_dualpipe_moe_chart(args.output)}")
            return 0
        if args.command == "compare":
            compare_schedules(args.scenario, args.output)
        else:
            results = Path(args.run_dir) / "results.parquet"
            if not results.is_file():
                raise ConfigError(f"run_dir: no results.parquet in '{args.run_dir}' (a `sim sweep` or `sim search` "
                               "folder)")
            table = pd.read_parquet(results)
            for option, keys in (("--x", [args.x]), ("--hue", [args.hue]), ("--metric", args.metric or [])):
                for key in keys:
                    if key is not None and key not in table.columns:
                        raise ConfigError(f"{option}: {key!r} is not a column of the sweep's results "
                                       f"({', '.join(map(str, table.columns))})")
            try:
                plot_sweep(table, args.output, x=args.x, hue=args.hue, metrics=args.metric)  # None: default_metrics
            except OSError as error:
                raise SimError(f"-o: cannot write '{args.output}': {error.strerror or error}") from None
    except SimError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
