"""Consistency of tests/data/moe_published_runs.csv, the published MoE training runs (issue 23, must-show 4).

Each row is one configuration as its source publishes it (docs/validation/moe_sources.md). These tests check the
transcription, not the simulator: the parallel degrees multiply to the GPU count on both the dense grid
(tp x cp x dp x pp) and Megatron-Core's folded expert grid (etp x ep x edp x pp), the global batch splits into
micro-batches over dp, the pipeline split is whole, and where a source prints both a step time and TFLOPS/GPU the
two agree under the FLOP count the source's framework logged (Megatron-LM ``num_floating_point_operations``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

CSV = Path(__file__).parent / "data" / "moe_published_runs.csv"
USES = {"fit", "validation", "info"}
# The peak the MoE Parallel Folding paper divides by for MFU (Sec. 4.1: "a peak half-precision throughput of 989.5
# TFLOP/s"), the H100 SXM dense BF16 peak.
H100_BF16_PEAK_TFLOPS = 989.5
DEGREES = ["tp", "pp", "vpp", "ep", "etp", "cp", "dp", "edp"]

# Model shapes the FLOP check needs, from the Megatron-MoE-ModelZoo model configs the rows ran
# (model_configs/benchmarking/<model>.yaml, commit e8650517d60d) and the HF config.json of each model;
# padded vocabularies as Megatron pads them (make_vocab_size_divisible_by x tp).
SHAPES = {
    # Qwen3-235B-A22B: 94 layers, h 4096, 64 heads of 128, 4 query groups, 128 experts top-8 of 1536,
    # no dense or shared-expert layers; vocab 151669 padded to a multiple of 1187*tp -> 151936 (tp 2 and 4).
    "qwen3-235b-a22b": dict(layers=94, hidden=4096, heads=64, groups=4, kv_channels=128, moe_ffn=1536,
                            topk=8, experts=128, vocab=151936, pipeline_slots=96),
    # Mixtral 8x7B: 32 layers, h 4096, 32 heads, 8 groups, 8 experts top-2 of 14336, vocab 32000.
    "mixtral-8x7b": dict(layers=32, hidden=4096, heads=32, groups=8, kv_channels=128, moe_ffn=14336,
                         topk=2, experts=8, vocab=32000, pipeline_slots=32),
    # Mixtral 8x22B: 56 layers, h 6144, 48 heads, 8 groups, 8 experts top-2 of 16384, vocab 32000.
    "mixtral-8x22b": dict(layers=56, hidden=6144, heads=48, groups=8, kv_channels=128, moe_ffn=16384,
                          topk=2, experts=8, vocab=32000, pipeline_slots=56),
}


def megatron_flops_per_token(shape: dict[str, int], seq_len: int, formula: str) -> float:
    """Model FLOPs per token of one training step (forward + backward), as Megatron-LM logs them.

    In: a model shape of ``SHAPES``, the sequence length and the row's ``flop_formula``. Out: FLOPs per token.
    Megatron-LM megatron/training/training.py ``num_floating_point_operations`` (``transformer_flops``): every
    GEMM counted 3x (forward, dgrad, wgrad) x 2 (FMA); SwiGLU experts 3 GEMMs of h x moe_ffn per routed expert;
    QKV + output projections; the logit GEMM; core attention ``QK^T`` and ``PV``. Since commit 8873b55d6a
    (2025-03-06, 'megatron_2025_03_causal') core attention counts half the score matrix (causal mask); before it
    ('megatron_pre_2025_03', the MCore v0.8/v0.9 README numbers) the full matrix.
    """
    h, q = shape["hidden"], shape["kv_channels"] * shape["heads"]
    kv = shape["kv_channels"] * shape["groups"]
    linear = 6 * h * (3 * shape["moe_ffn"] * shape["topk"]) * shape["layers"]
    linear += 6 * (h * (q + 2 * kv) + q * h) * shape["layers"]
    linear += 6 * h * shape["vocab"]
    causal = {"megatron_2025_03_causal": 0.5, "megatron_pre_2025_03": 1.0}[formula]
    core = 6 * q * 2 * causal * seq_len * shape["layers"]
    return linear + core


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return pd.read_csv(CSV)


def _full_layout(row: pd.Series) -> bool:
    return all(pd.notna(row[c]) for c in ["num_gpus", *DEGREES])


def test_every_row_is_sourced_and_classified(runs: pd.DataFrame) -> None:
    assert runs["id"].is_unique
    assert set(runs["use"]) <= USES
    for column in ["source", "location", "metric_as_published", "model", "gpu"]:
        blank = runs[runs[column].isna() | (runs[column].astype(str).str.strip() == "")]
        assert blank.empty, f"rows without {column}: {list(blank['id'])}"
    assert runs["source"].str.startswith("https://").all()


def test_validation_rows_are_complete(runs: pd.DataFrame) -> None:
    """A validation row has a whole layout, batch, precision, a published metric and its scenario file name."""
    validation = runs[runs["use"] == "validation"]
    assert len(validation) >= 8
    for _, row in validation.iterrows():
        assert _full_layout(row), row["id"]
        assert pd.notna(row["micro_batch"]) and pd.notna(row["global_batch"]) and pd.notna(row["seq_len"]), row["id"]
        assert row["precision"] in {"bf16", "fp8"}, row["id"]
        assert row["gpu"] in {"H100-SXM", "H800"}, row["id"]
        metrics = ["tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s", "mfu"]
        assert any(pd.notna(row[m]) for m in metrics), row["id"]
        assert str(row["scenario"]).endswith(".yaml"), row["id"]
        assert row["flop_formula"] in {"megatron_2025_03_causal", "megatron_pre_2025_03"}, row["id"]
    assert validation["scenario"].is_unique


def test_degrees_multiply_to_the_gpu_count(runs: pd.DataFrame) -> None:
    """Megatron-Core builds two rank grids of one world size (parallel_state.initialize_model_parallel):
    dense tp-cp-dp-pp and expert etp-ep-edp-pp (MoE parallel folding), sharing the pipeline groups."""
    checked = 0
    for _, row in runs.iterrows():
        n = row["num_gpus"]
        if pd.notna(n) and all(pd.notna(row[c]) for c in ["tp", "pp", "cp", "dp"]):
            assert row["tp"] * row["pp"] * row["cp"] * row["dp"] == n, row["id"]
            checked += 1
        if pd.notna(n) and all(pd.notna(row[c]) for c in ["etp", "ep", "edp", "pp"]):
            assert row["etp"] * row["ep"] * row["edp"] * row["pp"] == n, row["id"]
    assert checked >= 20


def test_batches_split_into_micro_batches(runs: pd.DataFrame) -> None:
    for _, row in runs.dropna(subset=["global_batch", "micro_batch", "dp"]).iterrows():
        assert row["global_batch"] % (row["micro_batch"] * row["dp"]) == 0, row["id"]


def test_experts_and_layers_divide(runs: pd.DataFrame) -> None:
    """ep divides the expert count; the pipeline slots (layers, plus embedding and loss where the run accounts
    for them: --account-for-embedding/loss-in-pipeline-split) split evenly over pp x vpp."""
    for _, row in runs.iterrows():
        shape = SHAPES.get(row["model"])
        if shape is None or pd.isna(row["ep"]) or pd.isna(row["pp"]):
            continue
        assert shape["experts"] % row["ep"] == 0, row["id"]
        vpp = 1 if pd.isna(row["vpp"]) else row["vpp"]
        assert shape["pipeline_slots"] % (row["pp"] * vpp) == 0, row["id"]


def test_step_time_and_tflops_agree(runs: pd.DataFrame) -> None:
    """Where a source prints both, TFLOPS/GPU = FLOPs per token x global batch x seq / (step time x GPUs):
    the Qwen3-235B-A22B H100 table agrees within 0.6% (the step times have three significant digits)."""
    both = runs.dropna(subset=["step_time_s", "tflops_per_gpu"])
    both = both[both["model"].isin(SHAPES.keys())]
    assert len(both) >= 5
    for _, row in both.iterrows():
        flops = megatron_flops_per_token(SHAPES[row["model"]], int(row["seq_len"]), row["flop_formula"])
        tflops = flops * row["global_batch"] * row["seq_len"] / (row["step_time_s"] * row["num_gpus"]) / 1e12
        assert tflops == pytest.approx(row["tflops_per_gpu"], rel=0.006), row["id"]


def test_mfu_and_tflops_agree(runs: pd.DataFrame) -> None:
    """Rows printing both (the MoE Parallel Folding paper's Table 2 TFLOPS beside Table 3's MFU) agree on the
    989.5 TFLOP/s peak within 0.1%: 458.3 / 989.5 = 46.32%, 487.7 / 989.5 = 49.29%."""
    both = runs.dropna(subset=["mfu", "tflops_per_gpu"])
    assert len(both) >= 2
    for _, row in both.iterrows():
        assert row["tflops_per_gpu"] / H100_BF16_PEAK_TFLOPS == pytest.approx(row["mfu"], rel=1e-3), row["id"]


def test_flop_formula_choice_matters() -> None:
    """The causal halving is 4% of a Mixtral 8x7B token at 4096: the rows must say which count they used."""
    shape = SHAPES["mixtral-8x7b"]
    old = megatron_flops_per_token(shape, 4096, "megatron_pre_2025_03")
    new = megatron_flops_per_token(shape, 4096, "megatron_2025_03_causal")
    assert old / new - 1 == pytest.approx(0.0404, abs=0.001)


def test_tokens_and_tflops_agree_within_a_source(runs: pd.DataFrame) -> None:
    """Rows of one model and source that print tokens/s and TFLOPS imply the same FLOPs per token."""
    both = runs.dropna(subset=["tokens_per_s_per_gpu", "tflops_per_gpu"])
    assert len(both) >= 2
    for _, group in both.groupby(["source", "model"]):
        per_token = group["tflops_per_gpu"] * 1e12 / group["tokens_per_s_per_gpu"]
        assert per_token.max() / per_token.min() - 1 < 0.005
        # Qwen3-30B-A3B: ~3.3B active parameters -> 6N ~ 2.0e10; attention at the run's (unstated)
        # sequence length adds the rest; a sanity band, not a formula.
        assert 1.9e10 < per_token.mean() < 2.6e10
        assert math.isfinite(per_token.mean())


MOE_FOLDER = Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "moe"


def test_moe_scenarios_match_their_rows(runs: pd.DataFrame) -> None:
    """Every validation row has its scenario in scenarios/validation/moe/ (read as plain YAML: they load once
    issue 23's EP fields land) with the row's layout and batch, and a line in that folder's published.csv whose
    iteration time is the published step time, or the TFLOPS turned into one with the row's FLOP count."""
    import yaml

    published = pd.read_csv(MOE_FOLDER / "published.csv").set_index("scenario")
    validation = runs[runs["use"] == "validation"]
    assert set(published.index) == set(validation["scenario"])
    assert {p.name for p in MOE_FOLDER.glob("*.yaml")} == set(validation["scenario"])
    for _, row in validation.iterrows():
        doc = yaml.safe_load((MOE_FOLDER / row["scenario"]).read_text())
        cluster, parallel, training = doc["cluster"], doc["parallel"], doc["training"]
        assert cluster["nodes"] * cluster["gpus_per_node"] == row["num_gpus"], row["id"]
        for key in ["tp", "pp", "dp", "ep", "etp"]:
            assert parallel[key] == row[key], (row["id"], key)
        assert parallel.get("vpp", 1) == row["vpp"], row["id"]
        assert (training["global_batch"], training["micro_batch"], training["seq_len"]) == (
            row["global_batch"], row["micro_batch"], row["seq_len"]), row["id"]
        assert training["dtype"] == row["precision"], row["id"]
        assert doc["model"] == row["model"], row["id"]
        seconds = published.loc[row["scenario"], "iteration_time_s"]
        if pd.notna(row["step_time_s"]):
            assert seconds == row["step_time_s"], row["id"]
        else:
            flops = megatron_flops_per_token(SHAPES[row["model"]], int(row["seq_len"]), row["flop_formula"])
            tflops = row["tflops_per_gpu"] if pd.notna(row["tflops_per_gpu"]) else row["mfu"] * H100_BF16_PEAK_TFLOPS
            expected = flops * row["global_batch"] * row["seq_len"] / (tflops * 1e12 * row["num_gpus"])
            assert seconds == pytest.approx(expected, rel=1e-4), row["id"]
    # Mixtral 8x7B, 438 TFLOPS under the 2024 count: 82.93 GFLOP/token x 256 x 4096 / (438e12 x 64) = 3.10 s.
    assert published.loc["mcore08-mixtral-8x7b-h100-64.yaml", "iteration_time_s"] == pytest.approx(3.102, abs=1e-3)
