"""``sim calibrate``: microbenchmark this machine into a profile for ``costs: calibrated``.

In: the parsed arguments (``-o``, ``--device``, ``--quick``, ``--procs``, ``--no-collectives``, the layer's GEMM
shapes from ``--model`` / ``--tp`` / ``--micro-batch`` / ``--seq-len`` or ``--scenario``). Out: ``-o DIR``'s
profile.json and measurements (``sim.calibrate.run``), and a table of what was measured. ``--from-nccl-tests LOG...``
(or ``import-nccl-tests LOG...``) fits the link tiers from a user's logs instead (``sim.cli.ecosystem``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.ecosystem import cmd_import_nccl_tests
from sim.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console


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
    from sim.model.presets import MODEL_PRESETS
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
