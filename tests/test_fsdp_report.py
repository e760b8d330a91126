"""The FSDP report (issue 4) reads the validation set's FSDP rows and scenarios and reports errors
consistently with the simulation (its accuracy against the 15% band is asserted per row below for the A100
runs; the H100 runs are tracked in docs/validation.md)."""

import pytest

from analysis.fsdp_report import fsdp_rows, report, scenario_for, to_markdown
from sim import runner
from sim.plan import resolve

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation"


def test_rows_become_the_published_setup():
    rows = fsdp_rows(FOLDER)
    assert len(rows) == 8
    scenario = scenario_for(rows.iloc[0], FOLDER)
    plan = resolve(scenario)
    # 7B ran HSDP (fms-fsdp README table "7b | HSDP", scripts/train.sh --sharding_strategy=hsdp): sharded in a node
    assert scenario.cluster.num_gpus == 128 and plan.zero_stage == 3 and scenario.fsdp.sharding == "HYBRID_SHARD"
    assert scenario.cluster.inter_node.bandwidth == pytest.approx(400e9 / 8 / 8)  # 400 Gb/s per node, 8 GPUs
    assert plan.global_batch * plan.seq_len == 1048576  # the blog's 1M-token batch on 128 GPUs
    assert not scenario.training.fused_kernels  # the blog did not use kernel fusion / torch.compile


def test_report_errors_are_consistent_with_the_simulation():
    rows = fsdp_rows(FOLDER).iloc[:2]
    table = report(rows, FOLDER)
    summary = runner.run(scenario_for(rows.iloc[0], FOLDER)).summary
    assert table.loc[0, "predicted_mfu"] == summary.mfu
    assert table.loc[0, "mfu_error"] == pytest.approx(summary.mfu / 0.57 - 1)
    assert table.loc[0, "predicted_tokens_per_s_per_gpu"] == pytest.approx(summary.tokens_per_s / 128)
    assert table.loc[1, "recompute"] == "full (20/40 layers)"
    markdown = to_markdown(table)
    assert "| Llama2-7B | A100-80GB-SXM | 128 |" in markdown


def test_a100_rows_mfu_within_15_percent():
    rows = fsdp_rows(FOLDER)
    table = report(rows[rows["scenario"].str.contains("a100")], FOLDER)
    assert len(table) == 4
    assert (table["mfu_error"].abs() <= 0.15).all(), table[["model", "mfu_error"]]
