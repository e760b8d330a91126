"""A DualPipe F&B pair's span (sim.explore.pair_replay) in closed forms, and the estimate's pairs against the
simulation's trace: every stage's pairs, priced by the replay, take the seconds the task graph gives them."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from sim import runner
from sim.explore.estimate import Estimator
from sim.explore.pair_replay import Block, alone, chain, pair_span
from sim.plan import resolve
from sim.spec.scenario import Scenario, scenario_from_dict

from conftest import small_moe_model


def test_chain_runs_a_block_without_exchange_into_the_next():
    assert chain([(Block(1.0, None, 0.5),), (Block(2.0, 3.0, 4.0), Block(5.0, None, 0.0))]) == [
        Block(3.5, 3.0, 4.0), Block(5.0, None, 0.0)]
    assert alone([Block(1.0, 3.0, 4.0), Block(2.0, 5.0, 1.0), Block(1.0, None, 0.0)]) == 1 + 4 + 2 + 5 + 1


def test_a_pair_bound_by_the_serial_ep_stream():
    """Exchanges of 10 s under blocks of 1 s: F's dispatch 1-11, B's combine gradient 11-21 (queued behind it),
    F's combine 21-31 (F's experts ran 11-12), B's dispatch gradient 31-41 (B's experts 21-22), F's unpermute
    31-32, B's router+attention 41-42. The span is the first block, the four exchanges back to back and the last
    block: 42 s, where hiding each exchange under the other pass's next block apart would give 34 s (serial 46
    less min(10, 1) x 4)."""
    f = [Block(1.0, 10.0, 0.0), Block(1.0, 10.0, 0.0), Block(1.0, None, 0.0)]
    b = list(f)
    assert pair_span(f, b) == 1 + 4 * 10 + 1
    assert alone(f) + alone(b) == 46


def test_a_pair_bound_by_compute_and_the_shared_expert_beside_its_own_exchange():
    """Exchanges of 0.5 s: every block waits only for the compute before it, so the span is all the compute,
    the shared experts (``after``) included; run alone each pass would wait for its own exchanges."""
    f = [Block(2.0, 0.5, 0.25), Block(1.0, 0.5, 0.0), Block(1.0, None, 0.0)]
    b = [Block(1.0, 0.5, 0.0), Block(2.0, 0.5, 0.25), Block(3.0, None, 0.0)]
    assert pair_span(f, b) == 2.25 + 1 + 1 + 2.25 + 1 + 3
    assert alone(f) == 2 + 0.5 + 1 + 0.5 + 1


def test_a_pass_with_fewer_blocks_leaves_the_rest_to_the_other():
    """A dense forward (one block) with a MoE backward: F runs first, then B's blocks wait for their own
    exchanges, nothing beside them: B alone after F."""
    f = [Block(4.0, None, 0.0)]
    b = [Block(1.0, 3.0, 0.0), Block(1.0, 3.0, 0.5), Block(2.0, None, 0.0)]
    assert pair_span(f, b) == 4 + alone(b)


def test_a_trailing_tp_collective_holds_the_tp_stream():
    """F's first block: router 1 s, its dispatch (1 s) issued, the shared expert 0.5 s, then its SP reduce-scatter
    3 s on the TP stream (1.5-4.5). B's one block starts with an all-gather (lead 0): it queues behind the
    reduce-scatter on the one TP stream, so B runs 4.5-5; F's last block waits for its own reduce-scatter and the
    compute stream: 5-6. Alone F is 1 + max(1, 0.5 + 3) + 1."""
    f = [Block(1.0, 1.0, 0.5, 3.0), Block(1.0, None, 0.0)]
    b = [Block(0.5, None, 0.0, 0.0, 0.0)]
    assert pair_span(f, b) == 6.0
    assert alone(f) == 5.5
    # a block with no TP collective (lead None) does not wait for it: B 1.5-2, F's last 4.5-5.5
    assert pair_span(f, [Block(0.5, None, 0.0)]) == 5.5
    # joined pieces keep the first TP collective's offset: the dense piece's 2 s, then the all-gather
    assert chain([(Block(2.0, None, 0.0),), (Block(1.0, 1.0, 0.0, 0.0, 0.0),)]) == [Block(3.0, 1.0, 0.0, 0.0, 2.0)]


def _moe_scenario(**changes: Any) -> Scenario:
    """A small MoE under DualPipe (pp 4, 16 micro-batches of 2048 tokens, roofline costs, analytic network, no
    host bound: ``moe.host_sync`` false, tests/test_moe_host_sync.py), with ``changes`` merged into its sections."""
    doc: dict[str, Any] = {
        "name": "pair", "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
        "model": small_moe_model("moe-small", num_layers=4, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                 max_seq_len=4096),
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 4, "ep": 4, "zero": 1, "vpp": 1, "overlap_p2p_comm": True},
        "moe": {"host_sync": False},
        "schedule": "dualpipe",
    }
    for section, values in changes.items():
        doc[section] = {**doc[section], **values} if isinstance(values, dict) else values
    return scenario_from_dict(doc)


CASES = {
    # one layer per chunk, all on one node's NVLink
    "one-layer": {},
    # two layers per chunk, the first layer dense, a shared expert, full recomputation of each chunk's first layer,
    # and an ep group over four 2-GPU nodes: the exchanges go over the NICs and outlast the compute
    "ep-bound": {"cluster": {"nodes": 8, "gpus_per_node": 2},
                 "model": {"num_layers": 8, "moe_layer_freq": [0, 1, 1, 1, 1, 1, 1, 1],
                           "moe_shared_expert_intermediate_size": 2048},
                 "training": {"recompute": "full", "recompute_num_layers": 1}},
    # selective recomputation of the MoE module: its forward, exchanges included, again before its backward
    "moe-recompute": {"model": {"num_layers": 8, "moe_shared_expert_intermediate_size": 1024},
                      "training": {"recompute": "selective", "recompute_modules": ["moe"]}},
    # DualPipeV: one copy in a V, the turn's two chunks on the last rank
    "dualpipev": {"schedule": "dualpipev", "parallel": {"vpp": 2},
                  "model": {"num_layers": 8, "moe_shared_expert_intermediate_size": 1024}},
    # TP 2 with SP: the shared expert's reduce-scatter trails its block on the one TP stream, and the other pass's
    # next all-gather waits for it; a dense first layer
    "tp2": {"parallel": {"tp": 2, "sequence_parallel": True, "ep": 2},
            "model": {"num_layers": 8, "moe_shared_expert_intermediate_size": 2048,
                      "moe_layer_freq": [0, 1, 1, 1, 1, 1, 1, 1]}},
}
# On the end stages a forward's first all-gather may run on the TP stream under the previous unit's W pass, before
# the pair: the pair there is shorter than the estimate's by that gather (tp2: +0.9%), so only the middle ones.
MIDDLE_ONLY = {"tp2"}


def _pair_spans(scenario: Scenario) -> dict[int, dict[tuple[int, int], float]]:
    """Per stage, per kind of pair (the forward's local chunk, the backward's): the seconds from the pair's
    first task to its last on the compute and TP streams in the simulation's trace (the median of that kind's
    pairs). A pass's tasks are emitted one after another; its first TP collective counts where the compute
    waited for it."""
    plan = resolve(scenario)
    result = runner.run(scenario)
    trace = result.trace
    start = dict(zip(trace["task"], trace["start_s"], strict=True))
    end = dict(zip(trace["task"], trace["end_s"], strict=True))
    # a task's model chunk: its layer's, the embedding's (chunk 0) or the head's (the last)
    chunk_of = {layer: g for g in range(plan.chunks) for layer in plan.chunk_layers(g)}
    tasks = result.graph.tasks
    passes: dict[tuple[int, bool, int, int], list[int]] = {}
    for task in tasks:
        if task.stream == "compute" and task.kind != "weight":
            g = chunk_of.get(task.layer, 0 if task.name == "embedding" else plan.chunks - 1)
            passes.setdefault((task.rank, task.kind == "forward", task.microbatch, g), []).append(task.id)
    spans: dict[int, dict[tuple[int, int], list[float]]] = {}
    for stage, actions in enumerate(plan.schedule.actions(plan.pp, plan.microbatches, plan.vpp)):
        rank = plan.grid.stage_representative(stage)
        chunks = plan.stage_chunks[stage]
        for first, second in zip(actions[:-1], actions[1:], strict=True):
            if first.phase == "F" and first.with_next and second.phase == "B":
                ids = []
                for forward, action in ((True, first), (False, second)):
                    compute = passes[(rank, forward, action.microbatch, chunks[action.chunk])]
                    ids += [t for t in range(min(compute) - 1, max(compute) + 2)
                            if tasks[t].rank == rank and tasks[t].stream in ("compute", "tp")
                            and tasks[t].kind != "weight" and tasks[t].microbatch == action.microbatch]
                begin = min(start[i] for i in ids if tasks[i].stream == "compute")
                begin = min([begin] + [start[i] for i in ids if tasks[i].stream == "tp" and end[i] == begin])
                span = max(end[i] for i in ids) - begin
                spans.setdefault(stage, {}).setdefault((first.chunk, second.chunk), []).append(span)
    return {stage: {kind: statistics.median(seconds) for kind, seconds in kinds.items()}
            for stage, kinds in spans.items()}


@pytest.mark.parametrize("case", CASES)
def test_the_estimates_pairs_take_the_simulated_seconds(case):
    """Each stage's F&B pair as the estimate's stage-level replay runs it ((F + B - pair overlap) / 2, the two
    local chunks' passes priced alone less what the interleaving hides) equals the mean of the trace's two kinds
    of pair (F0B1, F1B0) on that stage; the middle stages' two kinds are the same. The closed form this replaced
    (four min(exchange, block) terms per MoE layer) gave the middle stages' pair -8.4% (one-layer), -6.6%
    (ep-bound), +0.1% (moe-recompute), 0 (dualpipev) and +10.0% (tp2) off the trace."""
    scenario = _moe_scenario(**CASES[case])
    estimator = Estimator(scenario)
    estimator.estimate(scenario)
    (stages, *_), = estimator._stage_times.values()
    simulated = _pair_spans(scenario)
    assert sorted(simulated) == list(range(len(stages)))
    for stage, kinds in simulated.items():
        if case in MIDDLE_ONLY and stage in (0, len(stages) - 1):
            continue
        st = stages[stage]
        assert st.pair_overlap > 0
        assert (st.forward + st.backward - st.pair_overlap) / 2 == pytest.approx(statistics.mean(kinds.values()),
                                                                                 rel=1e-9)
