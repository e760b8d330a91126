"""The MoE validation rows (issue 23 must-show 4): each published MoE run of ``scenarios/validation/moe`` is
predicted within the 10% band of docs/validation.md, no per-row tuning, or is marked xfail (strict, so a row that
comes inside says so) with the reason; docs/validation.md's MoE section is the report these rows regenerate
(``python -m analysis validate``, ``analysis.validation_report.moe_markdown``)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.validation_report import BAND, moe_markdown
from sim.validation.validate import error_stats, published, run_validation

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation" / "moe"
ROWS = list(published(FOLDER)["scenario"])

# Rows that honestly are not inside the band (signed error, predicted / published - 1), with the evidence
# (docs/mechanisms/expert_parallel.md 'Against published MoE runs').
_QWEN3_DEEPEP = ("Qwen3-235B ep 32 over 4 nodes predicted too slow (+32%): most of the step is exposed "
                 "all-to-all priced as NCCL's send/recv to every peer over InfiniBand; the run used DeepEP, whose "
                 "kernels send a token once per node and forward it over NVLink (no flex/DeepEP dispatcher here)")
_QWEN3_DROPLESS = ("Qwen3-235B dropless rows predicted too fast (pp 32: -22%, tp 4: -45%): routing is even here "
                   "(moe.imbalance 1) while these runs route dropless without forced balance; the ModelZoo's 16k "
                   "table measures dropless at 237 against 295 TFLOP/s forced-balanced (1.24x), which covers the pp 32 "
                   "row but not half of the tp 4 one; no sourced imbalance to apply (no per-row factor)")
_QWEN3_OVERLAP = ("Qwen3-235B '+1f1b overlap' row: moe.a2a_overlap (--overlap-moe-expert-parallel-comm, the merged "
                  "1F1B of MCore v0.14) is refused, not modelled")
# folding-t2-mixtral-8x22b-h100-128-fp8-mcore.yaml came inside the band (-10.8% -> -9.4%) when H100's factor was
# refitted 1.33 -> 1.355 after TE's userbuffers TP overlap (docs/mechanisms/tp_comm_overlap.md) sped up two fit rows;
# FP8's speed-up over BF16 stays over-predicted (test_fp8_speedup_over_bf16_on_the_same_layout).
OUTSIDE: dict[str, str] = {
    "mz-qwen3-235b-h100-256-deepep-ep32.yaml": _QWEN3_DEEPEP,
    "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml": _QWEN3_OVERLAP,
    "mz-qwen3-235b-h100-256-a2a-pp32.yaml": _QWEN3_DROPLESS,
    "mz-qwen3-235b-h100-256-deepep-tp4.yaml": _QWEN3_DROPLESS,
}

pytestmark = pytest.mark.xdist_group("moe-validation")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return run_validation(FOLDER)


def test_every_moe_scenario_file_has_a_published_row() -> None:
    assert {path.name for path in FOLDER.glob("*.yaml")} == set(ROWS)
    assert set(OUTSIDE) <= set(ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OUTSIDE[name])) if name in OUTSIDE else name
    for name in ROWS])
def test_moe_iteration_time_within_the_band(table: pd.DataFrame, scenario: str) -> None:
    row = table.set_index("scenario").loc[scenario]
    assert row["error"] == ""
    assert row["predicted_iteration_time_s"] == pytest.approx(row["published_iteration_time_s"], rel=BAND)


@pytest.mark.slow
def test_moe_section_reports_every_row_with_signed_errors(table: pd.DataFrame) -> None:
    text = moe_markdown(table)
    stats = error_stats(table)
    assert all(f"| {name} |" in text for name in ROWS)
    assert f"signed mean (bias) {stats['signed_mean']:+.1%}" in text
    assert f"maximum {stats['max_abs']:.1%}" in text
    ran = table[table["error"] == ""]
    assert stats["rows"] == len(ran) and stats["max_abs"] == pytest.approx(ran["iteration_time_error"].abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["mcore", "folding"])
@pytest.mark.xfail(strict=True, reason=(
    "FP8's speed-up over BF16 on one layout: predicted 1.41x (mcore) / 1.44x (folding) against the paper's 1.25x / "
    "1.30x (Table 2, TE delayed scaling): FP8 GEMMs priced at twice the BF16 curve, the backward's split accumulation "
    "(costs.fp8_split_accumulation 1.15: together 1.80x over a linear's three GEMMs, an H100 measured 1.85x) and TE's "
    "casts priced; what else TE FP8 loses in MoE layers has no sourced mechanism yet (docs/mechanisms/fp8.md)"))
def test_fp8_speedup_over_bf16_on_the_same_layout(table: pd.DataFrame, layout: str) -> None:
    """The paper ran one Mixtral 8x22B layout in BF16 (Table 3) and in FP8 (Table 2): the ratio of the two step
    times is free of the FLOP convention and of everything the two runs share."""
    rows = table.set_index("scenario")
    bf16 = rows.loc[f"folding-t3-mixtral-8x22b-h100-128-{layout}.yaml"]
    fp8 = rows.loc[f"folding-t2-mixtral-8x22b-h100-128-fp8-{layout}.yaml"]
    published = bf16["published_iteration_time_s"] / fp8["published_iteration_time_s"]
    predicted = bf16["predicted_iteration_time_s"] / fp8["predicted_iteration_time_s"]
    assert published == pytest.approx({"mcore": 575.1 / 458.3, "folding": 631.7 / 487.7}[layout], rel=1e-3)
    assert predicted == pytest.approx(published, rel=0.10)
