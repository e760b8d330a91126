"""``sim validate``: the validation set run, predicted against published, row by row.

In: the parsed arguments (the folder of scenarios + ``published.csv``, default ``scenarios/validation``; ``--only``,
``--set`` applied to every scenario; ``-o``). Out: the table of predicted vs published iteration time and MFU and
the error statistics (``sim.validation.validate.error_stats``) on the console; with ``-o``, ``validation.csv`` and
what the ``clustersim.validate_outputs`` plugins write; exit code 1 when a row failed to run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.plugins import VALIDATE_PLUGINS, plugins

if TYPE_CHECKING:
    from rich.console import Console


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
        for write in plugins(VALIDATE_PLUGINS):
            write(args.output, table)
        console.print(f"wrote {args.output}/: " + ", ".join(sorted(p.name for p in Path(args.output).iterdir())))
    return 1 if (table["error"] != "").any() else 0
