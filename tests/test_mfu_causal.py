"""MFU under two FLOP conventions (issue 24): Megatron's full s x s attention count (``mfu``, megatron/training/
training.py num_floating_point_operations) and the causal count over the s(s+1)/2 query-key pairs a causal mask
keeps (``mfu_causal``, Plan.causal_model_flops_per_step). Closed forms: Megatron's attention term is
12 l h s^2 per sequence (forward QK^T and AV, 2 x 2 s^2 h per layer, times 3 for the backward), so the two counts
differ by 12 l h (s^2 - s(s+1)/2) per sequence."""

from __future__ import annotations

import pytest

from sim import runner
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS


def test_causal_count_halves_the_attention_term_plus_the_diagonal():
    plan = resolve(load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml"))
    m, s, gb = plan.model, plan.seq_len, plan.global_batch
    assert (m.num_layers, m.hidden_size, s, gb) == (96, 12288, 2048, 1536)
    full, causal = plan.model_flops_per_step, plan.causal_model_flops_per_step
    assert causal is not None
    expected = gb * 12 * m.num_layers * m.hidden_size * (s * s - s * (s + 1) / 2)
    assert full - causal == pytest.approx(expected, rel=1e-9)


def test_summary_reports_both_and_they_differ_most_at_long_context():
    short = runner.run(load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml")).summary
    long = runner.run(load_scenario(SCENARIOS / "llama3.1-405b_h100-16384_cp16-128k.yaml")).summary
    for summary in (short, long):
        assert summary.mfu_causal is not None and 0 < summary.mfu_causal < summary.mfu
        assert summary.mfu_causal <= summary.hfu <= 1  # HFU counts the causal kernel's executed tiles
    # 2k tokens: the attention term is s/(6h) of the rest, so the causal count is ~1% lower; at 128k, ~29% lower
    assert short.mfu_causal / short.mfu == pytest.approx(0.9865, abs=0.002)
    assert long.mfu_causal / long.mfu < 0.75


def test_ratio_is_the_plans_flop_ratio_and_absent_without_causal_attention():
    scenario = load_scenario(SCENARIOS / "tiny.yaml")
    plan = resolve(scenario)
    summary = runner.run(scenario).summary
    assert plan.causal_model_flops_per_step is not None
    assert summary.mfu_causal / summary.mfu == pytest.approx(
        plan.causal_model_flops_per_step / plan.model_flops_per_step, rel=1e-12)
    bidirectional = load_scenario(SCENARIOS / "tiny.yaml", ["training.causal_attention=false"])
    assert resolve(bidirectional).causal_model_flops_per_step is None
    assert runner.run(bidirectional).summary.mfu_causal is None


def test_packed_documents_count_each_documents_own_causal_pairs():
    """Fixed 512-token documents packed into 2048-token rows: four documents per row, each with 512 * 513 / 2
    causal pairs, against Megatron's 512^2 per document (the attention between packed documents is no model
    FLOP under either count)."""
    scenario = load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml",
                             ["training.sequence={packing: true, lengths: fixed, length: 512}"])
    plan = resolve(scenario)
    m, gb, d = plan.model, plan.global_batch, 512
    full, causal = plan.model_flops_per_step, plan.causal_model_flops_per_step
    assert plan.documents_per_row == 4 and causal is not None
    assert full - causal == pytest.approx(gb * 4 * 12 * m.num_layers * m.hidden_size * (d * d - d * (d + 1) / 2),
                                          rel=1e-9)
