"""Shared helpers: small scenarios built in code, and the repository paths."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sim import runner
from sim.runner import RunResult
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict

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


def small_moe_model(name: str, num_layers: int, hidden_size: int, heads: int, ffn_hidden_size: int,
                    max_seq_len: int) -> dict[str, Any]:
    """The model section of a small Llama-style MoE (SwiGLU, RoPE, RMSNorm, no bias, untied embeddings, 32k
    vocabulary) with 8 experts, top-2, as the MoE tests build it."""
    return {"name": name, "num_layers": num_layers, "hidden_size": hidden_size, "num_attention_heads": heads,
            "num_kv_heads": heads, "ffn_hidden_size": ffn_hidden_size, "vocab_size": 32000,
            "max_seq_len": max_seq_len, "mlp": "swiglu", "position_embedding": "rope", "norm": "rmsnorm",
            "tied_embeddings": False, "bias": False, "num_moe_experts": 8, "moe_router_topk": 2}


def one_moe_layer(name: str, moe: dict[str, Any], changes: dict[str, Any],
                  costs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The EP A2A overlap tests' scenario document: one MoE layer, no pipeline (1F1B), ep 8 over one H100 node, the
    flex dispatcher's settings in ``moe``, global batch 64 over dp 8 (8 micro-batches of 4096 tokens), ``costs``
    (the default costs when None); ``changes`` merge into its sections (a dict into a section, anything else
    replaces it)."""
    doc: dict[str, Any] = {
        "name": name, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=1, hidden_size=2048, heads=16, ffn_hidden_size=4096,
                                 max_seq_len=4096),
        "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1},
        "moe": {"token_dispatcher": "flex", **moe},
        "schedule": "1f1b",
    }
    if costs is not None:
        doc["costs"] = costs
    for section, values in changes.items():
        doc[section] = {**doc.get(section, {}), **values} if isinstance(values, dict) else values
    return doc


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` first, otherwise in collection order (a stable sort). Under pytest-xdist a
    worker takes new tests as it finishes, so the long ones starting first keeps both workers busy to the end,
    instead of one of them running a 10 s search last while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def bundled_scenarios() -> list[Path]:
    return sorted(SCENARIOS.glob("*.yaml"))


@pytest.fixture(scope="session")
def bundled_run() -> Callable[[str], RunResult]:
    """bundled_run("tiny.yaml"): the run of scenarios/tiny.yaml as shipped, simulated once per session and shared
    (test_trace_invariants and test_estimate both read every bundled scenario's run; the 175B one takes over a
    second). Tests read it and never modify it. Tests that use it are in the xdist_group "bundled-runs", so
    under pytest-xdist they share one worker's runs."""
    runs: dict[str, RunResult] = {}

    def get(name: str) -> RunResult:
        if name not in runs:
            runs[name] = runner.run(load_scenario(SCENARIOS / name))
        return runs[name]

    return get


# A NeMo 2.0 MoE model config on one node of 8 GPUs (ep 8, 8 experts top-2), for the importer tests to extend with
# the keys they test (tests/test_deepep.py, tests/test_forced_balance.py)
NEMO_MOE_MODEL = """trainer: {num_nodes: 1, devices: 8, precision: bf16-mixed}
model:
  micro_batch_size: 1
  global_batch_size: 16
  encoder_seq_length: 2048
  max_position_embeddings: 2048
  num_layers: 4
  hidden_size: 1024
  ffn_hidden_size: 4096
  num_attention_heads: 8
  vocab_size: 32000
  expert_model_parallel_size: 8
  num_moe_experts: 8
  moe_router_topk: 2
"""
