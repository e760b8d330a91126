"""ZB-V: the V-shaped zero-bubble schedule of Qi et al. ("Pipeline Parallelism with Controllable Memory",
NeurIPS 2024; zero-bubble-pipeline-parallelism repository), built as a pure function of (p, m).

In: stages p and micro-batches m. Out: per stage, the ordered passes (phase "F"/"B"/"W", chunk 0/1,
micro-batch). Layout: each stage holds two model chunks in a V: chunk 0 of stage s is model chunk s (the
forward runs stage 0 -> p-1), chunk 1 is model chunk 2p-1-s (the forward comes back p-1 -> 0), so the loss
is on stage 0 and the turn at the last stage needs no communication. A micro-batch's backward runs chunk 1
(stage 0 -> p-1), then chunk 0 (p-1 -> 0); W passes follow their B on the same stage.

Construction (the paper's round-based heuristic, written anew), with unit costs F = B = W = 1 and no
communication time, as handcrafted schedules are derived; the order is then replayed with the real costs:
1. each stage starts one chunk-0 forward; 2. from the last stage up, chunk-0 forwards fill the wait for
micro-batch 0's chunk-1 forward, within the memory limit of 2p chunk-activations (1F1B's peak);
3. forward counts are balanced down the pipeline; 4. rounds of one backward and one forward per stage, each
preceded by W passes wherever its input would otherwise leave the stage idle, and by W passes that free
memory; 5. the remaining W passes. Variants with and without filling before B and F are tried, and a second
pass may accept the first pass's per-stage bubbles; the order with the smallest worst-stage bubble is kept.
With m >= 2p the result has no idle time inside any stage's span.
"""

from __future__ import annotations

from collections import deque

from sim.parallel.chunks import chunk_location, model_chunk, upstream

Pass = tuple[str, int, int]  # (phase, chunk, microbatch)
_MEMORY = {"F": 1, "B": 0, "W": -1}  # chunk-activations: allocated by F, freed by W


class _Builder:
    def __init__(self, p: int, m: int, fill_b: bool, fill_f: bool, approved: list[float] | None) -> None:
        self.p, self.m, self.fill_b, self.fill_f = p, m, fill_b, fill_f
        self.limit = 2 * p
        self.end: dict[tuple[str, int, int, int], float] = {}
        self.now = [0.0] * p
        self.memory = [0] * p
        self.bubble = [0.0] * p
        self.count = [{(ph, ch): 0 for ph in "FBW" for ch in (0, 1)} for _ in range(p)]
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.order: list[list[Pass]] = [[] for _ in range(p)]
        self.approved = approved or [-1.0] * p
        self.most_approved = max(self.approved)
        self.needs = _needs(p)

    def dependency(self, phase: str, chunk: int, stage: int, j: int) -> tuple[str, int, int, int] | None:
        """The pass on another stage this one waits for (same-stage order is implied by the stream)."""
        needs = self.needs[phase, chunk, stage]
        return None if needs is None else (*needs, j)

    def worst_bubble(self, stage: int) -> float:
        return max(max(self.bubble), self.most_approved - self.approved[stage])

    def put(self, phase: str, chunk: int, stage: int) -> None:
        j = self.count[stage][(phase, chunk)]
        start = self.now[stage]
        needs = self.needs[phase, chunk, stage]  # self.dependency, inline
        if needs is not None:
            arrives = self.end[(*needs, j)]
            if arrives > start:
                start = arrives
        if self.count[stage][("F", 0)] > 0:
            self.bubble[stage] += start - self.now[stage]
        self.end[(phase, chunk, stage, j)] = self.now[stage] = start + 1.0
        self.memory[stage] += _MEMORY[phase]
        self.count[stage][(phase, chunk)] += 1
        self.order[stage].append((phase, chunk, j))
        if phase == "B":
            self.pending[stage].append((chunk, j))

    def put_w(self, stage: int) -> None:
        chunk, _ = self.pending[stage].popleft()
        self.put("W", chunk, stage)

    def fill_before(self, phase: str, chunk: int, stage: int, fill: bool) -> None:
        """W passes in the time the next pass would wait for its input, and one more if that wait would
        exceed the worst bubble allowed."""
        needs = self.dependency(phase, chunk, stage, self.count[stage][(phase, chunk)])
        if needs is None:
            return
        while self.pending[stage] and self.end[needs] >= self.now[stage] + 1.0:
            self.put_w(stage)
        if self.pending[stage] and self.end[needs] - self.now[stage] > self.worst_bubble(stage) - self.bubble[stage]:
            if fill:
                self.put_w(stage)

    def warm_up(self) -> None:
        p, m = self.p, self.m
        for stage in range(p):
            self.put("F", 0, stage)
        for stage in range(p - 1, -1, -1):
            if stage < p - 1:
                arrival = self.end[("F", 1, stage + 1, 0)]
                while (self.memory[stage] + 2 + 2 * stage <= self.limit and self.now[stage] + 1.0 <= arrival
                       and self.count[stage][("F", 0)] < m - stage):
                    for upstream in range(stage + 1):
                        self.put("F", 0, upstream)
            self.put("F", 1, stage)
        chunk = 0
        for stage in range(1, p):
            mine, before = self.count[stage], self.count[stage - 1]
            while (mine[("F", 0)] + mine[("F", 1)] < before[("F", 0)] + before[("F", 1)]
                   or mine[("F", 1)] <= before[("F", 1)] < m):
                stages = range(stage, p) if chunk == 0 else range(p - 1, stage - 1, -1)  # the chunk's direction
                for target in stages:
                    if self.count[target][("F", chunk)] < m:
                        self.put("F", chunk, target)
                chunk = 1 - chunk

    def next_backward_chunk(self, stage: int) -> int:
        count = self.count[stage]
        if count[("B", 1)] <= count[("B", 0)]:
            return 1
        if stage == self.p - 1:
            return 0
        ready = ("B", 0, stage + 1, count[("B", 0)]) in self.end
        return 0 if ready or count[("B", 1)] >= self.m else 1

    def next_forward_chunk(self, stage: int) -> int | None:
        count = self.count[stage]
        if count[("F", 1)] >= count[("F", 0)]:
            return 0
        if stage == self.p - 1 or ("F", 1, stage + 1, count[("F", 1)]) in self.end:
            return 1
        if count[("F", 0)] < self.m and (stage == 0 or ("F", 0, stage - 1, count[("F", 0)]) in self.end):
            return 0
        return None

    def steady(self) -> None:
        p, m = self.p, self.m
        for _ in range(2 * m):
            chunks = [self.next_backward_chunk(stage) for stage in range(p)]
            # Second-half backwards travel up the V: deepest stage first; first-half ones travel down.
            plan = [(s, 0) for s in reversed(range(p)) if chunks[s] == 0] + [(s, 1) for s in range(p) if chunks[s] == 1]
            for stage, chunk in plan:
                if self.count[stage][("B", chunk)] < m:
                    self.fill_before("B", chunk, stage, chunk == 0 or self.fill_b)
                    self.put("B", chunk, stage)
            for stage in range(p):
                forward = self.next_forward_chunk(stage)  # None when no forward is ready
                if forward is None or self.count[stage][("F", forward)] >= m or self.count[stage][("F", 1)] >= m:
                    continue
                while self.memory[stage] + _MEMORY["F"] > self.limit:
                    self.put_w(stage)
                self.fill_before("F", forward, stage, self.fill_f)
                self.put("F", forward, stage)
        for stage in range(p):
            while self.pending[stage]:
                self.put_w(stage)


def _needs(p: int) -> dict[tuple[str, int, int], tuple[str, int, int] | None]:
    """Per (phase, chunk, stage): the (phase, chunk, stage) on another stage whose pass of the same micro-batch it
    waits for (``upstream``, which keeps the micro-batch), None where it waits for none or for its own stage's."""
    table: dict[tuple[str, int, int], tuple[str, int, int] | None] = {}
    for phase in "FBW":
        for chunk in (0, 1):
            for stage in range(p):
                # the builder names passes by plain str ("F", "B", "W"); upstream takes the same letters as PassKind
                needs = upstream(phase, model_chunk("v", p, stage, chunk), 0, 2 * p - 1)  # type: ignore[arg-type]
                other, other_chunk = chunk_location("v", p, needs[1]) if needs is not None else (stage, 0)
                table[phase, chunk, stage] = None if needs is None or other == stage else (needs[0], other_chunk,
                                                                                           other)
    return table


def _build(p: int, m: int, fill_b: bool, fill_f: bool, approved: list[float] | None = None
           ) -> tuple[list[list[Pass]], float]:
    """One construction; retried with its own per-stage bubbles accepted as long as that lowers the worst."""
    builder = _Builder(p, m, fill_b, fill_f, approved)
    builder.warm_up()
    builder.steady()
    worst = max(builder.bubble)
    if approved is None or worst < max(approved):
        retry, retry_worst = _build(p, m, fill_b, fill_f, list(builder.bubble))
        if retry_worst < worst:
            return retry, retry_worst
    return builder.order, worst


def zb_v_passes(p: int, m: int) -> list[list[Pass]]:
    best: tuple[list[list[Pass]], float] | None = None
    for fill_b in (True, False):
        for fill_f in (True, False):
            order, worst = _build(p, m, fill_b, fill_f)
            if best is None or worst < best[1]:
                best = (order, worst)
    assert best is not None
    return best[0]
