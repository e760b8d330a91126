"""Gantt charts of several pipeline schedules for the same scenario, stacked on one page.

In: a scenario path and a list of variants (a label and ``--set`` overrides each; by default GPipe, 1F1B,
interleaved 1F1B with 2 chunks, ZB-H1, ZB-H2 and ZB-V). Out: one image, one panel per variant with the compute
lane of every stage, sharing the time axis, each titled with its step time, bubble fraction (and host-bound
share, where non-zero: ``analysis.gantt.bubble_text``) and peak activations in flight, like the figures of
Narayanan et al. (2021) and Qi et al. (2024).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.chart_file import chart_path
from analysis.gantt import COLORS, bubble_text, compute_blocks
from sim import runner
from sim.spec.scenario import load_scenario

DEFAULT_VARIANTS: list[tuple[str, list[str]]] = [
    ("GPipe", ["schedule=gpipe"]),
    ("1F1B", ["schedule=1f1b"]),
    ("interleaved 1F1B (v=2)", ["schedule=interleaved", "parallel.vpp=2"]),
    ("ZB-H1", ["schedule=zb-h1"]),
    ("ZB-H2", ["schedule=zb-h2"]),
    ("ZB-V (V-shaped, 2 chunks per stage)", ["schedule=zb-v", "parallel.vpp=2"]),
]


def compare_schedules(scenario_path: Path | str, path: Path | str,
                      variants: Sequence[tuple[str, list[str]]] = DEFAULT_VARIANTS) -> Path:
    path = chart_path(path)  # before the runs: a name Matplotlib cannot write is refused first
    runs = [(label, runner.run(load_scenario(scenario_path, overrides))) for label, overrides in variants]
    end = max(result.summary.step_time_s for _, result in runs)
    stages = max(result.scenario.parallel.pp for _, result in runs)
    fig = Figure(figsize=(14, 1.0 + 0.42 * stages * len(runs)))  # no pyplot: the user's backend is left alone
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)
    for ax, (label, result) in zip(axes[:, 0], runs, strict=True):
        trace = result.trace
        compute = trace[(trace["stream"] == "compute") & (trace["kind"] != "optimizer")]
        for stage, rows in compute.groupby("stage"):
            blocks = compute_blocks(rows, min_gap=end / 1500)
            for kind, part in blocks.groupby("kind"):
                spans = list(zip(part["start_s"], part["end_s"] - part["start_s"], strict=True))
                ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=COLORS[str(kind)], edgecolor="white",
                               linewidth=0.5)
            for row in blocks.itertuples(index=False):
                ax.text((row.start_s + row.end_s) / 2, stage, str(row.microbatch), ha="center", va="center",
                        fontsize=6, color="white")
        s = result.summary
        in_flight = max(m["activations"] for m in s.memory_breakdown_bytes.values())
        ax.set_title(f"{label}: step {s.step_time_s * 1e3:.1f} ms, {bubble_text(s)} "
                     f"(per stage {s.bubble_rate_stagewise:.1%}), peak activations {in_flight / 2**20:.0f} MiB",
                     fontsize=9, loc="left")
        ax.set_yticks(range(stages))
        ax.set_yticklabels([f"stage {i}" for i in range(stages)], fontsize=7)
        ax.set_ylim(stages - 0.5, -0.5)
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    axes[-1, 0].set_xlim(0, end)
    axes[-1, 0].set_xlabel("time (s)")
    kinds = ("forward", "backward", "weight")
    axes[0, 0].legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="lower right",
                      bbox_to_anchor=(1.0, 1.15), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=140)
    return Path(path)
