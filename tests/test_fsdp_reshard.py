"""``fsdp.reshard_after_forward`` (issue 24): FSDP2's ``fully_shard(reshard_after_forward=...)``, TorchTitan's
``parallelism.fsdp_reshard_after_forward``. false keeps each unit gathered from its forward to its backward, which is
SHARD_GRAD_OP; null is the framework default (true with pp 1, false with pp > 1: TorchTitan's policy 'default')."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from sim.errors import ConfigError
from sim.model.params import total_params
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.footprint import memory_plan

SCENARIOS = Path(__file__).parent.parent / "scenarios"
FSDP = SCENARIOS / "llama2-7b_h100-16_fsdp.yaml"


def gathers(run: sim.RunResult) -> dict[str, int]:
    rank = run.trace[run.trace["rank"] == run.trace["rank"].iloc[0]]
    return rank["name"].value_counts().reindex(["param_gather_fwd", "param_gather_bwd"], fill_value=0).to_dict()


def test_no_reshard_after_forward_is_shard_grad_op() -> None:
    # Llama 2 7B, 16 GPUs, 1 micro-batch x 32 layers: a gather per unit in the forward (32) and again in the
    # backward (32) by default; none in the backward with false, exactly as SHARD_GRAD_OP.
    default = sim.run(FSDP)
    kept = sim.run(FSDP, ["fsdp.reshard_after_forward=false"])
    grad_op = sim.run(FSDP, ["fsdp.sharding=SHARD_GRAD_OP"])
    assert gathers(default) == {"param_gather_fwd": 32, "param_gather_bwd": 32}
    assert gathers(kept) == gathers(grad_op) == {"param_gather_fwd": 32, "param_gather_bwd": 0}
    assert kept.summary.step_time_s == grad_op.summary.step_time_s
    assert kept.summary.peak_memory_bytes.max == grad_op.summary.peak_memory_bytes.max
    # explicit true is the default with pp 1
    assert sim.run(FSDP, ["fsdp.reshard_after_forward=true"]).summary.step_time_s == \
        default.summary.step_time_s


def test_no_reshard_keeps_the_whole_model_gathered_in_the_bound() -> None:
    # The bound's gathered weights with false: every parameter in bf16 (6,738,415,616 x 2 B), against the root
    # unit and two layers with the default.
    plan = resolve(load_scenario(FSDP, overrides=["fsdp.reshard_after_forward=false"]))
    assert total_params(MODEL_PRESETS["llama2-7b"]) == 6_738_415_616
    assert memory_plan(plan)[0]["gathered_weights"] == 2 * 6_738_415_616


def test_with_pipelines_the_default_is_no_reshard() -> None:
    # FSDP + PP: unset and false are the same run (each unit gathered once per step).
    base = SCENARIOS / "llama3.1-405b_h100-16384.yaml"
    unset = sim.run(base, ["fsdp.reshard_after_forward=null"])
    kept = sim.run(base, ["fsdp.reshard_after_forward=false"])
    assert unset.summary.step_time_s == kept.summary.step_time_s
    assert unset.summary.peak_memory_bytes.max == kept.summary.peak_memory_bytes.max


@pytest.mark.parametrize("overrides, message", [
    (["fsdp.sharding=SHARD_GRAD_OP", "fsdp.reshard_after_forward=true"], "contradicts fsdp.sharding SHARD_GRAD_OP"),
    (["fsdp.sharding=HYBRID_SHARD", "fsdp.reshard_after_forward=false"], "with HYBRID_SHARD is not modelled"),
    (["fsdp.sharding=NO_SHARD", "fsdp.reshard_after_forward=false"], "NO_SHARD never shards"),
    (["parallel.pp=2", "parallel.dp=8", "fsdp.reshard_after_forward=true"], "with parallel.pp = 2"),
])
def test_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"fsdp.reshard_after_forward: .*{message}") as error:
        load_scenario(FSDP, overrides=overrides)
    assert "\n" not in str(error.value)
