"""Greedy packing's padded row tails (``training.sequence.split_across_pack: false``, torchtune's PackedDataset
default): documents are appended in data order while they fit, the first that does not starts the next row, and
the row is padded to seq_len; the padding is one more sequence of the row's ``seq_lens``. Closed forms for fixed
lengths, the renewal identity, and torchtune's loop re-run over sampled documents."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import sim
from sim.errors import ConfigError
from sim.model.flash_tiles import causal_fraction
from sim.plan import resolve
from sim.spec.sequence import SequenceSpec, length_stats, pack_stats

S, ROWS = 4096, 2
BASE = {"name": "tail", "seed": 0, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 1},
        "model": {"preset": "llama3-8b", "num_layers": 4},
        "training": {"global_batch": ROWS, "micro_batch": 1, "seq_len": S, "flash_attention": True},
        "costs": "roofline", "network": "analytic"}


def scenario(**sequence: object) -> dict:
    data: dict = copy.deepcopy(BASE)
    data["training"]["sequence"] = sequence
    return data


def greedy(lengths: np.ndarray, seq_len: int) -> tuple[float, float, float]:
    """torchtune's PackedDataset loop (split_across_pack=False): (documents per row, mean pad, mean pad^2)."""
    documents, pads, level, count = [], [], 0, 0
    for length in lengths:
        if level + length > seq_len:
            documents.append(count)
            pads.append(seq_len - level)
            level, count = 0, 0
        level, count = level + length, count + 1
    pad = np.array(pads, float)
    return float(np.mean(documents)), float(pad.mean()), float((pad**2).mean())


def test_fixed_lengths_closed_form() -> None:
    # 1500-token documents in 4096-token rows: two per row, 1096 tokens of padding, attended as a 1096-token
    # sequence (9 flash tiles: causal share 10/18).
    tail = pack_stats(SequenceSpec(packing=True, split_across_pack=False, length=1500), S)
    assert tail.documents_per_row == pytest.approx(2.0, rel=1e-12)
    assert tail.pad_mean == pytest.approx(1096.0, rel=1e-12)
    assert tail.pad_mean_square == pytest.approx(1096.0**2, rel=1e-12)
    assert tail.pad_causal_work == pytest.approx(1096.0**2 * causal_fraction(1096), rel=1e-12)
    plan = resolve(sim.load_scenario(scenario(packing=True, split_across_pack=False, length=1500)))
    full = resolve(sim.load_scenario(scenario(packing=True, length=1500)))
    assert plan.model_tokens_per_step == pytest.approx(ROWS * 3000, rel=1e-12)
    assert full.model_tokens_per_step == ROWS * S
    assert plan.attention_work is not None and full.attention_work is not None
    assert plan.attention_work[0] == pytest.approx((2 * 1500**2 + 1096**2) / S**2, rel=1e-12)
    assert full.attention_work[0] == pytest.approx(S / 1500 * 1500**2 / S**2, rel=1e-12)
    assert plan.model_flops_per_step == pytest.approx(full.model_flops_per_step * 2 / (S / 1500), rel=1e-12)


@pytest.mark.parametrize("spec", [
    SequenceSpec(packing=True, split_across_pack=False, lengths="uniform"),
    SequenceSpec(packing=True, split_across_pack=False, lengths="uniform", min_len=512),
    SequenceSpec(packing=True, split_across_pack=False, lengths="histogram",
                 histogram=[(512, 3), (2048, 1), (3000, 1)]),
], ids=["uniform", "uniform-512", "histogram"])
def test_against_torchtunes_loop(spec: SequenceSpec) -> None:
    # Renewal identity: a row is its documents and its padding (E[docs] E[s] + E[pad] = S, to round-off); and the
    # averages agree with torchtune's loop over 100,000 sampled documents within 1% (its sampling error ~0.3%).
    tail, stats = pack_stats(spec, S), length_stats(spec, S)
    assert tail.documents_per_row * stats.mean + tail.pad_mean == pytest.approx(S, rel=1e-9)
    rng = np.random.default_rng(0)
    if spec.lengths == "uniform":
        lengths = rng.integers(spec.min_len, S + 1, 100_000)
    else:
        values = np.array([n for n, _ in spec.histogram])
        weights = np.array([w for _, w in spec.histogram], float)
        lengths = rng.choice(values, 100_000, p=weights / weights.sum())
    documents, pad, square = greedy(lengths, S)
    assert tail.documents_per_row == pytest.approx(documents, rel=0.01)
    assert tail.pad_mean == pytest.approx(pad, rel=0.01)
    assert tail.pad_mean_square == pytest.approx(square, rel=0.02)


def test_uniform_rows_are_a_quarter_padding_and_tokens_per_second_fall() -> None:
    # Uniform 1..4096: 1.5 documents per row and 1,024 tokens of padding (S/4); tokens/s counts the documents.
    spec = {"packing": True, "split_across_pack": False, "lengths": "uniform"}
    plan = resolve(sim.load_scenario(scenario(**spec)))
    assert plan.documents_per_row == pytest.approx(1.4998, abs=1e-4)
    assert plan.packing_tail is not None and plan.packing_tail.pad_mean == pytest.approx(1023.6, abs=0.1)
    run, full = sim.run(scenario(**spec)).summary, sim.run(scenario(packing=True, lengths="uniform")).summary
    assert run.tokens_per_s * run.step_time_s == pytest.approx(plan.model_tokens_per_step, rel=1e-9)
    assert plan.model_tokens_per_step == pytest.approx(ROWS * (S - plan.packing_tail.pad_mean), rel=1e-9)
    assert run.tokens_per_s < full.tokens_per_s and run.mfu < full.mfu


def test_needs_packing() -> None:
    with pytest.raises(ConfigError, match="training.sequence.split_across_pack: false needs packing: true"):
        sim.load_scenario(scenario(split_across_pack=False, lengths="uniform"))
