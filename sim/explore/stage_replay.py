"""The estimate's stage-level replay of a pipeline schedule: each stage's passes in its schedule's order, each
waiting for the pass it needs on another stage plus one p2p time.

In: a schedule's action orders (sim.parallel.schedules) and its layout, resolved once per (schedule, p, m) by
``pass_dependencies``; per stage its forward, backward and weight-gradient times (``StageTimes``). Out:
``stage_level_replay``'s makespan and when each stage's gradients are final (its last B, or W where split);
``after_last_weight``: the passes a stage runs after each chunk's last W. The cross-chunk dependency is
``parallel.chunks.upstream``, the same rule the emitters' sends follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from sim.parallel.chunks import Layout, PassKind, chunk_location, model_chunk, upstream
from sim.parallel.schedules import Action


@dataclass(frozen=True)
class StageTimes:
    """One pipeline stage's times for one micro-batch."""

    forward: float  # one micro-batch, all chunks, TP collectives included
    backward: float  # input-gradient pass (+ weight gradients unless split) with recomputation
    weight: float  # split weight-gradient pass (zero-bubble schedules)
    layer_backward: float  # one layer's backward (its W pass if split), for when gradients become final
    layers: int
    pair_overlap: float = 0.0  # MoE dispatch/combine an F&B pair hides (all chunks; DualPipe's interleaved pairs)
    unit_comm: float = 0.0  # of backward: ZeRO-3/FSDP unit gathers and reduce-scatters the compute did not hide


Pass = tuple[PassKind, tuple[PassKind, int, int], tuple[PassKind, int, int] | None, bool, bool]


class Unit(NamedTuple):
    """One issued unit of ``stage_level_replay``: a pass, or passes issued together (DualPipe's F&B pairs), with
    its inputs from outside the unit resolved to result slots. ``needs``: (slot of the pass it waits for, whether
    that pass ran on another stage); ``slots``: the result slot of each of its passes; ``pair``: an F&B pair
    (its passes interleave); ``backward``: it holds a B or a W (a pass after which gradients may be final)."""

    stage: int
    phases: tuple[PassKind, ...]
    phase_index: tuple[int, ...]  # the phases as indices into (F, B, W)
    needs: tuple[tuple[int, bool], ...]
    slots: tuple[int, ...]
    pair: bool
    backward: bool


def pass_dependencies(orders: list[list[Action]], layout: Layout,
                      last: int | None = None) -> tuple[int, Units]:
    """A schedule's action orders resolved once for ``stage_level_replay``: the chunks per stage, and the issued
    units (``Unit``) in an order where each comes after the units it waits for (``_units``; any such order gives
    the same times, since a unit's times depend only on its stage's previous unit and its inputs), from the
    passes ``resolve_passes`` gives. ``last``: the last model chunk (default p x chunks per stage - 1; DualPipe's
    two copies of p chunks end at p-1)."""
    v = 1 + max(action.chunk for order in orders for action in order)
    return v, _units(resolve_passes(orders, layout, last))


def resolve_passes(orders: list[list[Action]], layout: Layout, last: int | None = None) -> list[list[Pass]]:
    """Each stage's passes in its order: (phase, (phase, model chunk, micro-batch), the pass it needs
    (``parallel.chunks.upstream``), whether that pass ran on another stage, ``Action.with_next``)."""
    p = len(orders)
    v = 1 + max(action.chunk for order in orders for action in order)
    last = p * v - 1 if last is None else last
    resolved: list[list[Pass]] = []
    for s, order in enumerate(orders):
        passes = []
        for action in order:
            g = model_chunk(layout, p, s, action.chunk)
            dep = upstream(action.phase, g, action.microbatch, last)
            crosses = dep is not None and chunk_location(layout, p, dep[1], action.chunk)[0] != s
            passes.append((action.phase, (action.phase, g, action.microbatch), dep, crosses, action.with_next))
        resolved.append(passes)
    return resolved


PassKey = tuple[PassKind, int, int]  # (phase, model chunk, micro-batch)
# a unit as _units groups it: its passes' keys, their inputs from outside the unit (key, on another stage), its
# phases, their indices into (F, B, W), whether it is an F&B pair, whether it holds a B
_Grouped = tuple[tuple[PassKey, ...], list[tuple[PassKey, bool]], tuple[PassKind, ...], tuple[int, ...], bool, bool]


class Units(list[Unit]):
    """``_units``' issued units, with ``single``: where every unit is one pass (every schedule but DualPipe's),
    each as (stage, its (F, B, W) time's index into the stages' flat times (3 x stage + phase), the slot of the
    pass it waits for or -1, whether that pass ran on another stage, whether it is a B), in issue order, which is
    its slot's: what ``stage_level_replay``'s loop reads without unpacking a ``Unit``; else None."""

    single: list[tuple[int, int, int, bool, bool]] | None = None


def _units(passes: list[list[Pass]]) -> Units:
    """The passes grouped into issued units (a pass, or the passes ``Action.with_next`` chains: DualPipe's F&B
    pairs), in an order where each unit comes after the units it waits for: each stage issues its units in its
    order while their inputs from outside the unit are done, and a stage waiting for a pass resumes once that pass
    is issued; units that wait for one another in a cycle (a deadlocked order) are never issued, as the replay
    would never run them."""
    # each stage's units with their inputs from outside the unit (_Grouped), found once
    pending: list[list[_Grouped]] = []
    for order in passes:
        grouped: list[_Grouped] = []
        start, count = 0, len(order)
        while start < count:
            end = start
            while order[end][4]:
                end += 1
            if end == start:  # one pass (every schedule's but DualPipe's F&B pairs)
                phase, key, dep, crosses, _ = order[start]
                grouped.append(((key,), [(dep, crosses)] if dep is not None else [], (phase,),
                                ("FBW".index(phase),), False, phase != "F"))
            else:
                unit = order[start:end + 1]
                inside = {key for _, key, _, _, _ in unit}
                phases = tuple(phase for phase, _, _, _, _ in unit)
                grouped.append((tuple(key for _, key, _, _, _ in unit),
                                [(dep, crosses) for _, _, dep, crosses, _ in unit
                                 if dep is not None and dep not in inside],
                                phases, tuple("FBW".index(phase) for phase in phases), {"F", "B"} <= set(phases),
                                phases != ("F",) * len(phases)))
            start = end + 1
        pending.append(grouped)
    # Issue each stage's units in order, a stage that waits for a pass parked until that pass is issued: a
    # topological order of the units (the sweep's may differ, but a unit's times depend only on its stage's
    # previous unit and its inputs, so the replay's floats do not).
    slot: dict[PassKey, int] = {}
    units = Units()
    single: list[tuple[int, int, int, bool, bool]] | None = []  # Units.single, while every unit is one pass
    position = [0] * len(passes)
    waiting: dict[PassKey, list[int]] = {}
    runnable = list(range(len(passes) - 1, -1, -1))  # a stack: stage 0 first
    while runnable:
        s = runnable.pop()
        grouped = pending[s]
        at, count = position[s], len(grouped)
        while at < count:
            keys, needs, phases, index, pair, backward = grouped[at]
            missing = None
            for dep, _ in needs:
                if dep not in slot:
                    missing = dep
                    break
            if missing is not None:
                waiting.setdefault(missing, []).append(s)
                break
            for key in keys:
                slot[key] = len(slot)
                woken = waiting.pop(key, None)
                if woken is not None:
                    runnable += woken
            resolved = tuple((slot[dep], crosses) for dep, crosses in needs) if needs else ()
            if len(keys) == 1:
                units.append(Unit(s, phases, index, resolved, (slot[keys[0]],), pair, backward))
                if single is not None:
                    single.append((s, 3 * s + index[0], resolved[0][0] if resolved else -1,
                                   bool(resolved) and resolved[0][1], backward))
            else:
                units.append(Unit(s, phases, index, resolved, tuple(slot[key] for key in keys), pair, backward))
                single = None
            at += 1
        position[s] = at
    units.single = single
    return units


def stage_level_replay(chunks: int, units: list[Unit] | Units, stages: list[StageTimes],
                       c: float) -> tuple[float, list[float]]:
    """Makespan of a schedule's issued units (``pass_dependencies``) with each stage's F, B and W split evenly
    over its ``chunks`` chunks and one p2p time ``c`` between stages; and when each stage's last B or W ends. Each
    unit starts once its stage is free and every input from outside it is there (plus ``c`` where that input
    ran on another stage), and delivers its outputs when the whole unit ends. Under a split backward the last
    W, not the last B, makes a stage's gradients final (the emitter's grad_ready): the W ends are returned. The
    same sums as a sweep over the stages: max of the inputs, then the unit's passes added in order."""
    p = len(stages)
    single = getattr(units, "single", None)
    if single is not None:  # one pass a unit, issued in slot order: the same sums without a Unit's fields
        flat = [time for st in stages for time in (st.forward / chunks, st.backward / chunks, st.weight / chunks)]
        done: list[float] = []
        free, last_b = [0.0] * p, [0.0] * p
        for s, index, dep, crosses, backward in single:
            ready = free[s]
            if dep >= 0:
                arrives = done[dep] + c if crosses else done[dep]
                if arrives > ready:
                    ready = arrives
            end = ready + flat[index]
            free[s] = end
            done.append(end)
            if backward:
                last_b[s] = end
        return max(free), last_b
    times = [(st.forward / chunks, st.backward / chunks, st.weight / chunks) for st in stages]
    done = [0.0] * (units[-1].slots[-1] + 1 if units else 0)  # slots are numbered in issue order
    free, last_b = [0.0] * p, [0.0] * p
    for s, _, index, needs, slots, pair, backward in units:
        ready = free[s]
        for dep, crosses in needs:
            arrives = done[dep] + c if crosses else done[dep]
            if arrives > ready:
                ready = arrives
        if len(index) == 1:
            end = ready + times[s][index[0]]
        else:
            end = ready + sum(times[s][i] for i in index)
        if pair:  # an F&B pair: its passes interleave
            end -= stages[s].pair_overlap / chunks
        free[s] = end
        for key in slots:
            done[key] = end
        if backward:
            last_b[s] = end
    return max(free), last_b


def after_last_weight(orders: list[list[Action]], chunks: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Per stage, per local chunk: how many F, B and W passes the stage's order (a split-backward schedule's
    ``actions``) runs after that chunk's last W, the pass that makes the chunk's gradients final (the emitter's
    grad_ready). ZB-H1/H2 end every stage on its one chunk's last W: (0, 0, 0). ZB-V's and DualPipe's other chunk
    finishes earlier: ZB-V's stage 0 at p 2 runs B and W of chunk 0 after chunk 1's last W, (0, 1, 2). A chunk
    with no W (no split) counts the whole order."""
    out = []
    for order in orders:
        counts = [0, 0, 0]
        found: list[tuple[int, int, int] | None] = [None] * chunks
        left = chunks
        for action in reversed(order):
            if action.phase == "W" and found[action.chunk] is None:
                found[action.chunk] = (counts[0], counts[1], counts[2])
                left -= 1
                if not left:
                    break
            counts["FBW".index(action.phase)] += 1
        out.append(tuple(f if f is not None else (counts[0], counts[1], counts[2]) for f in found))
    return tuple(out)
