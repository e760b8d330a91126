"""How big a run will be, known before it is built: tasks, engine events and bytes (issue 27's resource limits).

In: a resolved ``Plan``. Out: ``RunSize`` (tasks, events, bytes, simulated pipelines), counted from the step
structure (``sim.workload.step``: the blocks, TP collectives and MoE exchanges of one layer, the FSDP / ZeRO-3
gathers of a unit) and the Plan's degrees, in time independent of the micro-batch count and of the cluster's size:
nothing here lists the schedule's actions or builds a task. ``check_limits`` compares it with a ``Limits`` budget
(``--max-tasks`` / ``--max-memory``, the API's ``max_tasks`` / ``max_memory``) and refuses, in one line naming the
field that makes the run big, a run that would exhaust the machine (a million GPUs with ``ranks: all``, ten
million micro-batches, the contention network's flows on a huge cluster) before any of it is built.

The count mirrors ``sim.workload.build``: every micro-batch passes every layer of the model once forward and
once backward (each schedule's F and B actions per stage are m x its local chunks, and the chunks partition the
layers; DualPipe's two copies each carry half the micro-batches), a zero-bubble schedule adds the W pass, and the
slice simulates one pipeline (``ranks: slice``) while ``ranks: all`` simulates dp x tp of them (dp when TP groups
are folded; times cp with context parallelism, each CP rank's attention core and ring exchanges counted per
layer). It is an estimate: ``tests/test_size.py`` holds it within ``ESTIMATE_FACTOR`` of the built graph's
task count on every bundled and validation scenario.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from sim.errors import ResourceLimit
from sim.plan import Plan
from sim.workload.cp_attention import context_attention
from sim.workload.fsdp_units import gather_calls
from sim.workload.moe_layer import combine_exchanges, dispatch_exchanges
from sim.workload.tp_collectives import loss_collectives, tp_ops
from sim.workload.tp_overlap import tp_overlap_chunks

# The estimate's stated accuracy: estimated / built task count lies in [1 / ESTIMATE_FACTOR, ESTIMATE_FACTOR] on
# every bundled and validation scenario (tests/test_size.py).
ESTIMATE_FACTOR = 1.5

# Bytes a run holds per task at its peak: the task and its dependency list, its engine state and its trace row
# (the summary and the memory timeline read the trace). Measured as peak RSS less the RSS before the run, divided
# by the task count, on the bundled scenarios with >= 90,000 tasks (benchmarks/bench_size.py, 2026-11-25):
# longest-path replay 848 (GPT-3 175B, 158,521 tasks) and 926 (DeepSeek-V3, 169,774); simpy replay on the
# contention network 868 (Korthikanti 530B dp8, 559,371 tasks) and 916 (GPT-3 175B, 158,521). Rounded up, so the
# estimate is at or above what was measured.
BYTES_PER_TASK = 1_000
# Bytes per GPU of the cluster: the topology, rank groups and, on the contention network, the flows of each
# collective (one per member and hop: they grow with the groups, not with the tasks). Measured the same way on
# tiny.yaml grown to 4,096 / 32,768 GPUs (56 tasks): analytic 0.5 / 0.7 kB per GPU; contention 98 / 90 kB per GPU
# (the DP all-reduce's ring over 8,192 / 65,536 ranks); Llama 3.1 405B on 16,384 GPUs, contention: 18 kB per GPU.
# Analytic: GPT-1T on 98,304 GPUs added 205 MiB with 94,529 tasks, 1.05 kB per GPU past RUN_BYTES and the tasks.
BYTES_PER_GPU = {"contention": 100_000, "analytic": 1_200, "ideal": 1_200}
# What any run adds, however small: the modules it loads on first use and the trace and summary frames' fixed
# cost (12 MiB measured on tiny.yaml, 374 tasks, and the other small bundled scenarios).
RUN_BYTES = 16 * 2**20
# Engine events per task: one per task on the longest-path evaluation; the simpy replay measured 1.6-1.8 events
# per task on the bundled contention scenarios (and 2.0 on the 175B with every rank; docs/scale.md).
EVENTS_PER_TASK = {"longest_path": 1, "event": 2}

# The default budget. Tasks: ten million, about 10 GB at BYTES_PER_TASK and minutes of replay (the 175B with every
# rank on the contention network, 1.95M tasks, took 26 s and 1.9 GB: docs/scale.md). Memory: half the machine's
# physical memory (the rest for the interpreter, the trace writers and other processes).
DEFAULT_MAX_TASKS = 10_000_000
MEMORY_SHARE = 0.5


def physical_memory() -> int:
    """The machine's physical memory in bytes (POSIX sysconf; 16 GiB where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def default_max_memory() -> int:
    """``--max-memory``'s default: ``MEMORY_SHARE`` of the machine's physical memory."""
    return int(physical_memory() * MEMORY_SHARE)


@dataclass(frozen=True)
class Limits:
    """A run's budget: at most ``max_tasks`` tasks and ``max_memory`` bytes (estimated before building)."""

    max_tasks: int = DEFAULT_MAX_TASKS
    max_memory: int | None = None  # None: default_max_memory()

    @property
    def memory(self) -> int:
        return default_max_memory() if self.max_memory is None else self.max_memory


@dataclass(frozen=True)
class RunSize:
    """The estimate: tasks in the graph, engine events, peak bytes the run adds to the process, and how many
    pipelines it simulates (1 in the slice)."""

    tasks: int
    events: int
    bytes: int
    pipelines: int
    task_bytes: int  # the part of ``bytes`` that grows with the tasks (the rest grows with the cluster)


def _cp_tasks(plan: Plan) -> tuple[int, int]:
    """Tasks context parallelism adds to one layer's attention block, (forward, backward): the output part as its
    own task and the attention core with its CP exchanges (sim.workload.cp_emit.ContextEmitter.core: p2p, a core
    and a send per ring step; all_gather / a2a, one core between the collectives)."""
    attention = context_attention(plan)
    if attention is None:
        return 0, 0
    steps, ring = len(attention.steps), plan.cp_comm_type == "p2p"

    def core(moves: int) -> int:
        return steps + min(steps, moves) if ring else 1 + moves

    return 1 + core(len(attention.forward)), 1 + core(len(attention.backward))


def _layer_tasks(plan: Plan, layer: int, cp: tuple[int, int]) -> int:
    """Tasks of one micro-batch's forward and backward (and W) passes through ``layer`` on one rank; ``cp`` is
    ``_cp_tasks(plan)``."""
    before, after = tp_ops(plan)
    tp_collectives = (before is not None) + (after is not None)
    moe = plan.moe_layers[layer]
    block = 1 + tp_collectives  # [all-gather] compute [all-reduce | reduce-scatter]
    # TE's userbuffers (sim.workload.block_emit._chunked_block): each collective in two parts, the row GEMM apart in the
    # forward (under CP the output part is a task already: two more); the backward's gather in two parts
    chunked = tp_overlap_chunks(plan) > 0
    dense_forward = block + (3 if chunked else 0)
    attention_forward = dense_forward - (1 if chunked and cp[0] else 0)
    # Backward: Megatron's asynchronous backward (TP, weight gradients in B) splits the compute in two and, with
    # SP, all-gathers the input again (sim.workload.block_emit._overlapped_backward).
    overlapped = plan.tp > 1 and not plan.splits_backward
    dense_backward = block + (1 if chunked else 0) + (1 + (before is not None) if overlapped else 0)
    moe_forward = 0
    if moe:
        exchanges = len(dispatch_exchanges(plan)) + len(combine_exchanges(plan))
        shared = (1 + 2 * (plan.tp > 1)) if plan.model.moe_shared_expert_intermediate_size else 0
        moe_forward = 3 + exchanges + shared  # router, experts, combine; dispatch/combine; shared expert
    forward = attention_forward + (moe_forward if moe else dense_forward) + cp[0]
    backward = dense_backward + (moe_forward if moe else dense_backward) + cp[1]
    if plan.recomputes(layer):
        backward += forward
    modules = plan.recompute_modules  # selective (sim.workload.layer_emit._selective_recompute): attention's part,
    if modules:  # and the MLP's when its module or its norm is replayed
        backward += 1
        if moe and "moe" in modules:
            backward += moe_forward
        elif "mlp" in modules:
            backward += 0 if moe else block  # replayed with its collectives whole (_selective_recompute)
        elif "layernorm" in modules:
            backward += 1
    weight = (4 if moe else 2) if plan.splits_backward else 0
    return forward + backward + weight


def _data_parallel_tasks(plan: Plan) -> int:
    """Per micro-batch, one pipeline's FSDP / ZeRO-3 gathers and reduce-scatters (0 without sharded units)."""
    if not plan.gathers_units or not plan.data_parallel:
        return 0
    units = math.ceil(plan.model.num_layers / plan.unit_layers)
    per_unit = 2 if plan.zero_stage >= 3 else 1  # the backward gathers again, unless SHARD_GRAD_OP kept them
    replicas = 2 if plan.hybrid else 1  # HYBRID_SHARD: the replicas' all-reduce after each reduce-scatter
    offload = 2 if plan.scenario.offload.params else 1  # each gather first copies its shard from the host
    calls = sum(len(gather_calls(plan, unit)) for unit in range(units))
    return calls * per_unit * offload + units * replicas


def estimate_size(plan: Plan) -> RunSize:
    """The run's tasks, events and bytes, without building anything (see the module docstring)."""
    scenario = plan.scenario
    m, layers = plan.microbatches, plan.model.num_layers
    cp = _cp_tasks(plan)
    per_microbatch = sum(_layer_tasks(plan, layer, cp) for layer in range(layers))
    passes = 3 if plan.splits_backward else 2
    per_microbatch += 2 * passes  # the embedding and the LM head
    per_microbatch += len(loss_collectives(plan))  # the unfused loss's TP all-reduces
    per_microbatch += 2 * (plan.chunks - 1)  # a send each way across every chunk boundary
    if plan.zero_stage == 2 and not plan.gathers_units and plan.data_parallel:
        per_microbatch += plan.pp  # ZeRO-2's reduce-scatter buckets (at least one per stage per micro-batch)
    per_microbatch += _data_parallel_tasks(plan)
    per_step = plan.pp * 16 + 2 * layers  # buckets, optimizer, gradient checks, parameter gathers per stage
    per_step += _metric_tasks(plan)
    pipelines = 1
    if scenario.ranks == "all":
        # sim.workload.build.folds_tp, restated on the Plan (importing build here would pull the cost models in)
        v = scenario.variation
        folded = scenario.fold_tp and plan.tp > 1 and not (v.slowdown or v.jitter or v.links)
        pipelines = plan.dp * plan.cp * (1 if folded else plan.tp)
    tasks = pipelines * (m * per_microbatch + per_step)
    engine = "event" if scenario.network.model == "contention" or scenario.engine == "event" else "longest_path"
    task_bytes = tasks * BYTES_PER_TASK
    nbytes = RUN_BYTES + task_bytes + plan.num_gpus * BYTES_PER_GPU[scenario.network.model]
    return RunSize(tasks, tasks * EVENTS_PER_TASK[engine], nbytes, pipelines, task_bytes)


def _metric_tasks(plan: Plan) -> int:
    """The train-metric sync's tasks on one pipeline: four per state per stage (sim.workload.train_metrics)."""
    return plan.pp * 4 * plan.scenario.training.train_metric_states


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _cause(plan: Plan, size: RunSize) -> tuple[str, str]:
    """The field that makes the run big (with its value) and what to do about it."""
    scenario = plan.scenario
    if size.pipelines > 1:
        return (f"ranks: all simulates {size.pipelines:,} pipelines of {plan.pp} stages",
                "use the default ranks: slice (one rank per stage; the same step time wherever ranks are "
                "symmetric) or a smaller cluster")
    if size.task_bytes * 2 < size.bytes and scenario.network.model == "contention":
        return (f"network.model: contention on {plan.num_gpus:,} GPUs (its flows grow with the groups)",
                "use network: analytic, or fewer GPUs")
    if _metric_tasks(plan) * 2 > size.tasks:  # the metric sync is most of the run
        return (f"training.train_metric_states: {scenario.training.train_metric_states:,} metric states synced "
                "after the step", "count the trainer's metric states (Composer's MPT: 4)")
    return (f"training: {plan.microbatches:,} micro-batches of {plan.model.num_layers} layers",
            "simulate fewer micro-batches (a smaller training.global_batch or a larger training.micro_batch; "
            "past the pipeline's fill the step grows linearly in them)")


def check_limits(plan: Plan, limits: Limits) -> RunSize:
    """``estimate_size(plan)``, or ``ResourceLimit`` (one line) where it exceeds ``limits``."""
    size = estimate_size(plan)
    if size.tasks > limits.max_tasks:
        field, advice = _cause(plan, size)
        raise ResourceLimit(f"{field}: an estimated {size.tasks:,} tasks, over the budget of {limits.max_tasks:,} "
                            f"(--max-tasks); {advice}")
    if size.bytes > limits.memory:
        field, advice = _cause(plan, size)
        raise ResourceLimit(f"{field}: an estimated {_gib(size.bytes)}, over the budget of {_gib(limits.memory)} "
                            f"(--max-memory); {advice}")
    return size
