"""The validation report: predicted against published iteration time, as markdown and a parity plot.

In: ``sim validate``'s table (``sim.validation.validate.run_validation``: one row per published run). Out:
``DIR/validation.md`` (every row with its iteration-time error, MFU and peak memory where published, then the
mean and maximum absolute error overall and per source, the memory error, and the rows outside the 10% band)
and ``DIR/parity.png`` (predicted against published iteration
time, log-log, the y = x line with a +-10% band, one marker per source). ``write_validation_report`` is the
``clustersim.validate_outputs`` entry point (``sim validate -o DIR``); ``python -m analysis validate``
regenerates ``docs/validation.md`` and ``docs/images/parity.png`` in one command.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.costs.profile import DEFAULT_PROFILE_FOR_GPU, default_for
from sim.validation.mechanisms import MECHANISMS
from sim.validation.validate import error_stats, run_validation

BAND = 0.10  # issue 8: a row fails past 10% iteration-time error


def plot_parity(table: pd.DataFrame, path: Path | str) -> Path:
    ran = table[table["error"].fillna("") == ""]
    fig = Figure(figsize=(7, 6.5))  # no pyplot: the user's backend is left alone
    ax = fig.subplots()
    low = min(ran["published_iteration_time_s"].min(), ran["predicted_iteration_time_s"].min()) / 1.5
    high = max(ran["published_iteration_time_s"].max(), ran["predicted_iteration_time_s"].max()) * 1.5
    line = np.geomspace(low, high, 50)
    ax.fill_between(line, line * (1 - BAND), line * (1 + BAND), color="0.9", label=f"+-{BAND:.0%}")
    ax.plot(line, line, color="0.4", linewidth=1, label="predicted = published")
    for (group, part), marker in zip(ran.groupby("group"), "os^Dv", strict=False):
        for gpu, rows in part.groupby("gpu"):
            ax.scatter(rows["published_iteration_time_s"], rows["predicted_iteration_time_s"], marker=marker, s=40,
                       label=f"{group}, {gpu}", zorder=3)
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="published iteration time (s)",
           ylabel="predicted iteration time (s)")
    stats = error_stats(table)
    ax.set_title(f"clustersim vs published runs: mean |error| {stats['mean_abs']:.1%}, max {stats['max_abs']:.1%}, "
                 f"bias {stats['signed_mean']:+.1%}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


TABLE_HEADER = ["| scenario | role | GPUs | GPU | published s | predicted s | error | MFU published | MFU predicted | "
                "memory published GB | predicted GB | source |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def _row_lines(table: pd.DataFrame) -> list[str]:
    """One markdown table row per published run (a failed one with its one-line error)."""
    lines = []
    for r in table.to_dict("records"):
        if r.get("error"):
            lines.append(f"| {r['scenario']} | {r['role']} | | | {r['published_iteration_time_s']:.3f} | failed: "
                         f"{r['error']} | | | | | | |")
            continue
        mfu = f"{r['published_mfu']:.3f}" if pd.notna(r["published_mfu"]) else ""
        memory = r.get("published_peak_memory_gb")
        memory = f"{memory:.0f} | {r['peak_memory_gib'] * 2**30 / 1e9:.1f}" if pd.notna(memory) else " | "
        lines.append(f"| {r['scenario']} | {r['role']} | {int(r['gpus'])} | {r['gpu']} | "
                     f"{r['published_iteration_time_s']:.3f} | {r['predicted_iteration_time_s']:.3f} | "
                     f"{r['iteration_time_error']:+.1%} | {mfu} | "
                     f"{r['predicted_mfu']:.3f} | {memory} | {r['source']} |")
    return lines


def to_markdown(table: pd.DataFrame, image: str = "parity.png") -> str:
    lines = ["# Validation: predicted against published training runs", "",
             "Regenerate: `python -m analysis validate` (runs `scenarios/validation/`, writes this file and the "
             "plot). Error = predicted / published - 1. Every scenario uses the shipped presets and default "
             "profiles: no per-row tuning.", "", f"![parity plot]({image})", "",
             *TABLE_HEADER]
    lines += _row_lines(table)
    stats = error_stats(table)
    fit = int((table["role"] == "fit").sum()) if "role" in table else 0
    lines += ["", f"Over {stats['rows']:.0f} validation rows: mean absolute error {stats['mean_abs']:.1%}, "
                  f"maximum {stats['max_abs']:.1%}, signed mean {stats['signed_mean']:+.1%} "
                  f"({stats['optimistic_share']:.0%} of rows predicted too short)"
                  + (f"; {fit} rows marked fit are left out (they carry a GPU type's end-to-end factor)." if fit
                     else ".")]
    lines += [f"- {key.split(':')[0]}: mean absolute error {value:.1%}" for key, value in stats.items() if ":" in key]
    if "memory_error" in table and table["memory_error"].notna().any():
        memory = table["memory_error"].dropna().abs()
        lines += [f"- peak memory, {len(memory)} rows where published: mean absolute error {memory.mean():.1%}, "
                  f"maximum {memory.max():.1%}"]
    outside = table[table["iteration_time_error"].abs() > BAND] if "iteration_time_error" in table else table.iloc[0:0]
    if "role" in outside:
        outside = outside[outside["role"] != "fit"]
    if len(outside):
        lines += ["", f"Outside the {BAND:.0%} band: " + ", ".join(
            f"{r.scenario} ({r.iteration_time_error:+.1%})" for r in outside.itertuples())]
    return "\n".join(lines) + "\n"


def moe_markdown(table: pd.DataFrame, folder: str = "scenarios/validation/moe") -> str:
    """The MoE validation rows (issue 23: ``scenarios/validation/moe``), their own group: every row, then the
    signed errors (mean absolute, maximum, bias) over the rows that ran, per source, and the rows outside the band
    or not yet loadable."""
    stats = error_stats(table)
    lines = ["", "## Mixture-of-experts runs", "",
             f"`{folder}` (sources: docs/validation/moe_sources.md), run by `sim validate {folder}` and by "
             "`python -m analysis validate` (`--moe-folder`). Same shipped presets and default profiles, no per-row "
             "tuning; kept apart from the dense statistics above. `tests/test_moe_validation.py` holds each row "
             f"inside the {BAND:.0%} band, or marks it xfail (strict) with the reason.", "", *TABLE_HEADER,
             *_row_lines(table), "",
             f"Over {stats['rows']:.0f} MoE rows that ran: mean absolute error {stats['mean_abs']:.1%}, maximum "
             f"{stats['max_abs']:.1%}, signed mean (bias) {stats['signed_mean']:+.1%} "
             f"({stats['optimistic_share']:.0%} of rows predicted too short)."]
    ran = table[table["iteration_time_error"].notna()] if "iteration_time_error" in table else table.iloc[0:0]
    for group, part in ran.groupby("group"):
        errors = part["iteration_time_error"]
        lines.append(f"- {group}: {len(part)} rows, mean absolute error {errors.abs().mean():.1%}, maximum "
                     f"{errors.abs().max():.1%}, signed mean {errors.mean():+.1%}")
    outside = ran[ran["iteration_time_error"].abs() > BAND]
    if len(outside):
        lines += ["", f"Outside the {BAND:.0%} band: " + ", ".join(
            f"{r.scenario} ({r.iteration_time_error:+.1%})" for r in outside.itertuples())]
    failed = table[table["error"].fillna("") != ""] if "error" in table else table.iloc[0:0]
    if len(failed):
        lines += ["", "Not loadable yet: " + ", ".join(str(name) for name in failed["scenario"])]
    return "\n".join(lines) + "\n"


def calibration_markdown() -> str:
    """The end-to-end factor of every shipped default profile and the rows it was fitted on."""
    lines = ["", "## Calibration", "",
             "One end-to-end factor per GPU type on every kernel's time (and the optimizer step's), the same "
             "procedure for each (`scripts/fit_default_profiles.py`): least squares on the relative time error over "
             "that GPU type's named fit rows. Fit rows are marked `fit` above and left out of every statistic.", "",
             "| profile | GPUs it prices | factor | fitted on |", "|---|---|---|---|"]
    for name in sorted(set(DEFAULT_PROFILE_FOR_GPU.values())):
        gpus = ", ".join(sorted(g for g, p in DEFAULT_PROFILE_FOR_GPU.items() if p == name))
        gpu = next(g for g, p in DEFAULT_PROFILE_FOR_GPU.items() if p == name)
        profile = default_for(gpu)
        assert profile is not None
        lines.append(f"| {name} | {gpus} | {profile.end_to_end_factor:.3f} | {profile.end_to_end_source} |")
    return "\n".join(lines) + "\n"


def mechanism_table(folder: Path | str, baseline: pd.DataFrame) -> pd.DataFrame:
    """Each mechanism of ``sim.validation.mechanisms`` switched off on every validation scenario: the error
    statistics without it, and how much it moves them (with - without)."""
    on = error_stats(baseline)
    rows = []
    for mechanism in MECHANISMS:
        if not mechanism.off:
            nan = float("nan")
            rows.append({"mechanism": mechanism.name, "knob": mechanism.knob, "source": mechanism.source,
                         "note": mechanism.note, "mean_abs_off": nan, "signed_mean_off": nan, "max_abs_off": nan,
                         "moves_mean_abs": nan, "moves_signed_mean": nan})
            continue
        off = error_stats(run_validation(folder, overrides=list(mechanism.off)))
        rows.append({"mechanism": mechanism.name, "knob": mechanism.knob, "source": mechanism.source,
                     "note": mechanism.note, "mean_abs_off": off["mean_abs"], "signed_mean_off": off["signed_mean"],
                     "max_abs_off": off["max_abs"], "moves_mean_abs": on["mean_abs"] - off["mean_abs"],
                     "moves_signed_mean": on["signed_mean"] - off["signed_mean"]})
    return pd.DataFrame(rows)


def mechanisms_markdown(table: pd.DataFrame, baseline: pd.DataFrame) -> str:
    on = error_stats(baseline)
    lines = ["", "## Mechanisms", "",
             "Every modelled mechanism that issue 22 added or kept (`sim/validation/mechanisms.py`), switched off "
             "alone on every validation row (`python -m analysis validate --mechanisms`). With all on: mean |error| "
             f"{on['mean_abs']:.2%}, signed mean {on['signed_mean']:+.2%}. 'Moves' = with it - without it, at the "
             "shipped calibration (the end-to-end factors stay as fitted with every mechanism on).", "",
             "| mechanism | knob (default) | source | mean abs error without | signed mean without | "
             "moves mean abs | moves signed mean |", "|---|---|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        if r["note"] and pd.isna(r["mean_abs_off"]):
            lines.append(f"| {r['mechanism']} | {r['knob']} | {r['source']} | {r['note']} | | | |")
            continue
        lines.append(f"| {r['mechanism']} | {r['knob']} | {r['source']} | {r['mean_abs_off']:.2%} | "
                     f"{r['signed_mean_off']:+.2%} | {r['moves_mean_abs']:+.2%} | {r['moves_signed_mean']:+.2%} |")
    return "\n".join(lines) + "\n"


def write_validation_report(out_dir: Path | str, table: pd.DataFrame, image_dir: Path | str | None = None) -> None:
    out_dir = Path(out_dir)
    image_dir = Path(image_dir) if image_dir is not None else out_dir
    image = plot_parity(table, image_dir / "parity.png")
    relative = Path(image).resolve().relative_to(out_dir.resolve()) if image_dir != out_dir else Path("parity.png")
    (out_dir / "validation.md").write_text(to_markdown(table, relative.as_posix()))
