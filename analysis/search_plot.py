"""Plot of a layout search: peak memory against step time for every evaluated layout.

In: ``sim search``'s screened table (every layout with its closed-form estimate and status) and its simulated
table (the sweep results of the layouts confirmed by event simulation). Out: ``DIR/search.png``: screened
layouts as small points (estimate; grey if they fit, pink if over HBM), simulated ones coloured by pipeline
degree, both axes logarithmic, the best marked, and the
HBM capacity as a line (layouts above it do not fit). ``write_search_plot`` is the ``clustersim.search_outputs``
entry point.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import pandas as pd
from matplotlib.figure import Figure


def plot_search(screened: pd.DataFrame, simulated: pd.DataFrame, path: Path | str,
                hbm_bytes: float | None = None) -> Path:
    fig = Figure(figsize=(9, 6))  # no pyplot: the user's backend is left alone
    ax = fig.subplots()
    fit = screened[screened["status"].isin(["ok", "pruned"])]
    over = screened[screened["status"] == "oom"]
    ax.scatter(over["est_step_time_s"], over["est_peak_memory_bytes"] / 2**30, s=3, c="#f3c1c1",
               label=f"screened, over HBM (estimate), {len(over):,}")
    ax.scatter(fit["est_step_time_s"], fit["est_peak_memory_bytes"] / 2**30, s=4, c="0.6",
               label=f"screened, fits (estimate), {len(fit):,}")
    ok = simulated[simulated["status"].isin(["ok", "oom"])]
    if len(ok):
        points = ax.scatter(ok["step_time_s"], ok["peak_memory_bytes"] / 2**30, s=10, c=ok["parallel.pp"],
                            cmap="viridis", norm=matplotlib.colors.LogNorm(), label=f"simulated, {len(ok):,}")
        fig.colorbar(points, ax=ax, label="pp")
        top = ok.sort_values("step_time_s").iloc[0]
        ax.scatter([top["step_time_s"]], [top["peak_memory_bytes"] / 2**30], s=120, marker="*", c="red",
                   label=(f"best: tp {top['parallel.tp']} pp {top['parallel.pp']} dp {top['parallel.dp']} "
                          f"{top['schedule']} ZeRO-{top['parallel.zero']}"))
    if hbm_bytes:
        ax.axhline(hbm_bytes / 2**30, color="black", linestyle="--", linewidth=1, label="HBM")
    ax.set_xscale("log")
    ax.set_yscale("log")  # memory spans 10 GiB to terabytes across the space
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.set_title("layout search: memory against step time")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def write_search_plot(out: Path, screened: pd.DataFrame, simulated: pd.DataFrame) -> None:
    fits = screened[screened["status"] == "ok"]["est_peak_memory_bytes"]
    hbm = None
    if "hbm_capacity_bytes" in screened:
        hbm = float(screened["hbm_capacity_bytes"].iloc[0])
    plot_search(screened, simulated, out / "search.png", hbm if hbm else (float(fits.max()) if len(fits) else None))
