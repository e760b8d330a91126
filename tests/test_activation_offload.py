"""Activation offload (``training.cpu_offloading_num_layers``, Megatron-LM --cpu-offloading-num-layers over
Transformer Engine's CPU offload context): memory falls by the offloaded layers' stash, the PCIe copies are
exposed only where longer than the next layer's pass (closed forms), the estimate agrees, full training without
the knob is unchanged, and the rules are one line each."""

from __future__ import annotations

import pytest

import sim
from sim.costs.models import RooflineCosts
from sim.errors import ConfigError
from sim.plan import resolve
from sim.workload.cost_model import make_costs
from sim.workload.footprint import memory_plan
from sim.workload.host_offload import offload_buffer_copy_seconds

LAYERS, MICROBATCHES = 8, 2


def scenario(offload: int, pcie: float = 64e9, method: str = "full") -> dict:
    return {"name": "offload", "seed": 0,
            "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 1,
                        "pcie": {"bandwidth": pcie, "latency": 1e-6, "efficiency": 0.8}},
            "model": {"preset": "llama3-8b", "num_layers": LAYERS},
            "training": {"global_batch": MICROBATCHES, "micro_batch": 1, "seq_len": 4096, "flash_attention": True,
                         "method": method, "cpu_offloading_num_layers": offload},
            "costs": "roofline", "network": "analytic"}


def layer_times(result: sim.RunResult) -> tuple[float, float]:
    """(forward, backward) seconds of one layer of one micro-batch, from the trace."""
    trace = result.trace
    one = trace[(trace["layer"] == 1) & (trace["microbatch"] == 0)]
    return ((one.loc[one["kind"] == "forward", "end_s"] - one.loc[one["kind"] == "forward", "start_s"]).sum(),
            (one.loc[one["kind"] == "backward", "end_s"] - one.loc[one["kind"] == "backward", "start_s"]).sum())


@pytest.mark.parametrize("pcie", [16e9, 64e9, 1e12])
@pytest.mark.parametrize("offload", [1, 2, 3])
def test_exposed_pcie_time_closed_form(offload: int, pcie: float) -> None:
    # Each offloaded layer's saved tensors are first copied into TE's GPU ping-pong buffer on the compute stream
    # (b = 2 x stash bytes through HBM), then to the host (its stash bytes over PCIe: 1 us + bytes / (bandwidth x
    # 0.8)) under the next layer's forward (and that layer's own buffer copy, when it is offloaded too); its copy
    # back runs under the next layer's backward. The step grows by
    # m x sum over the offloaded layers of (b + max(0, copy - forward - b [next offloaded]) + max(0, copy - backward)).
    base = sim.run(scenario(0, pcie))
    forward, backward = layer_times(base)
    plan = resolve(sim.load_scenario(scenario(offload, pcie)))
    copy = 1e-6 + plan.stash_bytes(0) / (pcie * 0.8)
    buffer = offload_buffer_copy_seconds(plan, 0, make_costs(plan))
    costs = make_costs(plan)  # H100 roofline: HBM bandwidth x memory efficiency, x the profile's end-to-end factor
    assert isinstance(costs, RooflineCosts)
    assert buffer == pytest.approx(2 * plan.stash_bytes(0) / costs.bytes_rate * costs.factor, rel=1e-12)
    expected = MICROBATCHES * sum(buffer + max(0.0, copy - forward - (buffer if layer + 1 < offload else 0.0))
                                  + max(0.0, copy - backward) for layer in range(offload))
    run = sim.run(scenario(offload, pcie))
    assert run.summary.step_time_s - base.summary.step_time_s == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # The estimate (sim/explore/estimate_stages.py) prices the same buffer copies and hiding windows: equal to the
    # simulation on this one-stage model.
    assert sim.estimate(scenario(offload, pcie)).step_time_s == pytest.approx(run.summary.step_time_s, rel=1e-12)
    copies = run.trace[run.trace["name"].isin(("activation_offload", "activation_reload"))]
    assert len(copies) == 2 * MICROBATCHES * offload
    assert copies["bytes"].sum() == pytest.approx(2 * MICROBATCHES * offload * plan.stash_bytes(0))
    buffers = run.trace[run.trace["name"] == "activation_buffer_copy"]
    assert len(buffers) == MICROBATCHES * offload and (buffers["stream"] == "compute").all()


def test_hidden_when_pcie_is_fast() -> None:
    # 1 TB/s: 0.76 ms per copy of 604 MB, below a layer's 6 ms forward: only the buffer copies (2 x 604 MB through
    # HBM each, on the compute stream) add to the step.
    plan = resolve(sim.load_scenario(scenario(2, 1e12)))
    buffer = offload_buffer_copy_seconds(plan, 0, make_costs(plan))
    assert sim.run(scenario(2, 1e12)).summary.step_time_s == pytest.approx(
        sim.run(scenario(0, 1e12)).summary.step_time_s + MICROBATCHES * 2 * buffer, rel=1e-12)


@pytest.mark.parametrize("offload", [1, 2, 3, 5, 7])
def test_memory_falls_by_the_offloaded_stash(offload: int) -> None:
    # Transformer Engine 1.x copies each offloaded layer's saved tensors into one of two GPU ping-pong buffers and
    # those to the host: the GPU keeps the kept layers' stash plus min(N, 2) layers of buffers, so offloading
    # pays from the third layer on. In the backward the layer copied back sits beside the kept ones (counted when a
    # chunk keeps fewer than three).
    base = resolve(sim.load_scenario(scenario(0)))
    stash = base.stash_bytes(0)  # every layer stashes the same; 1F1B on one stage keeps one micro-batch in flight
    plan = resolve(sim.load_scenario(scenario(offload)))
    bound, before = memory_plan(plan)[0], memory_plan(base)[0]
    kept = LAYERS - offload
    expected = (kept + min(offload, 2) + max(0, 3 - kept)) * stash
    assert before["activations"] == pytest.approx(LAYERS * stash)
    assert bound["activations"] == pytest.approx(expected)
    assert bound["host"] == pytest.approx(offload * stash)
    simulated = sim.run(scenario(offload)).summary
    assert simulated.memory_breakdown_bytes["0"]["activations"] <= bound["activations"] * (1 + 1e-12)
    assert simulated.host_memory_bytes == pytest.approx(offload * stash)
    if kept >= 3:  # the peak is at the end of the forward: the kept layers and the two buffers
        assert simulated.memory_breakdown_bytes["0"]["activations"] == pytest.approx(
            (kept + min(offload, 2)) * stash)


def test_every_method() -> None:
    # LoRA: the same copies, of the LoRA layer's stash (which includes the adapters' A outputs).
    plan = resolve(sim.load_scenario(scenario(1, method="lora")))
    run = sim.run(scenario(1, method="lora"))
    copies = run.trace[run.trace["name"] == "activation_offload"]
    assert len(copies) == MICROBATCHES and copies["bytes"].iloc[0] == pytest.approx(plan.stash_bytes(0))


def test_a_moe_model_offloads_and_reloads_each_micro_batch_and_the_estimate_agrees() -> None:
    """A MoE model (8 experts, ep 8, DeepEP's host sync on) offloading 2 of its 4 layers: a MoE layer's
    backward starts with its MLP part, whose first task follows the layer above across the reload issued between
    them (it raised an AssertionError); 2 copies out and 2 back per micro-batch, and the estimate within 2%."""
    from conftest import small_moe_model
    data = {"name": "moe-offload", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
            "model": small_moe_model("moe", num_layers=4, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                     max_seq_len=2048),
            "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True,
                         "cpu_offloading_num_layers": 2},
            "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1}, "moe": {"token_dispatcher": "flex"}}
    run = sim.run(data)
    names = run.trace["name"]
    microbatches = resolve(sim.load_scenario(data)).microbatches
    assert (names == "activation_offload").sum() == (names == "activation_reload").sum() == 2 * microbatches
    assert sim.estimate(data).step_time_s == pytest.approx(run.summary.step_time_s, rel=0.02)


def test_off_changes_nothing() -> None:
    assert "offload" not in set(sim.run(scenario(0)).trace["kind"])


@pytest.mark.parametrize("training,message", [
    ({"cpu_offloading_num_layers": 1, "recompute": "full"}, "needs recompute: none"),
    ({"cpu_offloading_num_layers": 8}, "must be below the 8 layers"),
])
def test_one_line_errors(training: dict, message: str) -> None:
    data = scenario(0)
    data["training"].update(training)
    with pytest.raises(ConfigError, match=message):
        sim.load_scenario(data)


@pytest.mark.parametrize("parallel", [{"pp": 2}, {"pp": 2, "vpp": 2}])
def test_pipeline_parallelism_is_refused(parallel: dict) -> None:
    """Megatron-Core's TransformerConfig raises "Currently there is no support for Pipeline parallelism with CPU
    offloading" when cpu_offloading and pipeline_model_parallel_size > 1 (transformer_config.py
    __post_init__, at 1e05700595 and at d98e8a64dd), interleaved or not: one line naming the field; pp 1 runs."""
    data = scenario(1)
    data["cluster"]["gpus_per_node"] = 2
    data["parallel"] = parallel
    with pytest.raises(ConfigError) as error:
        sim.load_scenario(data)
    assert str(error.value).startswith("training.cpu_offloading_num_layers: Megatron-Core offloads activations "
                                       "only without pipeline parallelism (parallel.pp = 2;")
    assert "\n" not in str(error.value)
    data["parallel"] = {"pp": 1}
    assert sim.load_scenario(data).parallel.pp == 1
