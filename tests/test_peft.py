"""Fine-tuning methods (issue 28): LoRA/QLoRA parameter counts, model-state bytes, frozen backward FLOPs, the
one-line errors, and that full training is untouched."""

from __future__ import annotations

import pytest

from sim.costs.models import Work
from sim.errors import ConfigError
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.params import total_params
from sim.model.peft import Peft, adapt_layer_ops, nf4_bits_per_param, trainable_params
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import scenario_from_dict
from sim.workload.footprint import memory_plan, states_and_buffers

LLAMA3_8B, LLAMA3_70B = MODEL_PRESETS["llama3-8b"], MODEL_PRESETS["llama3-70b"]


def scenario(model: str = "llama3-8b", gpus: int = 1, **training: object) -> dict:
    return {"name": "ft", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": gpus},
            "model": model, "training": {"global_batch": gpus, "seq_len": 2048, "flash_attention": True, **training}}


# ------------------------------------------------------------------------------------------ parameter counts
def test_trainable_counts_match_published_peft_outputs() -> None:
    # Llama 3 8B, all seven projections. r = 8: LLaMA-Factory's log "trainable params: 20,971,520 || all params:
    # 8,051,232,768" (its default rank 8, lora_target all); r = 16: PEFT's print_trainable_parameters
    # "trainable params: 41,943,040 || all params: 8,072,204,288". The base is 8,030,261,248 (HF config).
    assert total_params(LLAMA3_8B) == 8_030_261_248
    assert trainable_params(LLAMA3_8B, Peft("lora", rank=8)) == 20_971_520
    assert trainable_params(LLAMA3_8B, Peft("lora", rank=16)) == 41_943_040
    assert total_params(LLAMA3_8B) + 20_971_520 == 8_051_232_768
    assert total_params(LLAMA3_8B) + 41_943_040 == 8_072_204_288
    # q and v only (the LoRA paper's choice): r * (h + h + h + kv) per layer.
    assert trainable_params(LLAMA3_8B, Peft("lora", rank=8, targets=("q_proj", "v_proj"))) == 32 * 8 * (
        4096 + 4096 + 4096 + 1024)


@pytest.mark.parametrize("rank", [8, 16, 64])
def test_trainable_counts_closed_form(rank: int) -> None:
    # r * (in + out) summed over q, k, v, o, gate, up, down, times the layers.
    for spec in (LLAMA3_8B, LLAMA3_70B):
        h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
        per_layer = rank * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + f))
        assert trainable_params(spec, Peft("lora", rank=rank)) == spec.num_layers * per_layer


def test_nf4_bits_per_param_from_the_qlora_paper() -> None:
    # Dettmers et al. 2023 Sec. 3: constants cost 32/64 = 0.5 bit per parameter, 0.127 with double quantisation,
    # "a reduction of 0.373 bits per parameter, ... approximately 3 GB for a 65B model".
    assert nf4_bits_per_param(double_quant=False) == 4.5
    assert nf4_bits_per_param(double_quant=True) == pytest.approx(4.127, abs=5e-4)
    saved = 65e9 * (nf4_bits_per_param(False) - nf4_bits_per_param(True)) / 8
    assert saved == pytest.approx(3e9, rel=0.05)


# ------------------------------------------------------------------------------------------ model states
# Bytes per parameter, as the tests state them (mixed-precision Adam, Rajbhandari et al. SC20):
# trainable (adapter): 2 weight + 2 gradient (grad_dtype bf16) + 12 Adam (fp32 master, m, v) = 16;
# frozen, LoRA: 2 (bf16) and nothing else; frozen, QLoRA: decoder linears 4.127/8 B (NF4 + double-quantised
# constants), norms, embedding and LM head 2 B.
@pytest.mark.parametrize("model,spec", [("llama3-8b", LLAMA3_8B), ("llama3-70b", LLAMA3_70B)])
@pytest.mark.parametrize("rank", [8, 16, 64])
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_model_state_bytes_closed_form(model: str, spec: object, rank: int, method: str) -> None:
    plan = resolve(scenario_from_dict(scenario(model, method=method, lora={"r": rank}, grad_dtype="bf16")))
    resident, host = states_and_buffers(plan, 0)
    adapters = trainable_params(spec, Peft("lora", rank=rank))  # type: ignore[arg-type]
    total = total_params(spec)  # type: ignore[arg-type]
    layers = spec.num_layers  # type: ignore[attr-defined]
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn  # type: ignore[attr-defined]
    linears = layers * (h * (h + 2 * kv) + h * h + 3 * h * f)
    frozen = 2.0 * total if method == "lora" else 4.127 / 8 * linears + 2.0 * (total - linears)
    assert resident["weights"] == pytest.approx(2 * adapters + frozen, rel=1e-4)
    assert resident["gradients"] == pytest.approx(2 * adapters)
    assert resident["optimizer"] == pytest.approx(12 * adapters)
    assert host == 0.0


def test_frozen_layers_keep_no_gradients_or_optimizer_states() -> None:
    full = resolve(scenario_from_dict(scenario("llama3-8b")))
    frozen = resolve(scenario_from_dict(scenario("llama3-8b", method="frozen", frozen_layers=list(range(16)),
                                                 frozen_embedding=True)))
    layer = 218_112_000  # a Llama 3 8B layer: 4096*(4096+2*1024) + 4096^2 + 3*4096*14336 + 2*4096
    embedding = 128_256 * 4096
    trained = total_params(LLAMA3_8B) - 16 * layer - embedding
    a, b = states_and_buffers(full, 0)[0], states_and_buffers(frozen, 0)[0]
    assert b["weights"] == pytest.approx(a["weights"])  # every weight is still there, in bf16
    assert b["optimizer"] == pytest.approx(12 * trained)
    assert b["gradients"] == pytest.approx(a["gradients"] * trained / total_params(LLAMA3_8B))


# --------------------------------------------------------------------------------------------- compute
def test_frozen_linear_backward_is_its_input_gradient_only() -> None:
    """A frozen layer's backward FLOPs: each linear GEMM once (its input gradient), the attention core twice,
    and no weight gradient; the adapters' GEMMs train (forward, input and weight gradient)."""
    spec, b, s = LLAMA3_8B, 1, 2048
    shape = LayerShape(spec, b, s, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
    base = layer_forward_ops(shape)
    tokens = b * s
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    linear = 2.0 * tokens * (h * (h + 2 * kv) + h * h + 3 * h * f)
    attention = 2.0 * 2 * b * spec.num_attention_heads * s * s * spec.head_dim
    frozen_only = adapt_layer_ops(base, shape, Peft("lora", rank=8, targets=()))
    work = Work(tuple(op for ops in frozen_only.values() for op in ops), 1.0)
    assert work.flops("forward") == linear + attention
    assert work.flops("backward") == linear + 2 * attention
    assert work.flops("input_grad") == linear + 2 * attention
    assert work.flops("weight_grad") == 0.0
    adapted = adapt_layer_ops(base, shape, Peft("lora", rank=8))
    work = Work(tuple(op for ops in adapted.values() for op in ops), 1.0)
    adapter = 2.0 * tokens * 8 * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + f))
    assert work.flops("forward") == linear + attention + adapter
    assert work.flops("backward") == linear + 2 * attention + 2 * adapter
    assert work.flops("weight_grad") == adapter


def test_qlora_dequantises_before_forward_and_input_gradient() -> None:
    spec, tokens = LLAMA3_8B, 2048
    shape = LayerShape(spec, 1, tokens, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
    base = layer_forward_ops(shape)
    ops = [op for block in adapt_layer_ops(base, shape, Peft("qlora", rank=8)).values() for op in block]
    dequant = [op for op in ops if "dequant" in op.name]
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    weights = h * (h + 2 * kv) + h * h + 3 * h * f
    per_pass = weights * (4.127 / 8 + 2)  # read NF4 + constants, write bf16
    assert sum(op.bytes for op in dequant if op.runs_in == "forward") == pytest.approx(per_pass, rel=1e-4)
    assert sum(op.bytes for op in dequant if op.runs_in == "input_grad") == pytest.approx(per_pass, rel=1e-4)


def test_dp_reduces_only_trainable_gradients() -> None:
    from sim.workload.fsdp_units import reduce_buckets
    from sim.workload.optimizer_step import optimizer_params
    plan = resolve(scenario_from_dict({**scenario("llama3-8b", gpus=8, method="lora", lora={"r": 16}),
                                       "fsdp": {"sharding": "FULL_SHARD"}}))
    adapters = trainable_params(LLAMA3_8B, Peft("lora", rank=16))
    assert sum(params for _, params in reduce_buckets(plan)) == pytest.approx(adapters)
    assert optimizer_params(plan, 0) == pytest.approx(adapters / 8)


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("training,message", [
    ({"method": "qlora", "dtype": "fp8"}, "training.dtype: QLoRA dequantises NF4"),
    ({"method": "lora", "frozen_layers": [0]}, "training.frozen_layers: needs method: frozen"),
    ({"method": "frozen"}, "training.frozen_layers: method frozen needs layers"),
    ({"method": "frozen", "frozen_layers": [32]}, "training.frozen_layers: layer 32 is outside 0..31"),
    ({"method": "lora", "lora": {"r": 0}}, "training.lora.r"),
    ({"method": "lora", "lora": {"target_modules": ["q_proj", "q_proj"]}}, "training.lora.target_modules: a module"),
    ({"method": "lora", "lora": {"target_modules": ["c_attn"]}}, "training.lora.target_modules"),
    ({"method": "dora"}, "training.method"),
])
def test_one_line_errors(training: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        scenario_from_dict(scenario("llama3-8b", **training))
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_gate_proj_needs_swiglu() -> None:
    with pytest.raises(ConfigError, match="^training.lora.target_modules: gate_proj needs a SwiGLU MLP"):
        scenario_from_dict(scenario("gpt3-1.3b", method="lora", lora={"target_modules": ["gate_proj"]}))


def test_fits_on_one_gpu() -> None:
    rows = memory_plan(resolve(scenario_from_dict(scenario("llama3-70b", method="qlora", recompute="full"))))
    assert rows[0]["fits"]
    rows = memory_plan(resolve(scenario_from_dict(scenario("llama3-70b", method="lora", recompute="full"))))
    assert not rows[0]["fits"]  # 141 GB of bf16 weights


def test_model_flops() -> None:
    from sim.model.flops import layer_forward_flops, logits_forward_flops, model_flops_per_step
    from sim.model.peft import model_flops_per_step as peft_flops
    spec, s = LLAMA3_8B, 2048
    assert peft_flops(spec, Peft(), 4, s) == pytest.approx(model_flops_per_step(spec, 4, s), rel=1e-12)
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    linear = 2.0 * s * (h * (h + 2 * kv) + h * h + 3 * h * f)
    attention = layer_forward_flops(spec, 1, s) - linear
    adapters = 2.0 * s * trainable_params(spec, Peft("lora", rank=16)) / spec.num_layers
    expected = 32 * (2 * linear + 3 * attention + 3 * adapters) + 2 * logits_forward_flops(spec, 1, s)
    assert peft_flops(spec, Peft("lora", rank=16), 1, s) == pytest.approx(expected, rel=1e-12)


def test_frozen_layers_skip_their_weight_gradients() -> None:
    """method frozen: the frozen layers' backward drops the linears' weight-gradient GEMMs (FLOPs exact in the
    trace), and the estimate follows the simulation."""
    import sim
    from sim.model.layer_ops import layer_forward_ops

    base = scenario("llama3-8b", micro_batch=1, recompute="full")
    full = sim.run(scenario_from_dict(base))
    frozen = sim.run(scenario_from_dict({**base, "training": {**base["training"], "method": "frozen",
                                                              "frozen_layers": list(range(8))}}))
    spec, s = LLAMA3_8B, 2048
    shape = LayerShape(spec, 1, s, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
    linear = sum(op.flops for ops in layer_forward_ops(shape).values() for op in ops if op.has_weights)
    executed = full.trace["flops"].sum() - frozen.trace["flops"].sum()
    assert executed == pytest.approx(8 * linear, rel=1e-9)
    assert frozen.summary.step_time_s < full.summary.step_time_s
    estimate = sim.estimate(scenario_from_dict({**base, "training": {**base["training"], "method": "frozen",
                                                                     "frozen_layers": list(range(8))}}))
    assert estimate.step_time_s == pytest.approx(frozen.summary.step_time_s, rel=0.02)
