"""The layout search's answer for one scenario, as a markdown table for ``docs/scale.md``.

In: a scenario (default: the bundled GPT-3 175B on 1024 A100, global batch 1536) and ``sim search``'s options.
Out: markdown: the screen's counts (valid / over HBM / invalid), then the best simulated layouts, each with what
sets its step: compute (with recomputation), pipeline bubble (and, for a MoE whose token dispatcher syncs the
host, the share of the step the compute stream waits for the host to issue a layer pass: summary.json's
``host_bound_fraction``, docs/summary.md), and the exposed TP, PP and DP (MoE: EP) communication the trace
measured, its MFU and peak memory. ``python -m analysis search-report -o docs/search_175b.md`` regenerates
it; the prose that explains the ranking by validated mechanisms lives in ``docs/scale.md``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from sim.explore.search import run_search

SCENARIO = Path("scenarios") / "gpt3-175b_a100-1024.yaml"


def report(scenario: Path | str = SCENARIO, overrides: list[str] | None = None, top: int = 1000,
           show: int = 12) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the screen's table, the best ``show`` simulated layouts) of ``sim search`` with the bound."""
    with tempfile.TemporaryDirectory() as folder:
        result = run_search(Path(scenario), list(overrides or []), Path(folder), top=top)
    return result.screened, result.simulated.head(show)


def _layout(row: pd.Series, moe: bool) -> str:
    text = f"tp {row['parallel.tp']} pp {row['parallel.pp']} dp {row['parallel.dp']}"
    if row["schedule"] == "interleaved":
        text += f" v {row['parallel.vpp']}"
    # MoE only: expert parallel and expert TP degrees (a dense model's rows carry ep 1, etp 1, which say nothing)
    if moe and pd.notna(row.get("parallel.ep")) and row.get("parallel.ep"):
        text += f" ep {int(row['parallel.ep'])} etp {int(row['parallel.etp'])}"
    return text


def to_markdown(screened: pd.DataFrame, best: pd.DataFrame, title: str = "") -> str:
    counts = screened["status"].str.split(":").str[0].value_counts()
    moe = "exposed_ep_s" in best and bool((best["exposed_ep_s"] > 0).any())
    # host-bound: shown where a layout waited for the host (MoE behind a host sync); a dense search's rows are all 0
    host = "host_bound_fraction" in best and bool((best["host_bound_fraction"] > 0).any())
    lines = [f"### {title}" if title else "", "",
             f"{len(screened):,} layouts screened: {counts.get('ok', 0) + counts.get('pruned', 0):,} fit "
             f"({counts.get('pruned', 0):,} of them skipped by the lower bound), {counts.get('oom', 0):,} over HBM, "
             f"{counts.get('invalid', 0):,} invalid. Best simulated:", "",
             "| # | layout | mb | schedule | ZeRO | recompute | SP | step s | MFU | bubble | "
             + ("host-bound | " if host else "") + "exposed TP s | exposed PP s | exposed DP s | "
             + ("exposed EP s | " if moe else "") + "peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if host else "")
             + ("---|" if moe else "")]
    for i, row in enumerate(best.to_dict("records"), 1):
        sp = "yes" if row["parallel.sequence_parallel"] else "no"
        lines.append(
            f"| {i} | {_layout(pd.Series(row), moe)} | {row['training.micro_batch']} | {row['schedule']} | "
            f"{row['parallel.zero']} | {row['training.recompute']} | {sp} | "
            f"{row['step_time_s']:.2f} | {row['mfu']:.1%} | {row['bubble_fraction']:.1%} | "
            + (f"{row['host_bound_fraction']:.1%} | " if host else "")
            + f"{row['exposed_tp_s']:.2f} | {row['exposed_pp_s']:.2f} | {row['exposed_dp_s']:.2f} | "
            + (f"{row['exposed_ep_s']:.2f} | " if moe else "")
            + f"{row['peak_memory_bytes'] / 2**30:.0f} |")
    return "\n".join(lines) + "\n"
