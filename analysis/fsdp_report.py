"""Predicted versus published MFU for the PyTorch FSDP runs of IBM and Meta's blog "Maximizing training
throughput using PyTorch FSDP" (2024), Table 1: Llama-2 7B/13B/34B/70B on 128 A100 and 96 H100.

In: the rows in ``analysis/data/fsdp_ibm_llama2.csv`` (copied from the team's reference data, with their source).
Out: a DataFrame and a markdown table, one row per published run: the scenario we build for it (FSDP
FULL_SHARD over every GPU, FlashAttention, 2 x 4096-token sequences per GPU and step, the inter-node
bandwidth of the blog's cluster per GPU), predicted and published MFU and tokens/s per GPU, and the
relative error.

Mapping notes: "selective (every n blocks)" checkpointing is modelled as full recomputation of every layer
(our recompute modes are per model); the 34B dimensions are CodeLlama-34B's (marked unverified in the data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sim import runner
from sim.config import Scenario, scenario_from_dict

DATA = Path(__file__).resolve().parent / "data" / "fsdp_ibm_llama2.csv"


def scenario_for(row: pd.Series) -> Scenario:
    return scenario_from_dict(scenario_dict(row))


def scenario_dict(row: pd.Series) -> dict[str, Any]:
    """The scenario of one published run, as a dict (also written to ``scenarios/validation/``)."""
    a100 = "A100" in str(row["gpu"])
    gpus = int(row["num_gpus"])
    per_node = 400e9 if a100 else 800e9  # the blog's inter-node bandwidth per node, in bits/s
    recompute = "none" if str(row["activation_checkpointing"]) == "no" else "full"
    return {
        "name": f"ibm-fsdp-{row['model']}-{'a100' if a100 else 'h100'}",
        "cluster": {"gpu": "A100-80GB-SXM" if a100 else "H100-SXM", "nodes": gpus // 8, "gpus_per_node": 8,
                    "inter_node": {"bandwidth": per_node / 8 / 8}},
        "model": {"name": str(row["model"]), "num_layers": int(row["num_layers"]),
                  "hidden_size": int(row["hidden_size"]), "num_attention_heads": int(row["attention_heads"]),
                  "num_kv_heads": int(row["kv_heads"]), "ffn_hidden_size": int(row["ffn_hidden_size"]),
                  "vocab_size": int(row["vocab_size"]), "max_seq_len": int(row["seq_len"]), "mlp": "swiglu",
                  "position_embedding": "rope", "norm": "rmsnorm", "tied_embeddings": False, "bias": False},
        "training": {"microbatches": 1, "micro_batch": int(row["micro_batch_per_gpu"]),
                     "seq_len": int(row["seq_len"]), "recompute": recompute, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "dp": gpus},
        "fsdp": {"sharding": "FULL_SHARD"},
    }


def report(rows: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = pd.read_csv(DATA) if rows is None else rows
    out: list[dict[str, Any]] = []
    for _, row in rows.iterrows():
        scenario = scenario_for(row)
        summary = runner.run(scenario).summary
        tokens = summary["tokens_per_s"] / scenario.num_gpus
        out.append({
            "model": row["model"], "gpu": row["gpu"], "gpus": int(row["num_gpus"]),
            "recompute": scenario.training.recompute, "published_mfu": float(row["MFU"]),
            "predicted_mfu": summary["mfu"], "mfu_error": summary["mfu"] / float(row["MFU"]) - 1,
            "published_tokens_per_s_per_gpu": float(row["tokens_per_sec_per_gpu"]),
            "predicted_tokens_per_s_per_gpu": tokens, "exposed_dp_s": summary["exposed_comm_s"]["dp"],
            "step_time_s": summary["step_time_s"], "fits_in_memory": summary["fits_in_memory"],
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
