"""Pipeline schedules as pure functions.

In: the number of stages p and micro-batches m. Out: for every stage, the ordered list of ``Action``s
(forward or backward of one micro-batch) that its compute stream runs, plus the bound on micro-batches a
stage holds in flight (forward done, backward not yet), which the memory model uses.

Timing is not decided here: the engine replays the order, and bubbles emerge from the dependencies between
stages. GPipe (Huang et al. 2019) runs all forwards then all backwards; 1F1B (PipeDream-Flush, Narayanan et
al. SC21 Sec. 2.2.1) runs p-s-1 warm-up forwards on stage s, then alternates one forward and one backward,
then drains the remaining backwards. Both take (m+p-1)(t_f+t_b) with bubble fraction (p-1)/(m+p-1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

Phase = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
class Action:
    phase: Phase
    microbatch: int


def gpipe(p: int, m: int) -> list[list[Action]]:
    order = [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    return [list(order) for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    stages: list[list[Action]] = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            actions += [Action("F", warmup + i), Action("B", i)]
        actions += [Action("B", j) for j in range(m - warmup, m)]
        stages.append(actions)
    return stages


def gpipe_in_flight(p: int, m: int, stage: int) -> int:
    return m


def one_f_one_b_in_flight(p: int, m: int, stage: int) -> int:
    return min(p - stage, m)


@dataclass(frozen=True)
class Schedule:
    name: str
    actions: Callable[[int, int], list[list[Action]]]
    in_flight: Callable[[int, int, int], int]


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("gpipe", gpipe, gpipe_in_flight),
    "1f1b": Schedule("1f1b", one_f_one_b, one_f_one_b_in_flight),
}
