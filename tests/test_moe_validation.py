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
_QWEN3_OVERLAP = ("Qwen3-235B DeepEP ep 32 '+1f1b overlap' predicted too fast (-12.6%): moe.a2a_overlap takes the "
                  "exposed DeepEP time of its no-overlap twin (-1.4%) from 6.5 to 1.5 s and saves 4.1 s net of "
                  "DeepEP's 20 SMs (the forward's send leaving beside the backward's last block, as Megatron's "
                  "combined 1F1B issues it), the run saved 2.1 s. The ModelZoo's run_h100_235b.sh puts this layout "
                  "at 320 TFLOPS (15.1 s) once CUDA graphs capture moe_router and moe_preprocess, i.e. the 17.6 s "
                  "run lost ~2.5 s to host-side launches and syncs in the router/permute, which are not modelled "
                  "(docs/mechanisms/a2a_overlap.md)")
_QWEN3_MAIN = ("Qwen3-235B rows run on main(1e057005) predicted too fast (pp 32, tp 4; see docs/validation.md) "
               "with the MoE host-sync bound (docs/mechanisms/moe_host_sync.md: each MoE layer pass lasts at least the "
               "host's time to issue it, 3.69 ms forward / 3.26 ms backward at 16 local experts: 26-35 us per eager "
               "kernel measured on an H100 host plus 83 us per Transformer Engine linear module in the forward, "
               "TransformerEngine#1191), Megatron's unfused loss (cross_entropy: megatron) and no TP overlap, as the "
               "rows' commands at 8017e11 ran them; they still lack about 1 ms per layer pass. The replay is plain "
               "PyTorch, not Megatron + Transformer Engine (whose Python, the TE modules' backward included, costs the "
               "host more); routing was forced to balance (--moe-router-force-load-balancing in every row's command): "
               "random top-k, whose busiest EP rank gets 1.1-1.5% more pairs (moe.force_load_balancing, "
               "docs/mechanisms/forced_load_balancing.md), +0.2% on the pp 32 row and none on the host-bound tp 4 "
               "row, so imbalance explains almost none of it")
# folding-t2-mixtral-8x22b-h100-128-fp8-mcore.yaml came inside the band (-10.8% -> -9.4%) when H100's factor was
# refitted 1.33 -> 1.355 after TE's userbuffers TP overlap (docs/mechanisms/tp_comm_overlap.md) sped up two fit rows;
# FP8's speed-up over BF16 stays over-predicted (test_fp8_speedup_over_bf16_on_the_same_layout).
OUTSIDE: dict[str, str] = {
    "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml": _QWEN3_OVERLAP,
    "mz-qwen3-235b-h100-256-a2a-pp32.yaml": _QWEN3_MAIN,
    "mz-qwen3-235b-h100-256-deepep-tp4.yaml": _QWEN3_MAIN,
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
