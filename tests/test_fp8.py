"""FP8 as Transformer Engine runs it: fp8_autocast makes the linear layers' GEMMs FP8, the attention core stays
bf16 unless Megatron-LM's --fp8-dot-product-attention (``training.fp8_attention``); the parameters and their
gradients stay bf16 (tests/test_grad_dtype.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.api import estimate
from sim.costs.models import RooflineCosts, Work
from sim.hardware.gpus import GPU_PRESETS
from sim.model.attention_ops import ATTENTION_CORE
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.cost_model import make_costs

from conftest import ROOT, make_scenario

H100 = GPU_PRESETS["H100-SXM"]


@pytest.mark.parametrize("flash", [False, True])
def test_fp8_runs_the_linear_gemms_in_fp8_and_the_attention_core_in_bf16(flash: bool) -> None:
    spec = MODEL_PRESETS["llama2-7b"]  # GEMMs large enough to be compute-bound at FP8's peak
    ops = layer_forward_ops(LayerShape(spec, 1, 4096, 1, sequence_parallel=False, elem_bytes=2, flash_attention=flash))
    core = Work(tuple(op for op in ops["attention"] if op.name in ATTENTION_CORE), 0.0)
    linear = Work(tuple(op for op in ops["mlp"] if op.has_weights), 0.0)
    fp8, bf16 = RooflineCosts(H100, "fp8"), RooflineCosts(H100, "bf16")
    fp8_dpa = RooflineCosts(H100, "fp8", fp8_attention=True)
    assert fp8.compute_time(core, "forward") == pytest.approx(bf16.compute_time(core, "forward"))
    assert fp8.compute_time(linear, "forward") == pytest.approx(fp8_dpa.compute_time(linear, "forward"))
    # FP8's dense peak is twice bf16's on H100 (1979 vs 989 TFLOP/s): the linear GEMMs gain, the core does not
    assert fp8.compute_time(linear, "forward") < 0.75 * bf16.compute_time(linear, "forward")
    # FP8 attention gains where the core is compute-bound (flash attention; unfused, the s x s scores through HBM
    # bound it either way)
    if flash:
        assert fp8_dpa.compute_time(core, "forward") < 0.75 * fp8.compute_time(core, "forward")
    else:
        assert fp8_dpa.compute_time(core, "forward") == pytest.approx(fp8.compute_time(core, "forward"))


def test_the_scenario_knob_reaches_the_cost_model() -> None:
    cluster = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}
    training = {"global_batch": 8, "micro_batch": 1, "seq_len": 512, "dtype": "fp8"}
    default = make_costs(resolve(make_scenario(cluster=cluster, training=training)))
    dpa = make_costs(resolve(make_scenario(cluster=cluster, training={**training, "fp8_attention": True})))
    assert isinstance(default, RooflineCosts) and default.bf16 is not None and not default.fp8_attention
    assert isinstance(dpa, RooflineCosts) and dpa.fp8_attention


# ------------------------------------------------------------------------------------- cast/transpose kernels
from sim.costs.models import phase_scale  # noqa: E402
from sim.costs.profile import default_for  # noqa: E402
from sim.model.fp8_casts import CAST_BYTES, CAST_TRANSPOSE_BYTES, TRANSPOSE_BYTES, Fp8Casts  # noqa: E402
from sim.model.hf_config import spec_from_hf_config  # noqa: E402
from sim.model.vocab_ops import head_forward_ops  # noqa: E402


def _cast_bytes(ops: dict[str, tuple], phase: str) -> float:
    return sum(op.bytes * phase_scale(op, phase) for block in ops.values() for op in block if op.runs_in)


@pytest.mark.parametrize("sp", [False, True])
def test_fp8_cast_kernels_bytes_per_pass_follow_transformer_engine(sp: bool) -> None:
    """TE v1.8 Linear/LayerNormLinear with delayed scaling, per layer on one TP rank (closed forms)."""
    spec, b, s, tp, m = MODEL_PRESETS["gpt3-13b"], 2, 2048, 4, 8
    h, f, t = spec.hidden_size, spec.ffn, b * s
    bf16 = LayerShape(spec, b, s, tp, sequence_parallel=sp, elem_bytes=2, flash_attention=True)
    ops = layer_forward_ops(replace(bf16, fp8_casts=Fp8Casts(1.0 / m)))
    weights = (3 * h * h + h * h + 2 * h * f) / tp  # qkv, out_proj, mlp up and down on this rank
    # forward: out_proj and mlp_down inputs cast (+ transposed unless SP), qkv/mlp_up inputs written FP8 by the
    # norm; weights cast with their transpose once per step (1/m per micro-batch)
    standalone_inputs = t * h / tp + t * f / tp
    forward = standalone_inputs * (CAST_BYTES if sp else CAST_TRANSPOSE_BYTES) + weights * CAST_TRANSPOSE_BYTES / m
    assert _cast_bytes(ops, "forward") == pytest.approx(forward)
    # weight-gradient pass: the transposes of the norm-fused inputs (gathered: t x h each), and under SP of the
    # standalone ones
    weight_grad = 2 * t * h * TRANSPOSE_BYTES + (standalone_inputs * TRANSPOSE_BYTES if sp else 0.0)
    assert _cast_bytes(ops, "weight_grad") == pytest.approx(weight_grad)
    # input-gradient pass: output-gradient cast+transpose; row-parallel under SP: cast the t/tp shard, transpose
    # the gathered t x h
    column_outputs = t * 3 * h / tp + t * f / tp
    row = 2 * (t * h / tp * CAST_BYTES + t * h * TRANSPOSE_BYTES) if sp else 2 * t * h * CAST_TRANSPOSE_BYTES
    assert _cast_bytes(ops, "input_grad") == pytest.approx(column_outputs * CAST_TRANSPOSE_BYTES + row)
    assert _cast_bytes(ops, "backward") == pytest.approx(_cast_bytes(ops, "input_grad") + weight_grad)
    # bf16 has none, and the casts ride after their GEMM in the same block
    assert not any(op.runs_in for block in layer_forward_ops(bf16).values() for op in block)
    assert [op.name for op in ops["mlp"]][:5] == ["post_attention_norm", "mlp_up", "mlp_up_input_transpose",
                                                  "mlp_up_weight_cast", "mlp_up_grad_cast"]


def test_fp8_casts_at_tp_1_are_the_same_with_or_without_the_sp_flag() -> None:
    """Sequence parallelism needs TP: Megatron-LM switches it off at tp 1 (arguments.py: 'Disable sequence
    parallelism if tensor parallelism is not used'), and TE's Linear then casts and transposes its input in one
    fused kernel (fp8_cast_transpose_fused), the split cast + transpose being the SP gather's. The FP8 input casts
    of a tp-1 layer with parallel.sequence_parallel true were priced as SP's (the row-parallel gradient rule and
    the LayerShape tokens already require tp > 1): the bundled Mixtral 8x7B layout (tp 1, SP true) in FP8 estimated
    0.05% slower than with SP false (1.9876 against 1.9866 s)."""
    spec, b, s = MODEL_PRESETS["gpt3-13b"], 2, 2048
    casts = Fp8Casts(1.0 / 8)
    ops = {sp: layer_forward_ops(LayerShape(spec, b, s, 1, sequence_parallel=sp, elem_bytes=2, flash_attention=True,
                                            fp8_casts=casts)) for sp in (False, True)}
    for phase in ("forward", "weight_grad", "input_grad"):
        assert _cast_bytes(ops[True], phase) == pytest.approx(_cast_bytes(ops[False], phase)), phase
    steps = [estimate(load_scenario(ROOT / "scenarios" / "mixtral-8x7b_h100-64.yaml",
                                    ["training.dtype=fp8", f"parallel.sequence_parallel={sp}"])).step_time_s
             for sp in ("true", "false")]
    assert steps[0] == steps[1]


def test_weight_cache_and_cast_knobs_reach_the_step() -> None:
    cluster = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}
    training = {"global_batch": 32, "micro_batch": 1, "seq_len": 1024, "dtype": "fp8"}
    model = {**MODEL_PRESETS["llama2-7b"].model_dump(), "num_layers": 2}

    def forward(**extra: object) -> float:
        plan = resolve(make_scenario(cluster=cluster, model=model, training={**training, **extra}))
        costs, blocks = make_costs(plan), blocks_of(plan)
        return sum(costs.compute_time(w, "forward") for w in blocks.block.values())

    from sim.workload.blocks import blocks as blocks_of  # local: the module's name shadows nothing above
    cached, uncached, free = forward(), forward(fp8_weight_cache=False), forward(fp8_cast_kernels=False)
    # 4 micro-batches per rank (dp 8): the cache casts each weight once, not 4 times; no casts is faster still
    spec = MODEL_PRESETS["llama2-7b"]
    weights = spec.hidden_size * (4 * spec.hidden_size + 3 * spec.ffn)
    costs = make_costs(resolve(make_scenario(cluster=cluster, model=model, training=training)))
    per_cast = weights * CAST_TRANSPOSE_BYTES / costs.bytes_rate * costs.factor  # type: ignore[attr-defined]
    assert uncached - cached == pytest.approx(per_cast * (1 - 1 / 4), rel=1e-6)
    assert free < cached


def test_one_pass_kernels_run_only_in_their_pass() -> None:
    from sim.model.ops import Op
    cast = Op("x_grad_cast", 0.0, 1.0, False, runs_in="input_grad")
    assert [phase_scale(cast, p) for p in ("forward", "backward", "input_grad", "weight_grad")] == [0, 1, 1, 0]
    fwd = Op("x_input_cast", 0.0, 1.0, False, runs_in="forward")
    assert [phase_scale(fwd, p) for p in ("forward", "backward", "input_grad", "weight_grad")] == [1, 0, 0, 0]


# ------------------------------------------------------------------------------------------ which GEMMs are FP8
def test_the_lm_head_stays_bf16_under_fp8() -> None:
    """Megatron-LM's output_layer is tensor_parallel.ColumnParallelLinear, outside TE's fp8_autocast."""
    spec = MODEL_PRESETS["llama3-8b"]
    head = Work(head_forward_ops(spec, 1, 8192, 1, 2), 0.0)
    fp8, bf16 = RooflineCosts(H100, "fp8"), RooflineCosts(H100, "bf16")
    assert fp8.compute_time(head, "backward") == pytest.approx(bf16.compute_time(head, "backward"))
    layer = layer_forward_ops(LayerShape(spec, 1, 8192, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True))
    assert all(op.te_linear == op.has_weights for block in layer.values() for op in block)


# ------------------------------------------------------------------------------------- FP8 GEMM rate on bf16's curve
def test_fp8_gemms_follow_the_bf16_curve_at_the_peak_ratio() -> None:
    """An FP8 GEMM of f FLOPs takes a bf16 GEMM's time at f/2 (H100: peaks 1979 / 989 TFLOP/s)."""
    profile = default_for("H100-SXM")
    fp8, bf16 = RooflineCosts(H100, "fp8", profile), RooflineCosts(H100, "bf16", profile)
    ratio = 1979 / 989
    for flops in (1e9, 1e10, 1e11, 1e13):
        assert fp8.gemm_rate(flops) == pytest.approx(ratio * bf16.gemm_rate(flops / ratio))
    # large GEMMs: twice bf16's plateau, 1,600 TFLOP/s, as cuBLASLt measures FP8 8192^3 on H100 (~1,610)
    assert fp8.gemm_rate(1e13) == pytest.approx(ratio * bf16.gemm_rate(1e13))
    assert 1.55e15 < fp8.gemm_rate(1e13) < 1.65e15
    # small ones gain little: a 1 GFLOP GEMM is ~1.1x faster in FP8, not 2x
    assert fp8.gemm_rate(1e9) / bf16.gemm_rate(1e9) < 1.2
    # the profile rule keeps the old flat FP8 rate (no H100 fp8 curve)
    flat = RooflineCosts(H100, "fp8", profile, fp8_gemm="profile")
    assert flat.gemm_rate(1e9) == pytest.approx(1979e12 * H100.matmul_efficiency)


def test_the_bf16_scaling_rule_predicts_b200s_measured_fp8_curve() -> None:
    """B200's OpenXLA table has both curves within the dense peak: the rule predicts its FP8/bf16 ratio within
    0.15 over 3e8..1e13 FLOPs (measured 1.06 at 3e8, 1.37 at 1e10, 1.96 at 1e12)."""
    b200 = GPU_PRESETS["B200"]
    profile = default_for("B200")
    scaled = RooflineCosts(b200, "fp8", profile)
    measured = RooflineCosts(b200, "fp8", profile, fp8_gemm="profile")
    for flops in (3e8, 1e9, 3e9, 1e10, 3e10, 1e11, 3e11, 1e12, 1e13):
        assert scaled.gemm_rate(flops) / measured.gemm_rate(flops) == pytest.approx(1.0, abs=0.12)


# ---------------------------------------------------------------------------------------------- squared ReLU
def test_squared_relu_mlp_has_two_matrices_and_two_elementwise_passes() -> None:
    gelu = MODEL_PRESETS["gpt3-13b"]
    sq = gelu.model_copy(update={"mlp": "squared_relu"})
    from sim.model.flops import layer_forward_flops
    from sim.model.params import layer_params
    assert layer_params(sq) == layer_params(gelu)
    assert layer_forward_flops(sq, 1, 2048) == layer_forward_flops(gelu, 1, 2048)
    shapes = {m: LayerShape(spec, 1, 2048, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
              for m, spec in (("gelu", gelu), ("sq", sq))}
    act = {m: next(op for op in layer_forward_ops(shape)["mlp"] if op.name == "mlp_activation")
           for m, shape in shapes.items()}
    assert act["sq"].bytes == pytest.approx(2 * act["gelu"].bytes)  # torch.pow(F.relu(x), 2): two kernels
    hf = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 256000,
          "max_position_embeddings": 4096, "intermediate_size": 16384, "hidden_act": "relu2"}
    assert spec_from_hf_config(hf, "nemotron")["mlp"] == "squared_relu"
