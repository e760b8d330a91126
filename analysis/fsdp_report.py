"""Predicted versus published MFU for the PyTorch FSDP runs of IBM and Meta's blog "Maximizing training
throughput using PyTorch FSDP" (2024), Table 1: Llama-2 7B/13B/34B/70B on 128 A100 and 96 H100.

In: the validation set's FSDP rows (``scenarios/validation/published.csv``, group "PyTorch FSDP ...") and their
scenarios (the same files ``sim validate`` runs: one source for both). Out: a DataFrame and a markdown table,
one row per published run: recomputation, predicted and published MFU and tokens/s per GPU, the relative MFU
error, and the exposed data-parallel communication.

Mapping notes (in each scenario's header too): FSDP FULL_SHARD over every GPU (7B: HYBRID_SHARD, the fms-fsdp
README's "HSDP"), FlashAttention, 2 x 4096-token sequences per GPU and step, the blog's inter-node bandwidth per
node split over its 8 GPUs, PyTorch eager element-wise kernels (the blog lists kernel fusion / torch.compile as
not used); "selective (every n blocks)" checkpointing recomputes every second block; the 34B dimensions are
CodeLlama-34B's (unverified).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sim import runner
from sim.spec.degrees import degrees
from sim.spec.scenario import Scenario, load_scenario
from sim.validation.validate import DEFAULT_FOLDER, published

GROUP = "PyTorch FSDP"


def fsdp_rows(folder: Path | str = DEFAULT_FOLDER) -> pd.DataFrame:
    rows = published(folder)
    return rows[rows["group"].str.startswith(GROUP)].reset_index(drop=True)


def scenario_for(row: pd.Series, folder: Path | str = DEFAULT_FOLDER) -> Scenario:
    return load_scenario(Path(folder) / str(row["scenario"]))


def report(rows: pd.DataFrame | None = None, folder: Path | str = DEFAULT_FOLDER) -> pd.DataFrame:
    rows = fsdp_rows(folder) if rows is None else rows
    out: list[dict[str, Any]] = []
    for _, row in rows.iterrows():
        scenario = scenario_for(row, folder)
        summary = runner.run(scenario).summary
        t = scenario.training
        recompute = t.recompute if t.recompute_num_layers is None else \
            f"{t.recompute} ({t.recompute_num_layers}/{degrees(scenario).layers_per_chunk} layers)"
        out.append({
            "model": scenario.model.name, "gpu": scenario.cluster.gpu.name, "gpus": scenario.cluster.num_gpus,
            "recompute": recompute, "published_mfu": float(row["mfu"]),
            "predicted_mfu": summary.mfu, "mfu_error": summary.mfu / float(row["mfu"]) - 1,
            "published_tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
            "predicted_tokens_per_s_per_gpu": summary.tokens_per_s / scenario.cluster.num_gpus,
            "exposed_dp_s": summary.exposed_comm_s["dp"],
            "step_time_s": summary.step_time_s, "fits_in_memory": summary.fits_in_memory,
        })
    return pd.DataFrame(out)


def to_markdown(table: pd.DataFrame) -> str:
    lines = ["| model | GPU | GPUs | recompute | MFU published | MFU predicted | error | tokens/s/GPU published | "
             "predicted | exposed DP comm |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        lines.append(f"| {r.model} | {r.gpu} | {r.gpus} | {r.recompute} | {r.published_mfu:.2f} | "
                     f"{r.predicted_mfu:.3f} | {r.mfu_error:+.0%} | {r.published_tokens_per_s_per_gpu:.0f} | "
                     f"{r.predicted_tokens_per_s_per_gpu:.0f} | {r.exposed_dp_s * 1e3:.0f} ms |")
    errors = table["mfu_error"].abs()
    lines.append(f"\nMean absolute MFU error {errors.mean():.0%}, maximum {errors.max():.0%} over {len(table)} runs.")
    return "\n".join(lines) + "\n"
