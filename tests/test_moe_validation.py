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
# The Qwen3 pp 32 and tp 4 rows (main(1e057005)) came inside the band (-15.2% -> -6.6%, -21.8% -> -2.1%) when
# Megatron-Core's own MoE code was run and its host time priced (costs.megatron_moe_host_ops, 63 eager ops' worth
# per forward; docs/mechanisms/moe_host_sync.md). folding-t2-mixtral-8x22b-h100-128-fp8-mcore.yaml came inside
# earlier (-10.8% -> -9.4%) when H100's factor was refitted after TE's userbuffers TP overlap; with the Megatron
# term the FP8 rows' forwards are host-bound (-9.1% -> -0.5%, folding -6.8% -> +5.9%). The Qwen3 ep 32 '+1f1b
# overlap' row (moe_dev(f3e6c5), lhb8125/Megatron-LM f3e6c55a) came inside (-12.0% -> -10.4% with 32 CUDA hardware
# queues exposing the attention backward's TP collectives, parallel.cuda_device_max_connections; -> -8.6%) when its
# code was read and run: the pair's forward send waits for the host to issue the whole pair (f3e6c5's
# schedule_chunk_1f1b), and the combined 1F1B's schedule nodes cost the host 41 us per node call, 10 per merged MoE
# layer pair (costs.a2a_overlap_node_overhead, measured on a CPU with CUDA's calls stubbed: a lower bound;
# docs/mechanisms/a2a_overlap.md "What f3e6c5 runs").
OUTSIDE: dict[str, str] = {}

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
def test_fp8_speedup_over_bf16_on_the_same_layout(table: pd.DataFrame, layout: str) -> None:
    """The paper ran one Mixtral 8x22B layout in BF16 (Table 3) and in FP8 (Table 2): the ratio of the two step
    times is free of the FLOP convention and of everything the two runs share. Predicted 1.29x (mcore) / 1.27x
    (folding) against the paper's 1.25x / 1.30x: FP8 GEMMs at twice the BF16 curve, the backward's split
    accumulation and TE's casts priced, and the FP8 forward's MoE layers bound by the host (Megatron-Core's
    measured MoE host time, costs.megatron_moe_host_ops), which FP8 does not speed up (was 1.41x / 1.44x without
    it, an xfail; docs/mechanisms/fp8.md)."""
    rows = table.set_index("scenario")
    bf16 = rows.loc[f"folding-t3-mixtral-8x22b-h100-128-{layout}.yaml"]
    fp8 = rows.loc[f"folding-t2-mixtral-8x22b-h100-128-fp8-{layout}.yaml"]
    published = bf16["published_iteration_time_s"] / fp8["published_iteration_time_s"]
    predicted = bf16["predicted_iteration_time_s"] / fp8["predicted_iteration_time_s"]
    assert published == pytest.approx({"mcore": 575.1 / 458.3, "folding": 631.7 / 487.7}[layout], rel=1e-3)
    assert predicted == pytest.approx(published, rel=0.10)
