"""FSDP + PP validation rows (issue 24 must-show 4, FSDP + PP half): TorchTitan's Table 5 (arXiv:2410.06511;
pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md), Llama 3.1 405B on 512 H100 with FSDP 8 x TP 8 x
PP 8, 1F1B and interleaved 1F1B, in ``scenarios/validation/fsdp_pp``. No per-row tuning: a row outside the 10%
band is a strict xfail with the evidence; the interleaved-over-1F1B speedup, which the unmodelled power cap
mostly cancels out of, is asserted inside the band."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.validation_report import BAND
from sim.explore.estimate import estimate
from sim.spec.scenario import load_scenario
from sim.validation.validate import published, run_validation

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation" / "fsdp_pp"
ROWS = list(published(FOLDER)["scenario"])

# Signed errors (predicted / published - 1) measured when the rows were added: 1F1B -12.2%, interleaved -14.1%;
# -11.5% / -13.5% since FP8's split accumulation, H100's refit (1.50 -> 1.41) and torchao's current scaling
# (training.fp8_recipe: current); -7.4% / -9.5% since attention kernels run at their measured rates, SDPA's
# FlashAttention-2 here (docs/mechanisms/attention_kernels.md; H100's factor refitted 1.41 -> 1.33); -19.0% / -20.8%
# since AsyncTP (parallel.tp_comm_overlap) runs the TP collectives in chunks beside their GEMMs
# (docs/mechanisms/tp_comm_overlap.md; exposed TP 3.5 -> 0.7 s of the 1F1B step; H100's factor 1.33 -> 1.355);
# -16.8% / -18.5% since AsyncTP as PyTorch runs it (parallel.tp_comm_overlap_method: async_tp): its chunk GEMMs at their
# size, the memory-bound reduction of the reduce-scatter's tp partials after each chunked reduce-scatter, the
# shard's copy into symmetric memory before each all-gather, which hides under the fused GEMM alone (-16.3% /
# -18.1% with the reduction and chunk GEMMs only: its exposed first and last chunks were TE's, not AsyncTP's).
_ASYNC_TP = ("predicted too fast (-17..-19%): with AsyncTP modelled as PyTorch runs it (its chunk GEMMs, the "
             "reduction of the reduce-scatter's partials, the shard's copy, the gather hidden under the fused GEMM "
             "only: -19.0 -> -16.8%, -20.8 -> -18.5%) the model's AsyncTP speed-up is within 5% of torchtitan's "
             "June 2025 measurement (test_tp_comm_overlap.py), but the December 2024 AsyncTP these rows ran "
             "measured 1.057x in the same benchmark's Table 4 (Llama 3.1 70B, FSDP 32 x TP 8, Float8) where the "
             "model gives 1.14x; and the runs were on Grand Teton H100s (96 GB HBM2e) at a "
             "500 W power limit, priced at H100 SXM's 700 W peaks: no source found for the tensor-core throughput "
             "at that cap (docs/mechanisms/tp_comm_overlap.md)")
OUTSIDE: dict[str, str] = {
    "torchtitan-llama3.1-405b-h100-512-1f1b.yaml": _ASYNC_TP,
    "torchtitan-llama3.1-405b-h100-512-interleaved.yaml": _ASYNC_TP,
}

pytestmark = pytest.mark.xdist_group("fsdp-pp-validation")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return run_validation(FOLDER)


def test_every_scenario_file_has_a_published_row() -> None:
    assert {path.name for path in FOLDER.glob("*.yaml")} == set(ROWS) and len(ROWS) == 2


@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OUTSIDE[name])) if name in OUTSIDE else name
    for name in ROWS])
def test_iteration_time_within_the_band(table: pd.DataFrame, scenario: str) -> None:
    row = table.set_index("scenario").loc[scenario]
    assert row["error"] == ""
    assert row["predicted_iteration_time_s"] == pytest.approx(row["published_iteration_time_s"], rel=BAND)


def test_errors_are_as_recorded(table: pd.DataFrame) -> None:
    """The signed errors the comment above states (so a change that moves them is seen): -16.8% and -18.5%."""
    rows = table.set_index("scenario")
    errors = rows["predicted_iteration_time_s"] / rows["published_iteration_time_s"] - 1
    assert errors["torchtitan-llama3.1-405b-h100-512-1f1b.yaml"] == pytest.approx(-0.168, abs=0.005)
    assert errors["torchtitan-llama3.1-405b-h100-512-interleaved.yaml"] == pytest.approx(-0.185, abs=0.005)


def test_interleaved_speedup_over_1f1b_within_the_band(table: pd.DataFrame) -> None:
    """Published 128 / 100 tokens/s per GPU = 1.28x; predicted 1.31x (+2.3%): the 16-stage interleaved split
    (7, 8 x 14, 7 layers) against 8 stages (15, 16 x 6, 15), 8 micro-batches of 4 sequences."""
    rows = table.set_index("scenario")["predicted_iteration_time_s"]
    speedup = rows["torchtitan-llama3.1-405b-h100-512-1f1b.yaml"] / \
        rows["torchtitan-llama3.1-405b-h100-512-interleaved.yaml"]
    assert speedup == pytest.approx(128 / 100, rel=BAND)


@pytest.mark.parametrize("scenario", ROWS)
def test_the_estimate_prices_the_rows_within_five_percent(table: pd.DataFrame, scenario: str) -> None:
    simulated = table.set_index("scenario").loc[scenario, "predicted_iteration_time_s"]
    assert estimate(load_scenario(FOLDER / scenario)).step_time_s == pytest.approx(simulated, rel=0.05)
