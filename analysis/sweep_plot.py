"""Plots of a sweep's results table.

In: the results DataFrame of ``sim sweep`` (sim.explore.sweep: one row per point, swept keys as columns, ``status``,
metrics), a swept key for the x axis, optionally one for the lines (hue), and the metrics to show. Out: an
image with one panel per metric, one line per hue value; points that are not ``ok``/``oom`` (invalid, error)
are left out and counted in the legend, ``oom`` points are drawn hollow.

``write_sweep_plot`` is the ``clustersim.sweep_outputs`` entry point: after ``sim sweep`` it writes
``DIR/sweep.png`` with step time, bubble fraction and MFU against the first numeric swept key, one line per
value of the next swept key; where a point waited for the host to issue MoE layer passes (summary.json's
``host_bound_fraction``, split out of the bubble in version 2, docs/summary.md) the host-bound fraction gets
its own panel beside the bubble's (``default_metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis.chart_file import chart_path

LABELS = {"step_time_s": "step time (s)", "bubble_fraction": "bubble fraction", "mfu": "MFU",
          "tokens_per_s": "tokens/s", "peak_memory_bytes": "peak memory (bytes)",
          "bubble_rate_stagewise": "bubble rate (per stage)", "host_bound_fraction": "host-bound fraction"}
METRICS = ("step_time_s", "bubble_fraction", "mfu")


def default_metrics(table: pd.DataFrame) -> tuple[str, ...]:
    """The panels drawn when none are asked for: step time, bubble fraction and MFU, with the host-bound fraction
    after the bubble where any drawn point has one (a table from before summary.json version 2 has no such column,
    and a dense model's is 0 everywhere)."""
    usable = table[table["status"].isin(["ok", "oom"])]
    if "host_bound_fraction" in usable and bool((usable["host_bound_fraction"] > 0).any()):
        return ("step_time_s", "bubble_fraction", "host_bound_fraction", "mfu")
    return METRICS


def plot_sweep(table: pd.DataFrame, path: Path | str, x: str, hue: str | None = None,
               metrics: Sequence[str] | None = None, title: str | None = None) -> Path:
    """Write ``sweep_figure`` to ``path`` (PNG/SVG/PDF by extension)."""
    path = chart_path(path)
    sweep_figure(table, x, hue, metrics, title).savefig(path, dpi=130)
    return path


def sweep_figure(table: pd.DataFrame, x: str, hue: str | None = None, metrics: Sequence[str] | None = None,
                 title: str | None = None) -> Figure:
    """One panel per metric (``default_metrics(table)`` when None), ``metric`` against ``x``, one line per value of
    ``hue``; points neither ``ok`` nor ``oom`` are left out and counted in the legend, ``oom`` ones drawn hollow."""
    metrics = default_metrics(table) if metrics is None else metrics
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
    return fig


def write_sweep_plot(out: Path, table: pd.DataFrame, axes: list[str]) -> Path | None:
    """``sim sweep`` plugin: ``DIR/sweep.png``, x = the first numeric swept key, lines = the next one."""
    numeric = [a for a in axes if a in table and pd.api.types.is_numeric_dtype(table[a])]
    if not numeric:
        return None
    x = numeric[0]
    hue = next((a for a in axes if a != x and a in table), None)
    return plot_sweep(table, Path(out) / "sweep.png", x=x, hue=hue, title=f"{len(table)} points")
