"""Fine-tuning memory against published peaks (issue 28, must-show 1): torchtune's README table "Memory and
training speed" (tests/data/torchtune_peft_memory.csv, with the commit and configs). Each row is simulated as its
config states it: Llama 3.1 8B / 70B (the llama3-8b / llama3-70b shapes; 3.1 changes only the RoPE scaling),
LoRA on q_proj, v_proj, output_proj and the three MLP projections, batch 2 x 2048 tokens, activation
checkpointing (full recompute), bf16 adapters with fp32 Adam states (2 + 2 + 12 bytes per trainable parameter),
frozen weights at 2 bytes (LoRA) or 4.127 bits (QLoRA's NF4 with double-quantised scalers, torchao's to_nf4:
blocks of 64, scalers in blocks of 256) with the embedding, norms and LM head in bf16. The loss is torchtune's
CEWithChunkedOutputLoss compiled (``cross_entropy: fused``: no logits held beyond the kernel)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sim.model.peft import nf4_bits_per_param
from sim.model.transformer import MODEL_PRESETS, embedding_params, head_params, total_params
from sim.plan import resolve
from sim.spec.scenario import scenario_from_dict
from sim.workload.footprint import memory_plan, states_and_buffers

GiB = 2**30
ROWS = list(csv.DictReader((Path(__file__).parent / "data" / "torchtune_peft_memory.csv").open()))


def plan_of(row: dict[str, str]) -> object:
    gpus = int(row["gpus"])
    data: dict = {
        "name": "torchtune", "cluster": {"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": gpus},
        "model": row["model"],
        "training": {"global_batch": int(row["micro_batch"]) * gpus, "micro_batch": int(row["micro_batch"]),
                     "seq_len": int(row["seq_len"]), "flash_attention": True, "recompute": "full",
                     "grad_dtype": "bf16", "method": row["method"],
                     "lora": {"r": int(row["lora_rank"]), "target_modules": row["lora_targets"].split()}}}
    if gpus > 1:
        data["fsdp"] = {"sharding": "FULL_SHARD"}
    return resolve(scenario_from_dict(data))


def row(model: str, method: str) -> dict[str, str]:
    return next(r for r in ROWS if r["model"] == model and r["method"] == method)


def test_model_states_closed_form() -> None:
    # Bytes per parameter stated: frozen bf16 = 2, frozen NF4 = 4.127 / 8, trainable adapter = 2 + 2 + 12.
    spec = MODEL_PRESETS["llama3-8b"]
    h, kv, f, layers = 4096, 1024, 14336, 32
    adapters = layers * 8 * ((h + h) + (h + kv) + (h + h) + 2 * (h + f) + (f + h))  # r (in + out) per target
    lora = plan_of(row("llama3-8b", "lora"))
    states, _ = states_and_buffers(lora, 0)
    assert states["weights"] == pytest.approx(2 * total_params(spec) + 2 * adapters)
    assert states["gradients"] + states["optimizer"] == pytest.approx(14 * adapters)
    qlora = plan_of(row("llama3-8b", "qlora"))
    states, _ = states_and_buffers(qlora, 0)
    bf16 = embedding_params(spec) + head_params(spec) + layers * 2 * h  # embedding, final norm + head, layer norms
    nf4 = total_params(spec) - bf16
    assert nf4_bits_per_param() == pytest.approx(4.127, abs=5e-4)
    assert states["weights"] == pytest.approx(nf4 * nf4_bits_per_param() / 8 + 2 * bf16 + 2 * adapters)


@pytest.mark.parametrize("model,method", [("llama3-8b", "lora"), ("llama3-8b", "qlora")])
def test_single_gpu_peak_within_5_percent(model: str, method: str) -> None:
    # 8B LoRA: 16.81 GiB against 16.2 (+3.8%); 8B QLoRA: 7.17 against 7.4 (-3.1%). The model states alone are
    # 15.25 and 5.60 GiB; the rest is the checkpointed layer inputs (32 x 2 x 2 x 2048 x 4096 B = 1.0 GiB) and
    # the layer being rebuilt.
    published = float(row(model, method)["peak_memory_gib"]) * GiB
    bound = memory_plan(plan_of(row(model, method)))[0]["total"]
    assert bound == pytest.approx(published, rel=0.05)


def test_70b_fsdp_bound_is_above_the_published_peak() -> None:
    # 70B LoRA on 8 A100 with FSDP: 31.6 GiB against 27.6 (+14.5%, outside 5%): the model-state shard is 16.8 GiB
    # (141 GB of bf16 weights / 8), activations 6.1 GiB, and the bound's gathered weights (8.7 GiB: two layer
    # units, the last one with the 2.1 GB LM head counted twice, docs/mechanisms/peft.md) are the upper bound's
    # choice; FSDP2's per-layer prefetch would hold about half. The bound stays above the measured peak.
    r = row("llama3-70b", "lora")
    parts = memory_plan(plan_of(r))[0]
    published = float(r["peak_memory_gib"]) * GiB
    assert parts["weights"] + parts["gradients"] + parts["optimizer"] < published < parts["total"]
    assert parts["total"] / published - 1 == pytest.approx(0.145, abs=0.01)


# ------------------------------------------------------------------------- LoRA throughput (must-show 3)
VALIDATION = Path(__file__).parent.parent / "scenarios" / "validation_peft"


@pytest.mark.parametrize("published", list(csv.DictReader((VALIDATION / "published.csv").open())),
                         ids=lambda row: row["scenario"])
def test_qwen_lora_rows_inside_the_band(published: dict[str, str]) -> None:
    # Qwen-7B LoRA on one A100 (Qwen README, "Profiling of Memory and Speed"): the step within the fidelity band
    # (10%; measured -3.6%, -3.0%, -0.7%, -1.4%), and the peak below the published (allocator-reserved) figure
    # by at most 11% (-6.3%, -6.4%, -10.6%, -4.1%; the caching allocator's overhead is not in the scenarios).
    import sim

    run = sim.run(VALIDATION / published["scenario"]).summary
    assert run.step_time_s / float(published["iteration_time_s"]) - 1 == pytest.approx(0.0, abs=0.10)
    memory = run.peak_memory_bytes.max / 1e9 / float(published["peak_memory_gb"]) - 1
    assert -0.11 <= memory <= 0.0
