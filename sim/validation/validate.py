"""Predicted against published: the validation set's scenarios run and compared row by row.

In: a folder (default ``scenarios/validation``) holding one scenario YAML per published run and
``published.csv``: one row per scenario with its published iteration time (seconds), MFU, tokens/s per GPU and
peak memory (GB = 1e9 bytes) where the source gives them, the source (paper and table) and notes. Out: a
DataFrame, one row per published run: its role (``validation``, or ``fit``: a row a GPU type's end-to-end
factor was fitted on, ``scripts/fit_default_profiles.py``), predicted and published iteration time, MFU, tokens/s
per GPU and peak memory, the relative errors (predicted / published - 1), and whether it fits; a scenario that
fails to load or run keeps its row with the one-line error and no prediction. ``error_stats`` gives the mean,
maximum and signed mean iteration-time error over the validation rows.
``layer_times`` simulates the 22B layer of Korthikanti et al. 2022 Table 4 (the A100 calibration's target,
shared by its fitting script and its test).

Nothing here is tuned to the validation rows: the scenarios use the shipped presets and default profiles (one
end-to-end calibration per GPU type, fitted on the rows marked fit, see ``scripts/fit_default_profiles.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sim import runner
from sim.errors import ConfigError, SimError
from sim.spec.scenario import load_scenario, scenario_from_dict

DEFAULT_FOLDER = Path("scenarios") / "validation"
PUBLISHED = "published.csv"


def published(folder: Path | str = DEFAULT_FOLDER) -> pd.DataFrame:
    path = Path(folder) / PUBLISHED
    if not path.is_file():
        raise ConfigError(f"validate: no {PUBLISHED} in {str(folder)!r} (one row per scenario: scenario, "
                          "iteration_time_s, mfu, tokens_per_s_per_gpu, source)")
    table = pd.read_csv(path)
    missing = {"scenario", "group", "iteration_time_s", "source"} - set(table.columns)
    if missing:
        raise ConfigError(f"validate: {path} lacks the column(s) {', '.join(sorted(missing))}")
    return table


def _relative(predicted: float | None, reference: Any) -> float | None:
    if predicted is None or reference is None or pd.isna(reference):
        return None
    return predicted / float(reference) - 1


def validate_row(folder: Path, row: pd.Series, overrides: list[str] | None = None) -> dict[str, Any]:
    """One published run against its scenario's simulation (``overrides``: ``a.b=value`` on every scenario)."""
    role = row.get("role")
    out: dict[str, Any] = {"scenario": row["scenario"], "group": row["group"], "source": row["source"],
                           "role": role if isinstance(role, str) and role else "validation",
                           "published_iteration_time_s": float(row["iteration_time_s"]),
                           "published_mfu": row.get("mfu"),
                           "published_tokens_per_s_per_gpu": row.get("tokens_per_s_per_gpu"),
                           "published_peak_memory_gb": row.get("peak_memory_gb")}
    try:
        scenario = load_scenario(folder / str(row["scenario"]), overrides)
        summary = runner.run(scenario).summary
    except SimError as error:
        return {**out, "error": str(error)}
    tokens = summary.tokens_per_s / scenario.cluster.num_gpus
    out.update({"gpus": scenario.cluster.num_gpus, "gpu": scenario.cluster.gpu.name, "predicted_iteration_time_s":
                summary.step_time_s, "predicted_mfu": summary.mfu,
                "predicted_mfu_causal": summary.mfu_causal, "predicted_hfu": summary.hfu,
                "predicted_tokens_per_s_per_gpu": tokens,
                "peak_memory_gib": summary.peak_memory_bytes.max / 2**30,
                "fits_in_memory": summary.fits_in_memory, "error": ""})
    out["iteration_time_error"] = _relative(summary.step_time_s, row["iteration_time_s"])
    out["mfu_error"] = _relative(summary.mfu, row.get("mfu"))
    out["tokens_error"] = _relative(tokens, row.get("tokens_per_s_per_gpu"))
    out["memory_error"] = _relative(summary.peak_memory_bytes.max / 1e9, row.get("peak_memory_gb"))
    return out


def run_validation(folder: Path | str = DEFAULT_FOLDER, only: list[str] | None = None,
                   overrides: list[str] | None = None) -> pd.DataFrame:
    folder = Path(folder)
    rows = published(folder)
    if only:
        unknown = sorted(set(only) - set(rows["scenario"]))
        if unknown:
            raise ConfigError(f"validate --only: {', '.join(unknown)} not in {folder / PUBLISHED}")
        rows = rows[rows["scenario"].isin(only)]
    return pd.DataFrame([validate_row(folder, row, overrides) for _, row in rows.iterrows()])


def error_stats(table: pd.DataFrame, column: str = "iteration_time_error") -> dict[str, float]:
    """Signed and absolute relative error over the validation rows that ran (rows marked ``role: fit`` carry a
    GPU type's end-to-end calibration and are left out): the mean and maximum absolute error, the signed mean
    (the bias: negative = the model predicts shorter steps than measured, an optimist) and the share of rows
    predicted too short; the mean absolute error per group."""
    ran = table[table[column].notna()] if column in table else table.iloc[0:0]
    if "role" in ran:
        ran = ran[ran["role"].fillna("validation") != "fit"]
    errors = ran[column] if len(ran) else pd.Series(dtype=float)
    stats = {"rows": float(len(ran)), "mean_abs": float(errors.abs().mean()) if len(ran) else float("nan"),
             "max_abs": float(errors.abs().max()) if len(ran) else float("nan"),
             "signed_mean": float(errors.mean()) if len(ran) else float("nan"),
             "optimistic_share": float((errors < 0).mean()) if len(ran) else float("nan")}
    for group, part in ran.groupby("group"):
        stats[f"{group}: mean_abs"] = float(part[column].abs().mean())
    return stats


# Korthikanti et al. 2022 Table 4's experiments: (sequence parallel, recompute).
LAYER_EXPERIMENTS = {"Baseline no recompute": (False, "none"), "Sequence Parallelism": (True, "none"),
                     "Baseline with recompute": (False, "full"), "Selective Recompute": (False, "selective"),
                     "Selective + Sequence": (True, "selective")}


def layer_times(sequence_parallel: bool, recompute: str, costs: Any = "roofline") -> tuple[float, float]:
    """(forward, backward) ms of a middle layer of the paper's 22B model (tp 8, micro-batch 4, sequence 2048,
    A100): from its first task to the next layer's first task."""
    trace = runner.run(scenario_from_dict({
        "name": "korthikanti-22b-layer", "cluster": {"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": {"name": "22B", "num_layers": 8, "hidden_size": 6144, "num_attention_heads": 64,
                  "vocab_size": 51200, "max_seq_len": 2048},
        "training": {"microbatches": 1, "micro_batch": 4, "seq_len": 2048, "recompute": recompute},
        "parallel": {"tp": 8, "pp": 1, "dp": 1, "sequence_parallel": sequence_parallel}, "costs": costs,
    })).trace
    compute = trace[trace["stream"] == "compute"]
    first = compute.groupby(["layer", compute["kind"].eq("forward")])["start_s"].min()
    return (first[(4, True)] - first[(3, True)]) * 1e3, (first[(2, False)] - first[(3, False)]) * 1e3
