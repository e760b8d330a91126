"""A sweep's confirmation (sim.explore.confirm) against the full run it stands for.

``confirm`` reads the replayed graph into arrays instead of building the trace and summary, so each of its figures
must be the full run's summary field to the last bit (issue 25: the search confirms its best layouts with it, and
a ranking must not depend on which path simulated a layout). Compared with ``==`` on every field, over the
bundled scenarios small enough for the suite and over overrides that reach each branch of the figures: ZeRO 1-3
and FSDP + PP (the timeline's gathered weights and unreduced gradients), activation offload (its copies), the
interleaved and zero-bubble schedules, full and selective recomputation, context parallelism (a ``cp`` exposed
column), a MoE model (``ep``), every rank simulated (many ranks, rendezvous), the contention network and NCCL's SM
contention (stretched durations from repeated replays), jitter (unstamped layers).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from dataclasses import fields

import pytest

from sim import runner
from sim.explore.confirm import Figures, confirm
from sim.explore.sweep import METRICS, SweepSpec, run_point, shipped
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload

from conftest import ROOT

SCENARIOS = ROOT / "scenarios"
CASES = {
    "tiny": ("tiny.yaml", []),
    "tiny zero-1 dp 2": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=1"]),
    "tiny zero-2 dp 2, pp 1": ("tiny.yaml", ["parallel.pp=1", "parallel.dp=2", "parallel.zero=2"]),
    "tiny zero-3 dp 2, pp 1, full recompute": ("tiny.yaml", ["parallel.pp=1", "parallel.dp=2", "parallel.zero=3",
                                                             "training.recompute=full"]),
    "tiny FSDP + PP": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=3",
                                     "fsdp.sharding=FULL_SHARD"]),
    "tiny interleaved, selective, SP": ("tiny.yaml", ["schedule=interleaved", "parallel.vpp=2",
                                                      "training.recompute=selective",
                                                      "parallel.sequence_parallel=true"]),
    # Megatron-Core refuses --cpu-offloading with pipeline parallelism (training.cpu_offloading_num_layers' rule)
    "tiny activation offload": ("tiny.yaml", ["training.cpu_offloading_num_layers=1", "parallel.pp=1",
                                              "parallel.dp=2"]),
    "tiny cp 2": ("tiny.yaml", ["parallel.tp=1", "parallel.cp=2", "training.flash_attention=true"]),
    "tiny every rank": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "ranks=all"]),
    "tiny contention, every rank": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "network.model=contention",
                                                  "ranks=all"]),
    "tiny NCCL SMs": ("tiny.yaml", ["network.nccl_sms=8"]),
    "tiny jitter": ("tiny.yaml", ["variation.jitter=0.05", "ranks=all"]),
    "tiny chunked TP overlap, chunk GEMMs, 4 SMs, zb-h1": ("tiny.yaml", [
        "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true", "parallel.tp_comm_overlap_chunk_gemms=true",
        "parallel.tp_comm_overlap_sms=4", "schedule=zb-h1"]),
    "tiny chunked TP overlap, cp 2, full recompute": ("tiny.yaml", [
        "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true", "parallel.cp=2",
        "training.flash_attention=true", "cluster.nodes=4", "training.recompute=full"]),
    "tiny AsyncTP, interleaved, p2p overlapped (whole passes stamped)": ("tiny.yaml", [
        "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true", "parallel.tp_comm_overlap_method=async_tp",
        "schedule=interleaved", "parallel.vpp=2", "parallel.overlap_p2p_comm=true"]),
    "mixtral 8x7b dropless alltoall, host sync, full recompute": ("mixtral-8x7b_h100-64.yaml", [
        "training.global_batch=64", "moe.pad_to_capacity=false", "moe.capacity_factor=null",
        "training.recompute=full", "costs.eager_op_overhead=100 us"]),
    "pipeline-4x8 zb-h1": ("pipeline-4x8.yaml", ["schedule=zb-h1"]),
    "pipeline-4x8 zb-v": ("pipeline-4x8.yaml", ["schedule=zb-v", "parallel.vpp=2"]),
    "pipeline-4x8 zb-h2": ("pipeline-4x8.yaml", ["schedule=zb-h2"]),
    "pipeline-4x8 dualpipe (meetings: materialized)": ("pipeline-4x8.yaml", [
        "schedule=dualpipe", "parallel.dp=2", "cluster.nodes=2"]),
    "llama2-7b dp": ("llama2-7b_h100-8_dp.yaml", []),
    "llama2-7b FSDP": ("llama2-7b_h100-16_fsdp.yaml", []),
    "llama3-8b LoRA": ("llama3-8b_h100-1_lora.yaml", []),
    "mixtral 8x7b, global batch 64": ("mixtral-8x7b_h100-64.yaml", ["training.global_batch=64"]),
    "mixtral 8x7b, DeepEP (its SMs: built eagerly)": ("mixtral-8x7b_h100-64.yaml", [
        "training.global_batch=64", "moe.token_dispatcher=flex"]),
    "pipeline-4x8 FSDP + PP, dp 2 (whole passes stamped)": ("pipeline-4x8.yaml", [
        "cluster.nodes=2", "parallel.dp=2", "parallel.zero=3", "fsdp.sharding=FULL_SHARD"]),
    "tiny interleaved, p2p overlapped (whole passes stamped)": ("tiny.yaml", [
        "schedule=interleaved", "parallel.vpp=2", "parallel.overlap_p2p_comm=true"]),
}


def summary_figures(summary) -> dict:
    """The full run's summary fields that ``Figures`` holds."""
    return {f.name: summary.peak_memory_bytes.max if f.name == "peak_memory_bytes" else getattr(summary, f.name)
            for f in fields(Figures)}


@pytest.mark.parametrize("case", list(CASES))
def test_confirmation_equals_the_full_run_to_the_last_bit(case):
    file, overrides = CASES[case]
    scenario = load_scenario(SCENARIOS / file, overrides)
    expected = summary_figures(runner.run(scenario).summary)
    got = vars(confirm(scenario))
    assert got == expected
    assert [type(value) for value in got.values()] == [type(value) for value in expected.values()]


def test_the_cases_reach_the_branches_they_name():
    """Each case exercises what its name says (so the equality above is not vacuous there)."""
    def result(case):
        file, overrides = CASES[case]
        return runner.run(load_scenario(SCENARIOS / file, overrides))

    assert set(result("tiny cp 2").summary.exposed_comm_s) == {"tp", "pp", "dp", "cp"}
    assert set(result("mixtral 8x7b, global batch 64").summary.exposed_comm_s) == {"tp", "pp", "dp", "ep"}
    assert result("tiny NCCL SMs").summary.nccl_sm_stretch_s > 0
    assert {"activation_offload", "activation_reload"} <= set(result("tiny activation offload").trace["name"])
    names = set(result("tiny FSDP + PP").trace["name"])
    assert {"param_gather_fwd", "grad_reduce_scatter"} <= names
    assert len(result("tiny every rank").summary.peak_memory_bytes.per_rank) == 4  # dp 2 x pp 2, TP folded
    asynctp = set(result("tiny AsyncTP, interleaved, p2p overlapped (whole passes stamped)").trace["name"])
    assert {"attention_shard_copy", "mlp_reduce_partials"} <= asynctp  # AsyncTP's own tasks
    host = result("mixtral 8x7b dropless alltoall, host sync, full recompute")
    assert {"moe_host_issue"} == set(host.trace[host.trace["stream"] == "host"]["name"])
    assert host.summary.host_bound_fraction > 0.05  # the host-bound rule's branch (summary.host_bound_seconds)


def test_a_sweep_row_is_the_full_runs_summary():
    """``run_point``'s metrics (the results table's columns) come from the confirmation and equal the summary's."""
    base = SCENARIOS / "tiny.yaml"
    point = {"parallel.dp": 2, "cluster.nodes": 4, "parallel.zero": 1}
    spec = SweepSpec(base, {}, [], explicit=[point])
    shipped_base, overrides, files = shipped(spec, [point])
    row = run_point(*shipped_base, overrides, point, spec.keys, None, files[0])
    summary = runner.run(load_scenario(base, ["parallel.dp=2", "cluster.nodes=4", "parallel.zero=1"])).summary
    exposed = summary.exposed_comm_s
    expected = {**{k: getattr(summary, k) for k in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu",
                                                     "bubble_fraction", "bubble_rate_stagewise",
                                                     "host_bound_fraction", "fits_in_memory",
                                                     "microbatches", "num_gpus", "tasks")},
                "exposed_tp_s": exposed["tp"], "exposed_pp_s": exposed["pp"], "exposed_dp_s": exposed["dp"],
                "exposed_ep_s": 0.0, "peak_memory_bytes": summary.peak_memory_bytes.max, "global_batch": 8}
    assert row["status"] == "ok"
    assert {key: row[key] for key in METRICS} == expected


def test_a_built_graph_is_freed_without_the_cycle_collector():
    """The emitters that built a graph point at each other; ``build`` breaks those cycles, so a sweep's finished
    graph (10^5 tasks) is freed by reference counting, not left for a collector pass per point."""
    plan = resolve(load_scenario(SCENARIOS / "tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=3",
                                                            "fsdp.sharding=FULL_SHARD"]))
    enabled = gc.isenabled()
    gc.disable()
    try:
        graph = workload.build(plan)
        alive = weakref.ref(graph)
        del graph
        assert alive() is None
    finally:
        if enabled:
            gc.enable()



_FAULTS = """
import resource, sys
from sim.explore import confirm
from sim.spec.scenario import load_scenario
if sys.argv[1] == "defaults":
    confirm._heap_kept = True  # as if already set: the C library's defaults stay
scenario = load_scenario(sys.argv[2])
confirm.confirm(scenario)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    confirm.confirm(scenario)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_confirming_process_keeps_freed_memory_for_the_next_layout():
    """``_keep_freed_memory`` (a confirmation's first call): the next layouts reuse the memory the last one freed
    instead of faulting it in again (the 175B scenario, 117k tasks: about 8,600 minor page faults a confirmation
    with glibc's defaults, about 1,000 with it, 2026-11-26). Counted in fresh processes, the one with the C
    library's defaults beside it."""
    def faults(mode: str) -> float:
        scenario = str(ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml")
        done = subprocess.run([sys.executable, "-c", _FAULTS, mode, scenario], capture_output=True, text=True,
                              check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return float(done.stdout.split()[-1])
    kept, defaults = faults("kept"), faults("defaults")
    assert kept < defaults / 3, (kept, defaults)
