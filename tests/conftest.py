"""Shared helpers: small scenarios built in code, and the repository paths."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sim.spec.scenario import Scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
DATA = Path(__file__).resolve().parent / "data"

BASE: dict[str, Any] = {
    "name": "test",
    "cluster": {"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 8},
    "model": {"name": "t", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
              "vocab_size": 1024, "max_seq_len": 512},
    "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 512},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
}


def make_scenario(**sections: Any) -> Scenario:
    """BASE with whole sections replaced or merged: make_scenario(parallel={"tp": 2}, costs="roofline")."""
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return scenario_from_dict(data)


def pipeline_scenario(p: int, m: int, schedule: str, forward: str = "1 s", backward: str = "2 s",
                      layers_per_stage: int = 1, vpp: int = 1, weight_grad: str = "0 s") -> Scenario:
    """p stages on p GPUs, m micro-batches, fixed per-layer costs and an ideal network."""
    return make_scenario(
        cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": p},
        model={**BASE["model"], "num_layers": p * layers_per_stage},
        training={"global_batch": m, "micro_batch": 1, "seq_len": 512},
        parallel={"tp": 1, "pp": p, "dp": 1, "vpp": vpp},
        schedule=schedule,
        costs={"model": "fixed", "forward": forward, "backward": backward, "weight_grad": weight_grad},
        network="ideal",
    )


@pytest.fixture(scope="session")
def bundled_scenarios() -> list[Path]:
    return sorted(SCENARIOS.glob("*.yaml"))
