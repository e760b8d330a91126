"""Two knobs of the software stack: unfused (PyTorch eager) element-wise kernels and full recomputation of only
some layers (Megatron-LM's --recompute-method block --recompute-num-layers N; fms-fsdp's selective
checkpointing of a fraction of the blocks)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from sim import runner
from sim.cli import commands as cli
from sim.explore.estimate import estimate
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.memory import activation_bytes_per_layer
from sim.model.ops import EAGER_RMSNORM_BYTES, EAGER_ROPE_BYTES
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.footprint import stage_memory

from conftest import SCENARIOS

LLAMA_13B = SCENARIOS / "validation" / "ibm-fsdp-llama2-13b-a100-128.yaml"


def _bytes(ops: tuple) -> dict[str, float]:
    return {op.name: op.bytes for op in ops}


@pytest.mark.parametrize("model", ["llama2-7b", "llama2-70b"])
def test_eager_kernels_move_the_counted_bytes_and_leave_the_gemms_alone(model: str) -> None:
    spec = MODEL_PRESETS[model]
    b, s = 2, 4096
    tokens, h, kv, f = b * s, spec.hidden_size, spec.kv_dim, spec.ffn
    shape = LayerShape(spec, b, s, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
    fused = layer_forward_ops(replace(shape, fused_kernels=True))
    eager = layer_forward_ops(replace(shape, fused_kernels=False))
    for block in ("attention", "mlp"):
        assert {op.name: op.flops for op in fused[block] if op.matmul} == \
            {op.name: op.flops for op in eager[block] if op.matmul}
    f_att, e_att = _bytes(fused["attention"]), _bytes(eager["attention"])
    assert e_att["input_norm"] - f_att["input_norm"] == tokens * h * (EAGER_RMSNORM_BYTES - 4)
    assert e_att["rotary_embedding"] == tokens * (h + kv) * EAGER_ROPE_BYTES  # q and k, fp32 math
    assert e_att["attention_transpose"] == tokens * h * 4
    assert f_att["attn_dropout_residual"] - e_att["attn_dropout_residual"] == tokens * h  # no dropout mask
    f_mlp, e_mlp = _bytes(fused["mlp"]), _bytes(eager["mlp"])
    assert e_mlp["mlp_activation"] - f_mlp["mlp_activation"] == tokens * f * 4  # silu written, then multiplied
    assert "rotary_embedding" not in f_att and "attention_transpose" not in f_att


def test_eager_kernels_slow_the_step_by_their_bytes_over_hbm() -> None:
    fused = runner.run(load_scenario(LLAMA_13B, ["training.fused_kernels=true"])).summary.step_time_s
    eager = runner.run(load_scenario(LLAMA_13B)).summary.step_time_s
    assert 1.05 < eager / fused < 1.30  # memory-bound extras of a compute-bound layer


@pytest.fixture(scope="module")
def partial() -> dict[int, tuple]:
    runs = {}
    for n in (0, 10, 20, 40):
        scenario = load_scenario(LLAMA_13B, [f"training.recompute_num_layers={n}"])
        runs[n] = (scenario, runner.run(scenario))
    return runs


def test_only_the_first_n_layers_are_recomputed(partial: dict[int, tuple]) -> None:
    for n, (_, result) in partial.items():
        trace = result.trace
        recomputed = trace[(trace["kind"] == "recompute") & (trace["rank"] == 0)]
        assert sorted(recomputed["layer"].unique()) == list(range(n))
        assert len(recomputed) == 2 * n  # attention and MLP blocks, one micro-batch


def test_step_time_is_linear_in_the_recomputed_layers(partial: dict[int, tuple]) -> None:
    none = runner.run(load_scenario(LLAMA_13B, ["training.recompute=none", "training.recompute_num_layers=null"]))
    steps = {n: result.summary.step_time_s for n, (_, result) in partial.items()}
    assert steps[0] == none.summary.step_time_s
    assert steps[0] < steps[10] < steps[20] < steps[40]
    # Each recomputed layer adds one forward on the compute stream, which FSDP's overlap does not hide.
    assert steps[20] - steps[0] == pytest.approx(2 * (steps[10] - steps[0]), rel=0.02)
    assert steps[40] - steps[20] == pytest.approx(steps[20] - steps[0], rel=0.02)


def test_memory_plan_keeps_the_other_layers_whole_and_the_trace_agrees(partial: dict[int, tuple]) -> None:
    scenario, result = partial[20]
    t, p = scenario.training, scenario.parallel
    seq_len = resolve(scenario).seq_len
    full = activation_bytes_per_layer(scenario.model, t.micro_batch, seq_len, p.tp, False, "full", True)
    whole = activation_bytes_per_layer(scenario.model, t.micro_batch, seq_len, p.tp, False, "none", True)
    # 20 layers keep only their input, 20 keep everything, plus the one layer being rebuilt.
    expected = 20 * full + 20 * whole + whole
    planned = stage_memory(resolve(scenario), 0)["activations"]
    assert planned == pytest.approx(expected)
    traced = result.summary.memory_breakdown_bytes["0"]["activations"]  # peak from the trace's stash/free
    assert traced == pytest.approx(expected, rel=0.01)
    assert estimate(scenario).peak_memory_bytes == pytest.approx(result.summary.peak_memory_bytes.max,
                                                                 rel=0.05)


def test_estimate_follows_the_recomputed_share(partial: dict[int, tuple]) -> None:
    for n, (scenario, result) in partial.items():
        assert estimate(scenario).step_time_s == pytest.approx(result.summary.step_time_s, rel=0.05), n


@pytest.mark.parametrize("overrides, message", [
    (["training.recompute=selective"], "training.recompute_num_layers: needs recompute: full (got selective)"),
    (["training.recompute_num_layers=41"], "training.recompute_num_layers: 41 exceeds the 40 layers of a model chunk"),
])
def test_bad_recompute_num_layers_is_one_line_naming_the_field(overrides, message, capsys) -> None:
    assert cli.main(["check", str(LLAMA_13B), *[a for o in overrides for a in ("--set", o)]]) == 2
    assert message in capsys.readouterr().err


def test_a_pipeline_chunk_recomputes_its_own_first_layers() -> None:
    gpt3 = SCENARIOS / "gpt3-175b_a100-1024.yaml"
    scenario = load_scenario(gpt3, ["training.global_batch=128", "parallel.dp=null", "training.recompute=full",
                                    "training.recompute_num_layers=3", "schedule=interleaved", "parallel.vpp=2"])
    trace = runner.run(scenario).trace
    layers = trace[(trace["kind"] == "recompute") & (trace["rank"] == 0)]["layer"].unique()
    per_chunk = resolve(scenario).degrees.layers_per_chunk
    assert per_chunk == 6 and pd.Series(layers % per_chunk).max() == 2
    assert sorted(layers) == [0, 1, 2, 48, 49, 50]  # stage 0 holds chunks 0 and 8 of 16


def test_causal_flash_attention_computes_the_tiles_on_and_below_the_diagonal():
    """FlashAttention-2 (Dao 2023, Sec. 3.1.1) skips score tiles above the diagonal: n(n+1)/2 of n^2 tiles of 128."""
    from sim.model.flash_tiles import causal_fraction

    assert causal_fraction(2048) == 17 / 32 and causal_fraction(8192) == 65 / 128 and causal_fraction(128) == 1.0
    assert causal_fraction(200) == 3 / 4  # two tiles per row: the diagonal pair and one below
    spec = MODEL_PRESETS["llama2-7b"]
    shape = LayerShape(spec, 2, 4096, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True)
    full, causal = (next(op for op in layer_forward_ops(replace(shape, causal=c))["attention"]
                         if op.name == "flash_attention") for c in (False, True))
    assert full.flops == causal.flops == 2 * 2 * 2 * 32 * 4096 * 4096 * 128  # 4 b s^2 h: Megatron's count (MFU)
    assert (full.executed, causal.executed) == (1.0, 33 / 64) and causal.bytes == full.bytes


def test_eager_layernorm_is_one_kernel_and_eager_rmsnorm_eight():
    """PyTorch's LayerNorm is one fused ATen kernel (layer_norm_kernel.cu); a Python RMSNorm (HF/FMS Llama) is
    eight element-wise kernels moving 52 bytes per element as measured (EAGER_RMSNORM_BYTES,
    tests/test_eager_kernels.py)."""
    llama = MODEL_PRESETS["llama2-7b"]
    gpt = llama.model_copy(update={"norm": "layernorm"})
    shapes = {name: LayerShape(spec, 1, 1024, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True,
                               fused_kernels=False) for name, spec in (("rms", llama), ("ln", gpt))}
    norm = {name: next(op for op in layer_forward_ops(shape)["attention"] if op.name == "input_norm")
            for name, shape in shapes.items()}
    assert norm["ln"].kernels == 1 and norm["ln"].bytes == 1024 * 4096 * 2 * 2
    assert norm["rms"].kernels == 8 and norm["rms"].bytes == 1024 * 4096 * 52
