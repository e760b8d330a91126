"""The H20, GB300, MI300X and MI325X presets (GPU and node, cited public specs), and NVLink domains that need not
divide the GPU count (a GB200 NVL72 cluster of 256 GPUs: 3 full racks and 40 GPUs of a fourth)."""

from __future__ import annotations

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS
from sim.spec.scenario import scenario_from_dict

GB, T = 1e9, 1e12


def scenario(gpu: str, nodes: int, **parallel) -> dict:
    return {"name": f"{gpu}-test", "cluster": {"gpu": gpu, "nodes": nodes}, "model": {"preset": "llama2-7b",
            "num_layers": 4}, "training": {"global_batch": 64, "seq_len": 2048}, "parallel": parallel}


@pytest.mark.parametrize("gpu, bf16, fp8, hbm, hbm_bw, watts, node", [
    ("H20", 148 * T, 296 * T, 96 * GB, 4.0e12, 400, "hgx-h20"),
    ("GB300", 2500 * T, 5000 * T, 288 * GB, 8e12, 1400, "gb300-nvl72"),
    ("MI300X", 1307.4 * T, 2614.9 * T, 192 * GB, 5.3e12, 750, "amd-mi300x-platform"),
    ("MI325X", 1307.4 * T, 2614.9 * T, 256 * GB, 6.0e12, 1000, "amd-mi300x-platform"),
])
def test_new_presets_carry_their_datasheet_figures(gpu, bf16, fp8, hbm, hbm_bw, watts, node):
    spec = GPU_PRESETS[gpu]
    assert (spec.peak("bf16"), spec.peak("fp8"), spec.hbm_capacity, spec.hbm_bandwidth, spec.board_power) == \
        (bf16, fp8, hbm, hbm_bw, watts)
    assert spec.peak("fp8") == pytest.approx(2 * spec.peak("bf16"), rel=1e-4) and spec.source
    assert DEFAULT_NODE_FOR_GPU[gpu] == node


def test_node_line_rates():
    assert NODE_PRESETS["hgx-h20"].intra_node.bandwidth == NODE_PRESETS["dgx-h100"].intra_node.bandwidth == 450 * GB
    gb300 = NODE_PRESETS["gb300-nvl72"]
    assert (gb300.nvlink_domain, gb300.gpus_per_node, gb300.inter_node.bandwidth) == (72, 4, 100 * GB)
    amd = NODE_PRESETS["amd-mi300x-platform"]
    assert amd.intra_node.bandwidth == 7 * 64 * GB and amd.nvls is None  # 7 Infinity Fabric links, no switch


@pytest.mark.parametrize("gpu, nodes", [("H20", 2), ("GB300", 4), ("MI300X", 2), ("MI325X", 1)])
def test_each_preset_runs_a_step(gpu, nodes):
    result = runner.run(scenario_from_dict(scenario(gpu, nodes, tp=2)))
    summary = result.summary
    assert summary.step_time_s > 0 and 0 < summary.mfu < 1
    assert summary.hbm_capacity_bytes == GPU_PRESETS[gpu].hbm_capacity


def test_a_slower_gpu_is_slower_on_the_same_layout():
    times = {gpu: runner.run(scenario_from_dict(scenario(gpu, 1, tp=8))).summary.step_time_s
             for gpu in ("H20", "H100-SXM")}
    assert times["H20"] > 2 * times["H100-SXM"]  # 148 vs 989 dense bf16 TFLOPS


def test_gb200_nvl72_with_256_gpus_has_a_partial_last_domain():
    data = scenario("GB200", 64, tp=4, pp=1)
    cluster = scenario_from_dict(data).cluster
    assert cluster.nodes * cluster.gpus_per_node == 256 and cluster.nvlink_domain == 72
    result = runner.run(scenario_from_dict(data))
    assert result.summary.num_gpus == 256 and result.summary.step_time_s > 0
    topology = runner.build_topology(result.plan)
    sizes = [sum(1 for r in range(256) if topology.domain_of(r) == d) for d in range(4)]
    assert sizes == [72, 72, 72, 40]
    assert topology.in_one_domain(range(216, 256)) and not topology.in_one_domain(range(200, 230))
    # a domain that is not whole nodes is still refused, naming the field
    with pytest.raises(ConfigError, match="nvlink_domain: 70 GPUs is not whole nodes of 4"):
        scenario_from_dict({**data, "cluster": {**data["cluster"], "nvlink_domain": 70}})
