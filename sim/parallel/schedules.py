"""Pipeline schedules as pure functions.

In: stages p, micro-batches m and model chunks per stage v. Out: for every stage, the ordered list of
``Action``s its compute stream runs: ``F`` (forward), ``B`` (backward; the input gradient only when the
schedule splits the backward) and ``W`` (weight gradient) of one (micro-batch, chunk); plus the most
micro-batch-chunks a stage holds in flight (forward done, last backward pass not yet), which the memory model
uses, and a validity rule on (p, m, v).

Timing is not decided here: the engine replays the order and the bubbles emerge from the dependencies.
- ``gpipe`` (Huang et al. 2019): all forwards, then all backwards; (m+p-1)(t_f+t_b).
- ``1f1b`` (PipeDream-Flush, Narayanan et al. SC21 Sec. 2.2.1): p-s-1 warm-up forwards on stage s, then one
  forward and one backward alternately, then the drain; same time as GPipe, at most p-s in flight.
- ``interleaved`` (Narayanan et al. SC21 Sec. 2.2.2, Megatron-LM's order): v chunks per stage, virtual
  micro-batch k runs chunk (k // p) % v of micro-batch (k // pv)p + k % p; warm-up 2(p-s-1) + (v-1)p
  forwards (all of them when m == p); m must be a multiple of p. Bubble (p-1)/v (t_f+t_b).
- ``zb-v`` (Qi et al. NeurIPS 2024, V-shaped, sim.parallel.zbv): two chunks per stage placed in a V (the forward goes
  down the stages and comes back up), zero bubble with 1F1B's memory (2p chunk-activations) when m >= 2p.
- ``dualpipe``, ``dualpipev`` (DeepSeek-V3 report Sec. 3.2.1; github.com/deepseek-ai/DualPipe; sim.parallel.dualpipe):
  the bidirectional schedule (two model copies, micro-batches entering at both ends) and its V-shaped half, with
  W split from B where the code defers it, and forward/backward pairs issued as one unit (``Action.with_next``).
- ``zb-h1``, ``zb-h2`` (Qi et al. ICLR 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1): the backward is
  split into B and W. ZB-H1 keeps 1F1B's warm-up and defers the first s W passes of stage s to the tail
  (bubble (p-1)(T_F+T_B-T_W), memory as 1F1B's p micro-batches). ZB-H2 fills the warm-up with extra forwards
  and the tail with W passes (bubble (p-1)(T_F+T_B-2T_W), 2p-1 micro-batches in flight on every stage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from sim.parallel.chunks import Layout, PassKind, upstream
from sim.parallel.dualpipe import Chunk, dualpipe_chunks, dualpipe_rule, dualpipev_chunks, dualpipev_rule
from sim.parallel.zbv import zb_v_passes

__all__ = ["A2A_OVERLAP", "SCHEDULES", "Action", "Layout", "PassKind", "Schedule"]


@dataclass(frozen=True, slots=True)
class Action:
    """One pass of a stage's compute stream. ``with_next``: this pass and the next form one issued unit (DualPipe's
    ``_forward_backward_chunk``, or a backward that runs its weight gradients in the same autograd pass): the
    unit's receives all complete before its first pass starts, and its sends leave after its last pass."""

    phase: PassKind
    microbatch: int
    chunk: int = 0
    with_next: bool = False


def gpipe(p: int, m: int, v: int = 1) -> list[list[Action]]:
    order = [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    return [list(order) for _ in range(p)]


def one_f_one_b(p: int, m: int, v: int = 1) -> list[list[Action]]:
    stages: list[list[Action]] = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            actions += [Action("F", warmup + i), Action("B", i)]
        actions += [Action("B", j) for j in range(m - warmup, m)]
        stages.append(actions)
    return stages


def _interleaved_warmup(p: int, m: int, v: int, stage: int) -> int:
    return m * v if m == p else min(2 * (p - stage - 1) + (v - 1) * p, m * v)


def interleaved(p: int, m: int, v: int, a2a_overlap: bool = False) -> list[list[Action]]:
    """Megatron-LM's interleaved order. ``a2a_overlap``: its combined 1F1B (--overlap-moe-expert-parallel-comm,
    megatron/core/pipeline_parallel/schedules.py and combined_1f1b.py): one more warm-up forward ("we schedule one
    extra micro-batch forward step before the 1f1b stages ... to ensure the forward and backward computations are
    independent in all 1f1b steps") and each steady-state forward issued with the backward after it as one unit
    (``with_next``: combined_1f1b_schedule_for_interleaved_pipelining receives both inputs, runs the merged
    forward-backward step layer by layer, then sends both outputs). With p = 1 and v = 1 this is its
    combined_1f1b_schedule_for_no_pipelining: F0, then (F i+1, B i) pairs, then the last B."""
    total = m * v

    def virtual(k: int, phase: PassKind, with_next: bool = False) -> Action:
        chunk = (k // p) % v
        return Action(phase, (k // (p * v)) * p + k % p, chunk if phase == "F" else v - 1 - chunk, with_next)

    stages: list[list[Action]] = []
    for s in range(p):
        warmup = min(_interleaved_warmup(p, m, v, s) + a2a_overlap, total)
        actions = [virtual(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            actions += [virtual(warmup + k, "F", a2a_overlap), virtual(k, "B")]
        actions += [virtual(k, "B") for k in range(total - warmup, total)]
        stages.append(actions)
    return stages


def interleaved_a2a_overlap(p: int, m: int, v: int) -> list[list[Action]]:
    return interleaved(p, m, v, a2a_overlap=True)


def combined_pairs(p: int, v: int, stage: int) -> tuple[tuple[int, int, int], ...]:
    """The F&B pairs ``interleaved_a2a_overlap`` issues on ``stage`` in its steady state, as (forward's local
    chunk, backward's local chunk, how many) over one period of p x v pairs (the pairs pair virtual forward
    k + warm-up with virtual backward k; the chunks repeat every p x v), for any m large enough to reach the
    steady state: what the estimate weights each kind of pair by."""
    warmup = 2 * (p - stage - 1) + (v - 1) * p + 1
    counts: dict[tuple[int, int], int] = {}
    for k in range(p * v):
        pair = (((k + warmup) // p) % v, v - 1 - (k // p) % v)
        counts[pair] = counts.get(pair, 0) + 1
    return tuple((a, b, n) for (a, b), n in sorted(counts.items()))


def zb_h1(p: int, m: int, v: int = 1) -> list[list[Action]]:
    stages: list[list[Action]] = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action("F", j) for j in range(warmup)]
        done_w = 0
        for i in range(m - warmup):
            actions += [Action("F", warmup + i), Action("B", i)]
            if i >= s:  # stage s keeps s weight-gradient passes back to fill its cool-down bubbles
                actions.append(Action("W", done_w))
                done_w += 1
        for i in range(m - warmup, m):
            actions.append(Action("B", i))
            if i >= s:
                actions.append(Action("W", done_w))
                done_w += 1
        actions += [Action("W", j) for j in range(done_w, m)]
        stages.append(actions)
    return stages


def zb_h2(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """ZB-H2 as Qi et al. derive their handcrafted schedules: with T_F = T_B = T_W = 1 and no communication
    time, every stage runs, at each unit of time, the first ready pass in the order B, F, W, starting a
    forward only while fewer than 2p-1 micro-batches are in flight (forward done, W not yet). Forwards fill the
    warm-up bubble and W passes the tail, so the unit-time makespan is 3m + p - 1 with no idle time inside any
    stage's span (the parallelogram of their Fig. 3). The order is then replayed with the real costs."""
    limit = 2 * p - 1
    finished: dict[tuple[str, int, int], int] = {}  # (phase, stage = chunk, microbatch) -> unit time it ends
    started = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
    orders: list[list[Action]] = [[] for _ in range(p)]

    def ready(phase: PassKind, stage: int, j: int, now: int) -> bool:
        counts = started[stage]
        needs = upstream(phase, stage, j, p - 1)  # one chunk per stage: model chunk = stage
        arrived = needs is None or finished.get(needs, now + 1) <= now
        if phase == "F":
            return counts["F"] - counts["W"] < limit and arrived
        if phase == "B":
            return counts["F"] > j and arrived
        return arrived

    now = 0
    while any(counts["W"] < m for counts in started):
        picks: list[tuple[int, PassKind]] = []
        for stage in range(p):
            order: tuple[PassKind, ...] = ("B", "F", "W")
            pick = next((ph for ph in order if started[stage][ph] < m and ready(ph, stage, started[stage][ph], now)),
                        None)
            if pick is not None:
                picks.append((stage, pick))
        for stage, phase in picks:  # all stages decide on the state at the start of the unit, then run
            j = started[stage][phase]
            started[stage][phase] += 1
            finished[(phase, stage, j)] = now + 1
            orders[stage].append(Action(phase, j))
        now += 1
    return orders


def zb_v(p: int, m: int, v: int = 2) -> list[list[Action]]:
    return [[Action(phase, j, chunk) for phase, chunk, j in passes] for passes in zb_v_passes(p, m)]  # type: ignore[arg-type]


def _unit_actions(orders: list[list[Chunk]]) -> list[list[Action]]:
    return [[Action(part.phase, part.microbatch, part.chunk, i < len(chunk) - 1)
             for chunk in order for i, part in enumerate(chunk)] for order in orders]


def dualpipe(p: int, m: int, v: int = 1) -> list[list[Action]]:
    return _unit_actions(dualpipe_chunks(p, m))


def dualpipev(p: int, m: int, v: int = 2) -> list[list[Action]]:
    return _unit_actions(dualpipev_chunks(p, m))


@lru_cache(maxsize=64)
def _dual_in_flight(name: str, p: int, m: int) -> tuple[int, ...]:
    build = dualpipe if name == "dualpipe" else dualpipev
    return tuple(in_flight_peak(actions, splits_backward=True) for actions in build(p, m))


def _no_rule(p: int, m: int, v: int) -> str | None:
    return None if v == 1 else f"this schedule runs one model chunk per stage, not vpp = {v}"


def _v_rule(p: int, m: int, v: int) -> str | None:
    return None if v == 2 else f"zb-v runs two model chunks per stage: set parallel.vpp = 2 (not {v})"


def _interleaved_rule(p: int, m: int, v: int) -> str | None:
    if m % p:
        return f"interleaved needs the micro-batch count ({m}) to be a multiple of pp ({p})"
    return None


def in_flight_peak(actions: list[Action], splits_backward: bool) -> int:
    """Most (micro-batch, chunk) pairs a stage holds between their forward and their last backward pass."""
    last = "W" if splits_backward else "B"
    alive = peak = 0
    for action in actions:
        if action.phase == "F":
            alive += 1
            peak = max(peak, alive)
        elif action.phase == last:
            alive -= 1
    return peak


@dataclass(frozen=True)
class Schedule:
    name: str
    actions: Callable[[int, int, int], list[list[Action]]]
    in_flight: Callable[[int, int, int, int], int]  # (p, m, v, stage) -> bound in (micro-batch, chunk) units
    splits_backward: bool = False
    rule: Callable[[int, int, int], str | None] = _no_rule
    layout: Layout = "interleaved"

    def invalid_reason(self, p: int, m: int, v: int) -> str | None:
        return self.rule(p, m, v)


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("gpipe", gpipe, lambda p, m, v, s: m),
    "1f1b": Schedule("1f1b", one_f_one_b, lambda p, m, v, s: min(p - s, m)),
    "interleaved": Schedule("interleaved", interleaved,
                            lambda p, m, v, s: min(_interleaved_warmup(p, m, v, s) + 1, m * v),
                            rule=_interleaved_rule),
    "zb-h1": Schedule("zb-h1", zb_h1, lambda p, m, v, s: min(p, m), splits_backward=True),
    "zb-h2": Schedule("zb-h2", zb_h2, lambda p, m, v, s: min(2 * p - 1, m), splits_backward=True),
    "zb-v": Schedule("zb-v", zb_v, lambda p, m, v, s: min(2 * p, 2 * m), splits_backward=True, rule=_v_rule,
                     layout="v"),
    "dualpipe": Schedule("dualpipe", dualpipe, lambda p, m, v, s: _dual_in_flight("dualpipe", p, m)[s],
                         splits_backward=True, rule=dualpipe_rule, layout="dual"),
    "dualpipev": Schedule("dualpipev", dualpipev, lambda p, m, v, s: _dual_in_flight("dualpipev", p, m)[s],
                          splits_backward=True, rule=dualpipev_rule, layout="v"),
}

# What a schedule becomes under moe.a2a_overlap (Megatron-Core's EP A2A overlap: the interleaved schedule's
# combined 1F1B; with pp = 1 any of these is its no-pipelining form): one extra warm-up forward, and the forward
# of each steady-state pair is in flight beside the backward it runs with.
A2A_OVERLAP: dict[str, Schedule] = {
    name: Schedule(name, interleaved_a2a_overlap,
                   lambda p, m, v, s: min(_interleaved_warmup(p, m, v, s) + 2, m * v), rule=_interleaved_rule)
    for name in ("interleaved", "1f1b", "gpipe")
}
