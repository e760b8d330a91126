"""The estimate's stage-level replay of a pipeline schedule: each stage's passes in its schedule's order, each
waiting for the pass it needs on another stage plus one p2p time.

In: a schedule's action orders (sim.parallel.schedules) and its layout, resolved once per (schedule, p, m) by
``pass_dependencies``; per stage its forward, backward and weight-gradient times (``StageTimes``). Out:
``stage_level_replay``'s makespan and when each stage's last backward ends. The cross-chunk dependency is
``parallel.chunks.upstream``, the same rule the emitters' sends follow.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.parallel.chunks import Layout, PassKind, chunk_location, model_chunk, upstream
from sim.parallel.schedules import Action


@dataclass(frozen=True)
class StageTimes:
    """One pipeline stage's times for one micro-batch."""

    forward: float  # one micro-batch, all chunks, TP collectives included
    backward: float  # input-gradient pass (+ weight gradients unless split) with recomputation
    weight: float  # split weight-gradient pass (zero-bubble schedules)
    layer_backward: float  # one layer's backward, for when gradients become final
    layers: int
    pair_overlap: float = 0.0  # MoE dispatch/combine an F&B pair hides (all chunks; DualPipe's interleaved pairs)


Pass = tuple[PassKind, tuple[PassKind, int, int], tuple[PassKind, int, int] | None, bool, bool]


def pass_dependencies(orders: list[list[Action]], layout: Layout,
                      last: int | None = None) -> tuple[int, list[list[Pass]]]:
    """A schedule's action orders resolved once for ``stage_level_replay``: the chunks per stage, and per stage
    each pass's (phase, (phase, model chunk, micro-batch), the pass it needs (``parallel.chunks.upstream``),
    whether that pass ran on another stage, whether it is issued as one unit with the next, ``Action.with_next``).
    ``last``: the last model chunk (default p x chunks per stage - 1;
    DualPipe's two copies of p chunks end at p-1)."""
    p = len(orders)
    v = 1 + max(action.chunk for order in orders for action in order)
    last = p * v - 1 if last is None else last
    resolved = []
    for s, order in enumerate(orders):
        passes = []
        for action in order:
            g = model_chunk(layout, p, s, action.chunk)
            dep = upstream(action.phase, g, action.microbatch, last)
            crosses = dep is not None and chunk_location(layout, p, dep[1], action.chunk)[0] != s
            passes.append((action.phase, (action.phase, g, action.microbatch), dep, crosses, action.with_next))
        resolved.append(passes)
    return v, resolved


def stage_level_replay(chunks: int, passes: list[list[Pass]], stages: list[StageTimes],
                       c: float) -> tuple[float, list[float]]:
    """Makespan of a schedule's passes (``pass_dependencies``) with each stage's F, B and W split evenly over
    its ``chunks`` chunks and one p2p time ``c`` between stages; and when each stage's last B ends."""
    p = len(passes)
    done: dict[tuple[str, int, int], float] = {}
    position, free, last_b = [0] * p, [0.0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for s, order in enumerate(passes):
            times = {"F": stages[s].forward / chunks, "B": stages[s].backward / chunks,
                     "W": stages[s].weight / chunks}
            while position[s] < len(order):
                # one issued unit: a pass, or passes issued together (DualPipe's F&B pairs), which start once every
                # input from outside the unit is there and deliver their outputs when the whole unit ends
                end = position[s]
                while order[end][4]:
                    end += 1
                unit = order[position[s]:end + 1]
                inside = {key for _, key, _, _, _ in unit}
                needs = [(dep, crosses) for _, _, dep, crosses, _ in unit if dep is not None and dep not in inside]
                if any(dep not in done for dep, _ in needs):
                    break
                ready = max([free[s]] + [done[dep] + (c if crosses else 0.0) for dep, crosses in needs])
                free[s] = ready + sum(times[phase] for phase, _, _, _, _ in unit)
                if {"F", "B"} <= {phase for phase, _, _, _, _ in unit}:  # an F&B pair: its passes interleave
                    free[s] -= stages[s].pair_overlap / chunks
                for phase, key, _, _, _ in unit:
                    done[key] = free[s]
                    if phase == "B":
                        last_b[s] = free[s]
                position[s] = end + 1
                progress = True
    return max(free), last_b
