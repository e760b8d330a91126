"""Megatron-Core's selective recomputation by module (``training.recompute_modules``: --recompute-granularity
selective --recompute-modules ...) and the embedding / loss layer slots of the pipeline split
(``parallel.account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``), which the
Qwen3-235B-A22B rows of Megatron-MoE-ModelZoo need (scenarios/validation/moe)."""

from __future__ import annotations

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore.estimate import estimate
from sim.model.memory import activation_bytes_per_layer
from sim.model.presets import MODEL_PRESETS
from sim.parallel.grid import chunk_sizes
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.blocks import blocks
from sim.workload.cost_model import make_costs
from sim.workload.moe_layer import moe_recompute

from conftest import SCENARIOS

QWEN3_PP32 = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-a2a-pp32.yaml"


# ------------------------------------------------------------------------------------------ pipeline slots
@pytest.mark.parametrize("args, sizes", [
    # Qwen3-235B (94 layers) + embedding + loss = 96 slots over pp 8 x vpp 4: 3 per chunk, 2 in the end chunks
    ((94, 8, 4, None, None, True, True), [2] + [3] * 30 + [2]),
    # over pp 32 x vpp 3: one slot per chunk; the first chunk is the embedding alone, the last the loss alone
    ((94, 32, 3, None, None, True, True), [0] + [1] * 94 + [0]),
    ((23, 8, 1, None, None, True, False), [2] + [3] * 7),
    ((23, 4, 2, None, None, False, True), [3] * 7 + [2]),
])
def test_embedding_and_loss_take_a_layer_slot(args, sizes) -> None:
    assert list(chunk_sizes(*args)) == sizes
    assert sum(sizes) == args[0]


def _qwen3(**overrides):
    return load_scenario(QWEN3_PP32, [f"{key}={value}" for key, value in overrides.items()])


def test_the_pp32_layout_puts_two_layers_on_the_end_stages() -> None:
    plan = resolve(_qwen3())
    assert [plan.stage_layers(s) for s in range(32)] == [2] + [3] * 30 + [2]
    assert plan.chunk_layers(0) == range(0, 0) and plan.chunk_layers(95) == range(94, 94)
    assert plan.holds_embedding(0) and plan.holds_head(31)


@pytest.mark.parametrize("overrides, message", [
    ({"parallel.account_for_loss_in_pipeline_split": "false"},
     "parallel.account_for_embedding_in_pipeline_split: model.num_layers + 1 = 95 does not split evenly over "
     "pp*vpp = 96 model chunks"),
    ({"parallel.vpp": 1, "parallel.first_stage_layers": 2, "parallel.dp": 4},
     "parallel.first_stage_layers: not with parallel.account_for_embedding/loss_in_pipeline_split"),
    ({"training.recompute_modules": "[mla_up_proj]"},
     "training.recompute_modules: mla_up_proj needs multi-head latent attention"),
    ({"training.recompute_modules": "[mlp]"}, "training.recompute_modules: mlp recomputes dense MLPs"),
    ({"training.recompute_modules": "[shared_experts]"}, "training.recompute_modules: shared_experts needs a shared"),
    ({"training.recompute_modules": "[attn]"}, "training.recompute_modules.0: Input should be"),
])
def test_bad_combinations_are_one_line_errors(overrides, message) -> None:
    with pytest.raises(ConfigError) as error:
        _qwen3(**overrides)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------ memory
def test_kept_activations_lose_what_each_module_recomputes() -> None:
    """Per MoE layer of Qwen3-235B (tp 2 with SP, etp 1, flash attention), what each module drops, in closed form:
    layernorm the QKV and MLP inputs (2sbh each, sharded by SP); moe_act the routed experts' activation output
    (routed tokens x 2 moe_ffn bytes); moe everything the MoE layer kept past its input."""
    spec = MODEL_PRESETS["qwen3-235b-a22b"]
    s, b, tp, h, E, k, f = 4096, 1, 2, 4096, 128, 8, 1536
    T, routed = s * b, s * b * k / tp

    def kept(*modules: str) -> float:
        return activation_bytes_per_layer(spec, b, s, tp, True, "selective", True, moe=True, routed_tokens=routed,
                                          modules=frozenset(modules))

    base = kept()
    assert base - kept("layernorm") == pytest.approx(4 * T * h / tp, rel=1e-12)
    assert base - kept("moe_act") == pytest.approx(routed * 2 * f, rel=1e-12)
    rank_tokens = T / tp
    moe_part = 2 * rank_tokens * E + 2 * routed * h + routed * 6 * f + 2 * rank_tokens * k * h
    assert base - kept("moe") == pytest.approx(moe_part, rel=1e-12)
    assert kept("moe", "moe_act") == kept("moe")
    # Without recompute_modules, selective means Megatron's default, core_attn (Korthikanti's).
    assert activation_bytes_per_layer(spec, b, s, tp, True, "selective", True, moe=True,
                                      routed_tokens=routed) == kept("core_attn")


def test_dense_mlp_and_attention_core_modules() -> None:
    """A dense GPT layer without flash attention (Korthikanti et al. 2022 Table 2 with SP: sbh(34/t + 5as/(ht))):
    core_attn drops 5as/h sbh/t, mlp the 4h-wide MLP's fc1 and GeLU outputs (16 sbh/t), layernorm 4 sbh/t."""
    spec = MODEL_PRESETS["gpt3-175b"]
    s, b, tp, h, a = 2048, 1, 8, 12288, 96
    sbh = s * b * h
    none = activation_bytes_per_layer(spec, b, s, tp, True, "none")
    assert none == pytest.approx(sbh * (34 / tp + 5 * a * s / (h * tp)), rel=1e-12)

    def dropped(*modules: str) -> float:
        return none - activation_bytes_per_layer(spec, b, s, tp, True, "selective", modules=frozenset(modules))

    assert dropped("core_attn") == pytest.approx(5 * a * s * s * b / tp, rel=1e-12)
    assert dropped("mlp") == pytest.approx(16 * sbh / tp, rel=1e-12)
    assert dropped("layernorm") == pytest.approx(4 * sbh / tp, rel=1e-12)


def test_the_modules_are_read_only_under_selective_recomputation() -> None:
    """As Megatron-Core: --recompute-modules matters only with --recompute-granularity selective."""
    full, none = resolve(_qwen3(**{"training.recompute": "full"})), resolve(_qwen3(**{"training.recompute": "none"}))
    assert full.recompute_modules == none.recompute_modules == frozenset()
    assert none.activation_bytes(moe=True) == resolve(_qwen3()).activation_bytes("none", moe=True)


def test_the_layer_being_recomputed_holds_what_its_modules_dropped() -> None:
    plan = resolve(_qwen3())
    full = plan.activation_bytes("none", moe=True)
    dropped = resolve(_qwen3(**{"training.recompute_modules": "[core_attn]"})).activation_bytes(moe=True) - \
        plan.activation_bytes(moe=True)
    assert plan.rebuild_bytes == pytest.approx(dropped, rel=1e-12) and 0 < dropped < full


# ------------------------------------------------------------------------------------------ time and trace
@pytest.fixture(scope="module")
def small():
    """Qwen3-235B cut to 4 layers on 16 GPUs (tp 2, pp 2, vpp 1, ep 8): a few seconds to simulate."""
    def run(modules: str | None):
        overrides = ["model.num_layers=4", "model.moe_layer_freq=1", "cluster.nodes=2", "parallel.dp=4",
                     "parallel.pp=2", "parallel.vpp=1", "parallel.ep=8", "training.global_batch=16",
                     "schedule=1f1b", "parallel.account_for_embedding_in_pipeline_split=false",
                     "parallel.account_for_loss_in_pipeline_split=false"]
        if modules is None:
            overrides.append("training.recompute=none")
            overrides.append("training.recompute_modules=null")
        else:
            overrides.append(f"training.recompute_modules={modules}")
        return runner.run(load_scenario(QWEN3_PP32, overrides))
    return run


def test_each_module_adds_its_forward_to_the_backward(small) -> None:
    """On rank 0, the recompute tasks of one layer and micro-batch are exactly the replayed ops' forward prices:
    layernorm both norms, moe_act the experts' activation; moe the whole MoE forward with its dispatch and combine
    all-to-alls again (twice the ep exchanges of the step without it)."""
    none = small(None)
    norm_act = small("[layernorm,moe_act]")
    plan = resolve(norm_act.scenario)
    costs = make_costs(plan)
    attention = costs.compute_time(blocks(plan).recompute["attention"], "forward")
    moe = moe_recompute(plan)
    router, act = (costs.compute_time(moe[name], "forward") for name in ("moe_router", "moe_experts"))
    assert [op.name for op in blocks(plan).recompute["attention"].ops] == ["input_norm"]
    assert [op.name for op in moe["moe_router"].ops] == ["post_attention_norm"]
    assert [op.name for op in moe["moe_experts"].ops] == ["experts_activation"]
    trace = norm_act.trace
    redo = trace[(trace["kind"] == "recompute") & (trace["rank"] == 0) & (trace["layer"] == 0)
                 & (trace["microbatch"] == 0)]
    assert sorted(redo["end_s"] - redo["start_s"]) == pytest.approx(sorted([attention, router, act]), rel=1e-9)
    assert norm_act.summary.step_time_s > none.summary.step_time_s
    whole = small("[moe]").trace
    ep = lambda t: len(t[(t["stream"] == "ep") & (t["rank"] == 0)])  # noqa: E731
    assert ep(whole) == 3 * ep(none.trace) // 2  # per layer: forward 2, backward 2, and now recompute 2


@pytest.mark.parametrize("modules", ["[layernorm,moe_act]", "[moe]", "[layernorm,moe]", "[core_attn,shared_experts]"])
def test_estimate_follows_the_simulation(small, modules) -> None:
    if modules == "[core_attn,shared_experts]":  # Qwen3 has no shared expert: the rule says so
        with pytest.raises(ConfigError):
            small(modules)
        return
    run = small(modules)
    assert estimate(run.scenario).step_time_s == pytest.approx(run.summary.step_time_s, rel=0.03)


def test_the_qwen3_pp32_row_runs() -> None:
    """The row loads and runs: 96 chunks of one slot, the end chunks empty."""
    run = runner.run(_qwen3())
    forward = run.trace[(run.trace["kind"] == "forward") & (run.trace["layer"] >= 0)]
    assert sorted(forward[forward["stage"] == 0]["layer"].unique()) == [31, 63]  # chunks 0 (empty), 32, 64
    assert sorted(forward[forward["stage"] == 31]["layer"].unique()) == [30, 62]  # chunks 31, 63, 95 (empty)
