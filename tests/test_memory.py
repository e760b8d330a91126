"""Activation bytes against Korthikanti et al. 2022 Table 2 (tests/data), model states against ZeRO's
16 bytes per parameter (Rajbhandari et al. SC20 Sec. 3.1)."""

import csv

import numpy as np
import pytest

from sim.model.memory import activation_bytes_per_layer, model_state_bytes, peak_usage, rank_params
from sim.model.params import total_params
from sim.model.presets import MODEL_PRESETS

from conftest import DATA

ROWS = list(csv.DictReader(open(DATA / "korthikanti2022_activation_memory_formulas.csv")))


@pytest.mark.parametrize("row", ROWS, ids=[r["configuration"] for r in ROWS])
@pytest.mark.parametrize("name, t", [("gpt3-175b", 8), ("gpt3-13b", 4), ("gpt3-1.3b", 2)])
def test_activation_bytes_equal_korthikanti_table2(row, name, t):
    spec = MODEL_PRESETS[name]
    s, b, h, a = spec.max_seq_len, 2, spec.hidden_size, spec.num_attention_heads
    tp = 1 if row["tp"] == "1" else t
    expected = eval(row["activation_bytes_per_transformer_layer"], {},
                    {"sbh": s * b * h, "s": s, "h": h, "a": a, "t": tp})
    ours = activation_bytes_per_layer(spec, b, s, tp, row["sequence_parallel"] == "true", row["recompute"])
    assert ours == pytest.approx(expected, rel=1e-12)


def test_mixed_precision_adam_is_16_bytes_per_param():
    assert model_state_bytes(7e9, "bf16").total == 112e9
    states = model_state_bytes(1.0, "fp16")
    assert (states.weights, states.gradients, states.optimizer) == (2, 2, 12)


def test_rank_params_sum_to_the_model():
    spec = MODEL_PRESETS["gpt3-13b"]  # tied embeddings: the last stage holds its own copy
    pp, tp = 4, 2
    held = sum(rank_params(spec, tp, spec.num_layers // pp, embedding=stage == 0, head=stage == pp - 1,
                       tied_copy=stage == pp - 1) for stage in range(pp)) * tp
    copy_on_last_stage = spec.vocab_size * spec.hidden_size
    replicated_norms = spec.num_layers * 4 * spec.hidden_size * (tp - 1) + 2 * spec.hidden_size * (tp - 1)
    row_biases = spec.num_layers * 2 * spec.hidden_size * (tp - 1)
    assert held == pytest.approx(total_params(spec) + copy_on_last_stage + replicated_norms + row_biases)


def test_peak_usage_counts_overlaps():
    stash = np.array([0.0, 1.0, 2.0, 5.0])
    free = np.array([3.0, 4.0, 6.0, 7.0])
    assert peak_usage({"a": (stash, free, np.ones(4))})["total"] == 3
    tie = peak_usage({"a": (np.array([1.0]), np.array([1.0]), np.ones(1))})
    assert tie["total"] == 1  # stash counted before free at a tie


TABLE1 = list(csv.DictReader(open(DATA / "zero_sc20_table1_memory.csv")))


@pytest.mark.parametrize("row", TABLE1, ids=[f"{r['model']}-dp{r['dp_degree']}-z{r['zero_stage']}" for r in TABLE1])
def test_zero_model_states_reproduce_sc20_table1(row):
    """All 54 rows: exactly the formula column (to its 3 printed decimals), and the paper's rounded figure within
    0.1% or 1 GB."""
    states = model_state_bytes(float(row["params"]), "fp16", int(row["zero_stage"]), int(row["dp_degree"]))
    gb = states.total / 1e9
    assert abs(gb - float(row["formula_GB"])) <= 5e-4 + 1e-9  # the column is printed to 3 decimals
    published = float(row["model_state_memory_per_device_GB"])
    assert abs(gb - published) <= max(1e-3 * published, 1.0)


def test_zero_stages_shard_what_the_paper_says():
    psi, n = 1.0, 8
    assert model_state_bytes(psi, "bf16", 1, n).total == pytest.approx(4 + 12 / n)
    assert model_state_bytes(psi, "bf16", 2, n).total == pytest.approx(2 + 14 / n)
    assert model_state_bytes(psi, "bf16", 3, n).total == pytest.approx(16 / n)


def test_full_recompute_under_sequence_parallelism_keeps_the_sequence_shard():
    """Megatron-LM's TransformerBlock keeps the checkpoint's input whole only without SP
    (``distribute_saved_activations = config.distribute_saved_activations and not config.sequence_parallel``:
    with SP the hidden states entering a layer are already split over the sequence, [s/t, b, h]); TorchTitan's
    SequenceParallel blocks likewise take a Shard(1) input. So a layer keeps 2sbh/t. At the review, TorchTitan's
    Llama 3 70B config (tp 8 + SP, full AC, local batch 8, 8K) was given 82.2 GiB of activations (80 layers x 2sbh,
    not /8) and did not fit on 80 GB."""
    spec = MODEL_PRESETS["llama3-70b"]
    s, b, h, t = 8192, 8, spec.hidden_size, 8
    assert activation_bytes_per_layer(spec, b, s, t, True, "full", True) == 2.0 * s * b * h / t
