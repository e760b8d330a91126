"""Fine-tuning inputs (``training.sequence``): document-length moments, padding waste in tokens/s and MFU, and
flash attention priced per document (sum of s_i^2, not seq_len^2), each against a closed form."""

from __future__ import annotations

import copy

import pytest

import sim
from sim.errors import ConfigError
from sim.model.flash_tiles import causal_fraction
from sim.model.flops import model_flops_per_step
from sim.model.peft import Peft
from sim.model.peft import model_flops_per_step as peft_flops
from sim.plan import resolve
from sim.spec.sequence import SequenceSpec, length_stats
from sim.workload.blocks import blocks

S, ROWS = 4096, 2
BASE = {"name": "seq", "seed": 0, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 1},
        "model": {"preset": "llama3-8b", "num_layers": 4},
        "training": {"global_batch": ROWS, "micro_batch": 1, "seq_len": S, "flash_attention": True},
        "costs": "roofline", "network": "analytic"}


def scenario(**sequence: object) -> dict:
    data = copy.deepcopy(BASE)
    data["training"]["sequence"] = sequence
    return data


def plan_of(**sequence: object) -> object:
    return resolve(sim.load_scenario(scenario(**sequence)))


def test_length_moments_closed_forms() -> None:
    # Uniform 1..S: E[s] = (S + 1) / 2, E[s^2] = (S + 1)(2S + 1) / 6.
    uniform = length_stats(SequenceSpec(lengths="uniform"), S)
    assert uniform.mean == pytest.approx((S + 1) / 2)
    assert uniform.mean_square == pytest.approx((S + 1) * (2 * S + 1) / 6)
    # Its causal share, summed in tile groups, against the sum over every length.
    for low, high in ((1, S), (100, 3000), (129, 129), (5, 130)):
        stats = length_stats(SequenceSpec(lengths="uniform", min_len=low), high)
        every = range(low, high + 1)
        brute = sum(n * n * causal_fraction(n) for n in every) / sum(n * n for n in every)
        assert stats.causal_share == pytest.approx(brute, rel=1e-12)
    # A histogram, with a row above seq_len truncated to it.
    hist = length_stats(SequenceSpec(lengths="histogram", histogram=[(512, 3), (2048, 1), (9000, 1)]), S)
    assert hist.mean == pytest.approx((3 * 512 + 2048 + S) / 5)
    assert hist.mean_square == pytest.approx((3 * 512**2 + 2048**2 + S**2) / 5)
    share = (3 * 512**2 * causal_fraction(512) + 2048**2 * causal_fraction(2048) + S**2 * causal_fraction(S)) / (
        3 * 512**2 + 2048**2 + S**2)
    assert hist.causal_share == pytest.approx(share)


@pytest.mark.parametrize("packing", [False, True])
def test_flash_attention_per_document(packing: bool) -> None:
    # Documents of 1024 tokens in 4096-token rows. Padded: the one document's 1024^2 of the row's 4096^2
    # (transformers unpads FlashAttention-2's input). Packed: 4 documents, 4 x 1024^2. Each runs its own causal
    # share (FlashAttention-2 skips the tiles above each document's diagonal).
    row = blocks(plan_of()).block["attention"]
    doc = blocks(plan_of(lengths="fixed", length=1024, packing=packing)).block["attention"]
    flash_row = next(op for op in row.ops if op.name == "flash_attention")
    flash_doc = next(op for op in doc.ops if op.name == "flash_attention")
    documents = S // 1024 if packing else 1
    assert flash_row.flops == 2 * 2 * 32 * S * S * 128  # 4 b heads s^2 d, Megatron's full matrix
    assert flash_doc.flops == pytest.approx(documents * 2 * 2 * 32 * 1024**2 * 128)
    assert flash_doc.executed == pytest.approx(causal_fraction(1024))
    # Everything else (the linear layers) runs over the whole row, pad tokens included.
    assert [op for op in doc.ops if op.name != "flash_attention"] == [
        op for op in row.ops if op.name != "flash_attention"]


def test_padding_waste_in_tokens_and_mfu() -> None:
    # Padded 1024-token documents: a step trains on ROWS x 1024 tokens, and MFU's numerator is exactly the model
    # FLOPs of ROWS sequences of 1024 tokens, while the row's 4096 tokens are computed (HFU).
    plan = plan_of(lengths="fixed", length=1024)
    model = resolve(sim.load_scenario(BASE)).model
    assert plan.model_tokens_per_step == ROWS * 1024
    assert plan.model_flops_per_step == pytest.approx(model_flops_per_step(model, ROWS, 1024), rel=1e-12)
    run = sim.run(scenario(lengths="fixed", length=1024)).summary
    assert run.tokens_per_s == pytest.approx(ROWS * 1024 / run.step_time_s)
    assert run.mfu < run.hfu / 3  # a quarter of the linear work is model work
    # Packed: 4 documents per row, no padding: ROWS x 4 sequences of 1024 tokens.
    packed = plan_of(lengths="fixed", length=1024, packing=True)
    assert packed.model_tokens_per_step == ROWS * S
    assert packed.model_flops_per_step == pytest.approx(model_flops_per_step(model, ROWS * 4, 1024), rel=1e-12)


def test_uniform_lengths_model_flops() -> None:
    # a s + c s^2 per document: padded rows hold one document each, E[model FLOPs] = rows (a E[s] + c E[s^2]).
    plan = plan_of(lengths="uniform")
    model = plan.model
    one, two = model_flops_per_step(model, 1, 1), model_flops_per_step(model, 1, 2)
    c = (two - 2 * one) / 2
    a = one - c
    mean, square = (S + 1) / 2, (S + 1) * (2 * S + 1) / 6
    assert plan.model_flops_per_step == pytest.approx(ROWS * (a * mean + c * square), rel=1e-12)
    # Under LoRA the same decomposition of PEFT's model FLOPs.
    lora = resolve(sim.load_scenario({**scenario(lengths="fixed", length=1024),
                                      "training": {**scenario(lengths="fixed", length=1024)["training"],
                                                   "method": "lora"}}))
    assert lora.model_flops_per_step == pytest.approx(peft_flops(model, Peft("lora"), ROWS, 1024), rel=1e-12)


def test_estimate_follows_the_simulation() -> None:
    for sequence in ({"lengths": "uniform"}, {"lengths": "histogram", "histogram": [[512, 3], [2048, 1]],
                                              "packing": True}):
        data = scenario(**sequence)
        assert sim.estimate(data).step_time_s == pytest.approx(sim.run(data).summary.step_time_s, rel=1e-9)


def test_default_changes_nothing() -> None:
    plan = plan_of()
    assert plan.lengths is None and plan.attention_work is None
    assert plan.model_tokens_per_step == ROWS * S
    assert plan.model_flops_per_step == model_flops_per_step(plan.model, ROWS, S)


@pytest.mark.parametrize("sequence,message", [
    ({"lengths": "histogram"}, "training.sequence.histogram: lengths histogram needs"),
    ({"lengths": "uniform", "histogram": [[1, 1]]}, "training.sequence.histogram: needs lengths: histogram"),
    ({"lengths": "histogram", "histogram": [[0, 1]]}, "needs tokens >= 1"),
    ({"lengths": "uniform", "length": 5}, "training.sequence.length: needs lengths: fixed"),
    ({"lengths": "uniform", "min_len": 5000}, "training.sequence.min_len: 5000 exceeds"),
    ({"packed": True}, "training.sequence.packed: unknown key"),
])
def test_one_line_errors(sequence: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sim.load_scenario(scenario(**sequence))
