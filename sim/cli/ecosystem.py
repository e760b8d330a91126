"""The commands that connect clustersim to the tools users already have (issue 26): ``sim import`` (a scenario
from a Megatron-LM / NeMo / DeepSpeed / TorchTitan launch configuration), ``sim search --emit`` (each top layout's
launch flags), ``sim calibrate --from-nccl-tests`` (a user's nccl-tests logs into a profile's link tiers) and
``sim compare-trace`` (a torch.profiler trace against a simulated step, through the ``clustersim.commands``
entry point analysis registers: ``sim`` never imports ``analysis``).

In: the parsed arguments (``sim.cli.commands.parser``). Out: the files each command writes, its table on the
console, the exit code. Like every command, each imports what it needs inside its function (start-up, issue 25).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cli.plugins import command_plugin
from sim.cli.run import run_and_write  # the run command's own path
from sim.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

def cmd_compare_trace(args: argparse.Namespace, console: Console) -> int:
    """``sim compare-trace PROFILER.json SCENARIO``: run the scenario into ``-o`` (as ``sim run --no-plot``), then
    hold the torch.profiler trace against its simulated step per kernel class (the ``compare-trace`` command
    plugin, analysis.profile_compare.compare_trace), printing the table and writing ``--table`` / ``--chart``."""
    compare = command_plugin("compare-trace")  # first: without analysis nothing is run
    steps = None
    if args.steps:
        try:
            steps = [int(step) for step in args.steps.split(",")]
        except ValueError:
            raise ConfigError(f"--steps: {args.steps!r} is not a list of step numbers, e.g. 5,6") from None
    if not Path(args.profiler).is_file():
        raise ConfigError(f"compare-trace: profiler trace {args.profiler!r} not found")
    run_args = argparse.Namespace(**vars(args), format="parquet", chrome=False, link_timeline=False, no_plot=True,
                                  fail_on_oom=False)
    run_and_write(run_args, console, None)
    markdown, written = compare(args.profiler, args.output, rank=args.rank, device=args.device, steps=steps,
                                table=args.table, chart=args.chart)
    console.print(markdown, markup=False, highlight=False, soft_wrap=True)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    return 0


IMPORT_FRAMEWORKS = ("megatron", "nemo", "deepspeed", "torchtitan")
EMIT_FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")
# The layouts each framework can launch (sim.interop.emit refuses the rest): Megatron-LM's distributed optimizer is
# ZeRO-1 and its schedules 1F1B and interleaved 1F1B; TorchTitan shards with FSDP2 (ZeRO-2/3) or replicates (DDP);
# a DeepSpeed run under the HF Trainer is data-parallel only, with HF gradient checkpointing (full) or none.
EMIT_LIMITS = {"megatron": {"zero": "0,1", "schedule": "1f1b,interleaved"},
               "torchtitan": {"zero": "0,2,3", "schedule": "1f1b,gpipe,interleaved,zb-v"},
               "deepspeed": {"tp": "1", "pp": "1", "recompute": "none,full"}}


def emit_layouts(args: argparse.Namespace, console: Console, rows: Any, out: Path) -> None:
    """``sim search --emit FRAMEWORK``: each shown layout's launch configuration under ``out/emit/``, the best
    one's printed; a layout the framework cannot run is named with the knob it lacks."""
    from sim.explore import search
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    base = load_scenario(args.scenario, args.set)
    folder = out / "emit"
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    refused: list[str] = []
    for rank, (_, row) in enumerate(rows.iterrows(), start=1):
        layout = search.layout_of(row.rename({key: name for name, key in search.LAYOUT_KEYS.items()}))
        cp = f"_cp{layout.cp}" if layout.cp > 1 else ""  # dp is the ranks left by tp x cp x pp
        name = f"{rank:02d}_tp{layout.tp}{cp}_pp{layout.pp}_dp{layout.dp}_v{layout.vpp}_mb{layout.micro_batch}"
        try:
            emitted = emit(search.candidate(base, layout), args.emit)
        except ConfigError as error:
            refused.append(f"{name}: {error}")
            continue
        (folder / f"{name}{emitted.suffix}").write_text(emitted.text)
        if not written:
            console.print(f"best layout as {args.emit} ({name}{emitted.suffix}; run with: {emitted.launch}):",
                          markup=False, highlight=False)
            console.print(emitted.text, markup=False, highlight=False)
        written.append(f"{name}{emitted.suffix}")
    console.print(f"wrote {folder}/: {', '.join(written) or 'nothing'}", markup=False, highlight=False)
    for line in refused:
        console.print(f"not expressible in {args.emit}: {line}", markup=False, highlight=False)


def cmd_import(args: argparse.Namespace, console: Console) -> int:
    """``sim import FRAMEWORK INPUT...``: a scenario from a launch configuration, with the report of every flag."""
    import importlib
    from collections import Counter

    import yaml

    from sim.cli.tables import import_table
    from sim.interop.draft import STATUSES, Options

    options = Options(gpu=args.gpu, nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpus=args.gpus,
                      model=args.model, name=args.name)
    if not args.inputs:
        raise ConfigError(f"import {args.framework}: give the configuration (a file, or the arguments)")
    module = importlib.import_module(f"sim.interop.{args.framework}")
    draft = getattr(module, f"import_{args.framework}")(list(args.inputs), options)
    console.print(import_table(draft.rows, f"sim import {args.framework}: what became of each setting"))
    counts = Counter(row.status for row in draft.rows)
    console.print(", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status]))
    scenario = draft.scenario()  # validated before anything is written
    out = Path(args.output)
    header = (f"# Imported by `sim import {args.framework}` from {' '.join(args.inputs)[:200]}\n"
              "# (the command prints what became of every setting); check it with `sim check`.\n")
    out.write_text(header + yaml.safe_dump(draft.data, sort_keys=False))
    console.print(f"wrote {out}: {scenario.name}, {scenario.cluster.num_gpus} GPUs", markup=False, highlight=False)
    return 0


def cmd_import_nccl_tests(args: argparse.Namespace, console: Console) -> int:
    """``sim calibrate --from-nccl-tests LOG...``: the logs' link tiers fitted into DIR/profile.json."""
    from rich.table import Table

    from sim.calibrate.nccl_tests_fit import base_profile, import_logs, node_for
    from sim.calibrate.nccl_tests_log import parse
    from sim.costs import profile as profiles

    output = Path(args.output)
    logs = [parse(path) for path in args.from_nccl_tests]
    node = node_for(logs, args.node)
    existing = output / "profile.json"
    try:
        base = (profiles.load(args.base) if args.base else profiles.load(existing) if existing.exists()
                else base_profile(logs, args.node))
    except profiles.ProfileError as error:  # a ValueError: one line naming the file, as a scenario's would be
        raise ConfigError(str(error).replace("costs.profile", "--base" if args.base else "-o")) from None
    result = import_logs(logs, base, node, nvls=args.nvls, tier=args.tier,
                         placement="in-place" if args.in_place else "out-of-place")
    table = Table(title="link tiers fitted from nccl-tests", header_style="bold")
    for column in ("tier", "runs", "ranks", "hosts", "busbw max", "plateau busbw", "base latency", "alpha"):
        table.add_column(column, justify="left" if column in ("tier", "runs") else "right")
    for tier in result.tiers:
        table.add_row(tier.tier, ", ".join(tier.ops), ",".join(map(str, tier.n)), str(tier.hosts),
                      f"{tier.measured_busbw / 1e9:,.2f} GB/s",
                      f"{tier.plateau_busbw / 1e9:,.2f} GB/s" + ("" if tier.plateau_fitted else " (kept)"),
                      f"{tier.fit.base_latency * 1e6:.2f} us" + ("" if tier.latency_fitted else " (kept)"),
                      f"{tier.fit.latency * 1e6:.2f} us")
    console.print(table)
    for note in result.skipped:
        console.print(f"skipped {note}")
    output.mkdir(parents=True, exist_ok=True)
    existing.write_text(result.profile.model_dump_json(indent=1) + "\n")
    console.print(f"wrote {existing} (costs: {{model: calibrated, profile: {existing}}})")
    return 0
