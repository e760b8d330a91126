"""Write the validation set's zero-bubble rows (Qi et al. ICLR 2024, Tables 3 + 4) as scenarios.

In: the reference table of Qi et al.'s measured throughput and memory (a CSV with the columns of the team's
``zero_bubble_qi2024_throughput_memory.csv``; a developer input, never read at run or test time). Out: one
``scenarios/validation/qi2024-*.yaml`` per 1F1B, ZB-1p and ZB-2p row, and their rows appended to
``scenarios/validation/published.csv`` (iteration time = micro-batches x micro-batch / (samples/s per GPU x
GPUs), since dp = 1; peak memory as published). 1F1B-I rows are left out: one layer per chunk on stages with
one layer fewer is an uneven interleaving the model does not express.

Mapping (each scenario's header repeats it): GPT-style layers (LayerNorm, GELU MLP of ffn_hidden_size, biases,
learned positions, untied embeddings as in the authors' scripts), fp16, no recomputation, no flash attention
(the published 1F1B peak memory, e.g. 30 GB for 1.5B, matches the full s x s attention activations, not
FlashAttention's), vocabulary 32000 (not stated; the authors' sample tokenizer), the first and last stage one
layer fewer (the paper's note), and the A100 node preset's network (the paper says RoCE, without a rate).
ZB-1p and ZB-2p are the paper's automatically searched schedules under 1x and 2x 1F1B's activation memory;
they run here as the handcrafted ZB-H1 and ZB-H2 of the same paper, which have those memory limits.

Usage: python scripts/make_zero_bubble_validation.py PATH/TO/zero_bubble_qi2024_throughput_memory.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import yaml

FOLDER = Path(__file__).resolve().parent.parent / "scenarios" / "validation"
SCHEDULES = {"1F1B": "1f1b", "ZB-1p": "zb-h1", "ZB-2p": "zb-h2"}
GROUP = "Zero bubble (Qi et al. 2024)"


def scenario(row: pd.Series) -> tuple[str, dict, str]:
    layers, pp = int(row["num_layers"]), int(row["pipeline_parallel"])
    middle = (layers + 2) // pp  # the first and last stage hold one layer fewer
    schedule = SCHEDULES[row["schedule"]]
    name = f"qi2024-{row['model'].lower()}-{row['schedule'].lower()}-m{int(row['num_microbatches'])}"
    data = {
        "name": name,
        "cluster": {"gpu": "A100-80GB-SXM", "nodes": int(row["num_gpus"]) // 8, "gpus_per_node": 8},
        "model": {"name": f"qi2024-{row['model']}", "num_layers": layers, "hidden_size": int(row["hidden_size"]),
                  "num_attention_heads": int(row["attention_heads"]),
                  "ffn_hidden_size": int(row["ffn_hidden_size"]), "vocab_size": 32000,
                  "max_seq_len": int(row["seq_len"]), "tied_embeddings": False},
        "training": {"microbatches": int(row["num_microbatches"]), "micro_batch": int(row["micro_batch_size"]),
                     "seq_len": int(row["seq_len"]), "dtype": "fp16", "recompute": "none",
                     "flash_attention": False},
        "parallel": {"tp": 1, "pp": pp, "dp": 1, "first_stage_layers": middle - 1, "last_stage_layers": middle - 1},
        "schedule": schedule,
    }
    header = ("# yaml-language-server: $schema=../scenario.schema.json\n"  # the editor's schema (sim schema)
              f"# Qi et al. ICLR 2024 (arXiv:2401.10241) Tables 3 + 4: {row['model']} ({layers} layers) with "
              f"{row['schedule']} on {int(row['num_gpus'])} A100 80GB, pp {pp}, micro-batch "
              f"{int(row['micro_batch_size'])}, {int(row['num_microbatches'])} micro-batches.\n"
              f"# Published {row['samples_per_gpu_per_s']} samples/s per GPU, peak memory {row['peak_memory_GB']} GB."
              f" Mapping: scripts/make_zero_bubble_validation.py"
              f"{' (ZB-1p runs as ZB-H1)' if schedule == 'zb-h1' else ''}"
              f"{' (ZB-2p runs as ZB-H2)' if schedule == 'zb-h2' else ''}.\n")
    return name + ".yaml", data, header


def main(source: str) -> None:
    table = pd.read_csv(source)
    table = table[table["schedule"].isin(list(SCHEDULES))]
    rows = []
    for _, row in table.iterrows():
        filename, data, header = scenario(row)
        (FOLDER / filename).write_text(header + yaml.safe_dump(data, sort_keys=False))
        samples = float(row["samples_per_gpu_per_s"])
        step = int(row["num_microbatches"]) * int(row["micro_batch_size"]) / (samples * int(row["num_gpus"]))
        rows.append({"scenario": filename, "group": GROUP, "iteration_time_s": round(step, 6), "mfu": None,
                     "tokens_per_s_per_gpu": samples * int(row["seq_len"]),
                     "peak_memory_gb": float(row["peak_memory_GB"]),
                     "source": f"{row['source']}, {row['table']}",
                     "notes": "iteration time = m x micro-batch / (samples/s per GPU x GPUs); " + str(row["notes"])})
    published = pd.read_csv(FOLDER / "published.csv")
    published = published[published["group"] != GROUP]
    pd.concat([published, pd.DataFrame(rows)]).to_csv(FOLDER / "published.csv", index=False)
    print(f"wrote {len(rows)} scenarios and their published rows to {FOLDER}")


if __name__ == "__main__":
    main(sys.argv[1])
