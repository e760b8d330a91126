"""A lazy task graph (stamped layer chains kept as records, ``TaskGraph.lazy``) against the eager one.

A sweep's confirmation builds its graph lazily and replays the stamped chains as units
(``sim.engine.longest_path._walk_stamped``, one compiled function per chain rule), so nothing in it may differ
from the graph ``sim run`` builds: materialized, the lazy graph must be the eager graph task for task (every
field, dependencies in order, every stream list in order), and its replay must give every task the eager
replay's start and end to the last bit. Checked on layouts that reach each kind of chain: 1F1B, interleaved with
SP and selective recomputation, the zero-bubble schedules (their W chains), ZB-V's V, full recomputation,
PyTorch's AsyncTP, ZeRO-1 and ZeRO-3/FSDP with pipelines, activation offload, context parallelism, a MoE
model, LoRA's frozen layers; and where the lazy walk does not apply (DualPipe's rendezvous) the graph is
materialized and replayed as any other.
"""

from __future__ import annotations

from dataclasses import astuple

import pytest

from sim import runner
from sim.engine import longest_path
from sim.network import models as network
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload
from sim.workload.ir import Chain

from conftest import ROOT

SCENARIOS = ROOT / "scenarios"
CASES = {
    "pipeline-4x8 1f1b": ("pipeline-4x8.yaml", []),
    "pipeline-4x8 interleaved, SP, selective": ("pipeline-4x8.yaml", [
        "schedule=interleaved", "parallel.vpp=2", "parallel.sequence_parallel=true",
        "training.recompute=selective"]),
    "pipeline-4x8 zb-h1": ("pipeline-4x8.yaml", ["schedule=zb-h1"]),
    "pipeline-4x8 zb-h2": ("pipeline-4x8.yaml", ["schedule=zb-h2"]),
    "pipeline-4x8 zb-v": ("pipeline-4x8.yaml", ["schedule=zb-v", "parallel.vpp=2"]),
    "pipeline-4x8 full recompute": ("pipeline-4x8.yaml", ["training.recompute=full"]),
    "tiny zero-1 dp 2": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=1"]),
    "tiny FSDP + PP": ("tiny.yaml", ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=3",
                                     "fsdp.sharding=FULL_SHARD"]),
    # Megatron-Core refuses --cpu-offloading with pipeline parallelism (training.cpu_offloading_num_layers' rule)
    "tiny activation offload": ("tiny.yaml", ["training.cpu_offloading_num_layers=1", "parallel.pp=1",
                                              "parallel.dp=2"]),
    "tiny AsyncTP, full recompute": ("tiny.yaml", ["parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true",
                                                   "parallel.tp_comm_overlap_method=async_tp",
                                                   "training.recompute=full"]),
    "tiny cp 2": ("tiny.yaml", ["parallel.tp=1", "parallel.cp=2", "training.flash_attention=true"]),
    "llama3-8b LoRA": ("llama3-8b_h100-1_lora.yaml", []),
    "mixtral 8x7b, global batch 64": ("mixtral-8x7b_h100-64.yaml", ["training.global_batch=64"]),
    # Whole passes as one chain (_StageEmitter._pass_chain): FSDP + PP's later micro-batches, sends that do not
    # block (overlap_p2p_comm), and asynchronous TP, where the collective blocking at a send can be the pass's given
    # one (those passes stay layer by layer).
    "pipeline-4x8 FSDP + PP, dp 2": ("pipeline-4x8.yaml", ["cluster.nodes=2", "parallel.dp=2", "parallel.zero=3",
                                                           "fsdp.sharding=FULL_SHARD"]),
    "tiny interleaved, p2p overlapped": ("tiny.yaml", ["schedule=interleaved", "parallel.vpp=2",
                                                       "parallel.overlap_p2p_comm=true"]),
    "tiny interleaved, TP overlapped, SP": ("tiny.yaml", ["schedule=interleaved", "parallel.vpp=2",
                                                          "parallel.tp_comm_overlap=true",
                                                          "parallel.sequence_parallel=true"]),
}


def _graphs(file: str, overrides: list[str]):
    scenario = load_scenario(SCENARIOS / file, overrides)
    plan = resolve(scenario)
    net = network.make(scenario.network.model, runner.build_topology(plan), scenario.network.algorithm,
                       scenario.network.protocol)
    return plan, net, workload.build(plan), workload.build(plan, lazy=True)


@pytest.mark.parametrize("case", list(CASES))
def test_a_lazy_graph_replays_and_materializes_as_the_eager_one(case):
    plan, net, eager, lazy = _graphs(*CASES[case])
    assert lazy.lazy and lazy.stamps, "the case stamps no chain: the comparison would not reach the lazy walk"
    stamped = sum(len(lazy.chains[chain].entries) for _, chain, *_ in lazy.records())
    assert len(lazy.tasks) == len(eager.tasks) and stamped > len(eager.tasks) / 3
    expected = longest_path.evaluate(eager, net)
    got = longest_path.evaluate(lazy, net)
    assert lazy.stamps, "the lazy walk gave up and materialized the graph"
    assert got.start == expected.start and got.end == expected.end  # bit for bit, every task
    lazy.materialize()
    assert not lazy.stamps and not lazy.late
    assert [astuple(task) for task in lazy.tasks] == [astuple(task) for task in eager.tasks]
    assert list(lazy.streams.items()) == list(eager.streams.items())


def test_edges_added_to_stamped_tasks_are_kept_until_materialized():
    """A pass's first task waits for its upstream send (``add_dependency`` after the stage is emitted); where
    that task is stamped, the lazy graph keeps the edge in ``late``, and the walk and materialize both read it."""
    _, net, eager, lazy = _graphs("pipeline-4x8.yaml", [])
    assert lazy.late
    firsts = {first for first, *_ in lazy.records()}
    assert set(lazy.late) <= firsts
    for task_id, ons in lazy.late.items():
        assert eager.tasks[task_id].deps[-len(ons):] == tuple(ons)


def test_the_stamp_table_is_the_records_made_once_and_reset_by_materialize():
    """``TaskGraph.stamp_table``: the records as rows, one read-only array kept by the frozen graph (the replay and
    the confirmation's figures share it), dropped when ``materialize`` empties the stamps."""
    _, _, _, lazy = _graphs("pipeline-4x8.yaml", ["schedule=zb-h1"])
    table = lazy.stamp_table()
    assert table.tolist() == [list(record) for record in lazy.records()] and len(table) == len(lazy.stamps) // 6
    assert lazy.stamp_table() is table and not table.flags.writeable
    lazy.materialize()
    assert lazy.stamp_table().shape == (0, 6)


def test_chain_rule_decides_the_blocking_collective_once():
    """``Chain``'s ``consumer`` and ``leaves`` follow ``Chain.stamp``'s rule: the first entry that waits takes the
    blocking collective given; the last that becomes blocking (not taken after) is left."""
    def entry(waits, becomes):
        return ("compute", "forward", "x", 1.0, "", 0.0, 0.0, (), 1.0, True, (), waits, becomes, False, None)

    chain = Chain([entry(False, True), entry(True, False), entry(False, True)], [], 0, 0, 0)
    assert (chain.consumer, chain.leaves) == (-1, 2)  # entry 1 takes entry 0's, not the one given
    chain = Chain([entry(True, False), entry(False, False)], [], 0, 0, 0)
    assert (chain.consumer, chain.leaves) == (0, -2)
    chain = Chain([entry(False, False)], [], 0, 0, 0)
    assert (chain.consumer, chain.leaves) == (-1, -1)


def test_a_chain_with_an_edge_out_of_it_is_not_compiled():
    """An entry whose extra edge reaches before the chain's first task is no unit: the walk gives up (None), and
    evaluate materializes the graph instead."""
    streams, prevs, waits, becomes = (0, 1), (True, True), (False, False), (False, False)
    assert longest_path._chain_function(streams, prevs, ((), (1,)), waits, becomes) is not None
    assert longest_path._chain_function(streams, prevs, ((), (2,)), waits, becomes) is None


def test_dualpipe_meetings_are_replayed_on_the_materialized_graph():
    """DualPipe's copy pairs meet in a rendezvous even in slice mode; the lazy walk leaves those graphs to the
    stream walk, on the materialized tasks, with the same times."""
    overrides = ["schedule=dualpipe", "parallel.pp=4", "parallel.dp=2", "cluster.nodes=2"]
    _, net, eager, lazy = _graphs("pipeline-4x8.yaml", overrides)
    assert lazy.stamps
    expected = longest_path.evaluate(eager, net)
    got = longest_path.evaluate(lazy, net)
    assert not lazy.stamps  # materialized
    assert got.start == expected.start and got.end == expected.end
