"""FSDP's root unit in the memory bound and the timeline (issue 28, workload.footprint.root_unit_bytes): the
parameters no per-layer unit owns (embedding, final norm, LM head) stay gathered from the forward's start to the
backward's end (FSDP2 ``FSDPState._lazy_init``: the root is not resharded after forward; FSDP1
``_post_forward_reshard`` alike), beside two layer units (the one computing, the one prefetched)."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from sim.model.params import embedding_params, head_params, layer_params
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.footprint import memory_plan, memory_timeline, root_unit_bytes

SCENARIOS = Path(__file__).parent.parent / "scenarios"


def test_full_training_fsdp_holds_the_root_and_two_layers() -> None:
    # Llama 2 7B FULL_SHARD over 16 GPUs: root = 2 x 32000 x 4096 + 4096 parameters, a layer 202,383,360; in bf16
    # the bound and the simulated timeline both hold 2 x (262,148,096 + 2 x 202,383,360) B = 1.242 GiB.
    spec = MODEL_PRESETS["llama2-7b"]
    root, layer = embedding_params(spec) + head_params(spec), layer_params(spec).total
    assert (root, layer) == (262_148_096, 202_383_360)
    run = sim.run(SCENARIOS / "llama2-7b_h100-16_fsdp.yaml")
    assert root_unit_bytes(run.plan) == 2 * root
    bound = memory_plan(run.plan)[0]["gathered_weights"]
    timeline = max(rank["gathered_weights"] for rank in memory_timeline(run.trace, run.plan).values())
    assert bound == timeline == pytest.approx(2 * (root + 2 * layer))


def test_lora_fsdp_timeline_equals_the_bound() -> None:
    # The frozen base lets the backward's first gather start while the last unit's forward runs; it waits for
    # that unit's reshard, and the gather that waits for a unit's compute comes after its free: 7.111 GiB
    # (root 3.914 + two layers with their adapters 2 x 1.599), no longer 8.709.
    run = sim.run(SCENARIOS / "llama3-70b_h100-8_lora_fsdp.yaml")
    bound = memory_plan(run.plan)[0]
    timeline = max(memory_timeline(run.trace, run.plan).values(), key=lambda parts: parts["total"])
    assert timeline["gathered_weights"] == pytest.approx(bound["gathered_weights"], rel=1e-12)
    assert bound["gathered_weights"] / 2**30 == pytest.approx(7.111, abs=1e-3)
    assert timeline["total"] <= bound["total"]


@pytest.mark.parametrize("overrides", [
    ["fsdp=null", "parallel.zero=3"],  # DeepSpeed-style ZeRO-3: the embedding and the head gathered per module
    ["fsdp.sharding=SHARD_GRAD_OP"],  # every unit stays gathered anyway
])
def test_no_root_unit_outside_fsdp_full_shard(overrides: list[str]) -> None:
    plan = resolve(load_scenario(SCENARIOS / "llama2-7b_h100-16_fsdp.yaml", overrides=overrides))
    assert root_unit_bytes(plan) == 0.0
