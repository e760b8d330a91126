"""Plots of a sweep's results table.

In: the results DataFrame of ``sim sweep`` (sim.explore.sweep: one row per point, swept keys as columns, ``status``,
metrics), a swept key for the x axis, optionally one for the lines (hue), and the metrics to show. Out: an
image with one panel per metric, one line per hue value; points that are not ``ok``/``oom`` (invalid, error)
are left out and counted in the legend, ``oom`` points are drawn hollow.

``write_sweep_plot`` is the ``clustersim.sweep_outputs`` entry point: after ``sim sweep`` it writes
``DIR/sweep.png`` with step time, bubble fraction and MFU against the first numeric swept key, one line per
value of the next swept key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

LABELS = {"step_time_s": "step time (s)", "bubble_fraction": "bubble fraction", "mfu": "MFU",
          "tokens_per_s": "tokens/s", "peak_memory_bytes": "peak memory (bytes)",
          "bubble_rate_stagewise": "bubble rate (per stage)"}


def plot_sweep(table: pd.DataFrame, path: Path | str, x: str, hue: str | None = None,
               metrics: Sequence[str] = ("step_time_s", "bubble_fraction", "mfu"), title: str | None = None) -> Path:
    path = Path(path)
    usable = table[table["status"].isin(["ok", "oom"])]
    groups = list(usable.groupby(hue, sort=False)) if hue else [("all", usable)]
    fig = Figure(figsize=(6 * len(metrics), 4.2))  # no pyplot: the user's backend is left alone
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for label, rows in groups:
            rows = rows.sort_values(x)
            same = (table[hue] == label) if hue else pd.Series(True, index=table.index)
            skipped = int((same & ~table["status"].isin(["ok", "oom"])).sum())
            name = f"{label}" + (f" ({skipped} invalid)" if skipped else "")
            line, = ax.plot(rows[x], rows[metric], marker="o", markersize=3, label=name)
            oom = rows[rows["status"] == "oom"]
            if len(oom):
                ax.plot(oom[x], oom[metric], "o", markersize=6, markerfacecolor="none", color=line.get_color())
        ax.set_xlabel(x)
        ax.set_ylabel(LABELS.get(metric, metric))
        ax.grid(linewidth=0.3, alpha=0.6)
    axes[0][0].legend(fontsize=8, title=hue)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def write_sweep_plot(out: Path, table: pd.DataFrame, axes: list[str]) -> Path | None:
    """``sim sweep`` plugin: ``DIR/sweep.png``, x = the first numeric swept key, lines = the next one."""
    numeric = [a for a in axes if a in table and pd.api.types.is_numeric_dtype(table[a])]
    if not numeric:
        return None
    x = numeric[0]
    hue = next((a for a in axes if a != x and a in table), None)
    return plot_sweep(table, Path(out) / "sweep.png", x=x, hue=hue, title=f"{len(table)} points")
