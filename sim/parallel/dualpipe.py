"""DualPipe and DualPipeV: DeepSeek's bidirectional pipeline schedules, as pure per-rank orders of passes.

In: ranks p and micro-batches m. Out: per rank, the ordered compute chunks ``DualPipe.step`` / ``DualPipeV.step``
issue (github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py and dualpipev.py at 3da1bbe; DeepSeek-V3 technical
report Sec. 3.2.1), each a ``Chunk``: one pass, or two passes issued as one unit.

- ``dualpipe``: two copies of the model's p stages. Rank i runs stage i of the forward-direction copy (local
  chunk 0) and stage p-1-i of the reverse copy (local chunk 1); micro-batches 0..m/2-1 enter at rank 0 and
  m/2..m-1 at rank p-1 (``phase ^= is_in_second_half`` in the code: the second half of the ranks swap the two).
- ``dualpipev`` (Sea AI Lab's "cut-in-half"): one copy in a V over p ranks, 2p stages; chunk 0 of rank i is model
  chunk i, chunk 1 model chunk 2p-1-i (the ``v`` layout of sim.parallel.chunks, as ZB-V); every micro-batch
  enters and leaves at rank 0.

Both run the same eight steps per rank (for DualPipe with ``half_rank = min(i, p-1-i)`` and p/2 ranks in place of
p): 1 nF0, 2 nF0F1, 3 nB1W1F1 (zero-bubble: the weight pass deferred and run at once), 4 the main step
nF0B1F1B0 (overlapped F&B pairs), 5 nB1F1B0, 6 nB1B0 (the second half with W deferred), 7 nWB0, 8 nW. A backward
runs the weight gradients with it (``enable_zb=False``) except where the code defers them to WeightGradStore,
whose FIFO the W passes pop.

A ``Chunk`` keeps what the code does around ``_commit_and_wait_comm``: every receive the chunk needs completes
before its compute starts, and its sends are issued after all of its compute. An overlapped F&B pair is one chunk
(``_forward_backward_chunk``); a full backward is one chunk of B then W, so its input gradient leaves after the
weight gradients, as one autograd pass delivers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.parallel.chunks import PassKind


@dataclass(frozen=True, slots=True)
class Pass:
    phase: PassKind
    microbatch: int
    chunk: int


Chunk = tuple[Pass, ...]


class _Rank:
    """The counters one rank's ``step`` keeps: chunk ids per phase and the FIFO of deferred weight passes."""

    def __init__(self, swap: int, microbatch_of: list[int]) -> None:
        self.swap, self.microbatch_of = swap, microbatch_of  # phase -> first micro-batch of that direction
        self.f_id, self.b_id = [0, 0], [0, 0]
        self.deferred: list[Pass] = []
        self.chunks: list[Chunk] = []

    def _forward(self, phase: int) -> Pass:
        d = phase ^ self.swap
        self.f_id[d] += 1
        return Pass("F", self.microbatch_of[d] + self.f_id[d] - 1, d)

    def _backward(self, phase: int, zb: bool) -> tuple[Pass, ...]:
        d = phase ^ self.swap
        self.b_id[d] += 1
        backward = Pass("B", self.microbatch_of[d] + self.b_id[d] - 1, d)
        weight = Pass("W", backward.microbatch, d)
        if zb:
            self.deferred.append(weight)
            return (backward,)
        return backward, weight

    def forward(self, phase: int) -> None:
        self.chunks.append((self._forward(phase),))

    def backward(self, phase: int, zb: bool = False) -> None:
        self.chunks.append(self._backward(phase, zb))

    def forward_backward(self, phase0: int, phase1: int) -> None:
        self.chunks.append((self._forward(phase0), *self._backward(phase1, False)))

    def weight(self) -> None:
        self.chunks.append((self.deferred.pop(0),))


def _steps(rank: _Rank, half_ranks: int, half_rank: int, half_chunks: int, turns: bool) -> list[Chunk]:
    """The eight steps of ``DualPipe.step`` (``half_ranks`` ranks of a half, this rank's ``half_rank``,
    ``half_chunks`` micro-batches per direction); ``turns``: this rank is where the two phases meet (DualPipe's
    middle ranks, DualPipeV's last rank), whose first main-step pair is not overlapped."""
    for _ in range((half_ranks - half_rank - 1) * 2):  # step 1: nF0
        rank.forward(0)
    for _ in range(half_rank + 1):  # step 2: nF0F1
        rank.forward(0)
        rank.forward(1)
    for _ in range(half_ranks - half_rank - 1):  # step 3: nB1W1F1 (zero bubble)
        rank.backward(1, zb=True)
        rank.weight()
        rank.forward(1)
    for i in range(half_chunks - half_ranks * 2 + half_rank + 1):  # step 4 (main): nF0B1F1B0
        if i == 0 and turns:  # "We don't overlap these two chunks to further reduce bubble size."
            rank.forward(0)
            rank.backward(1)
        else:
            rank.forward_backward(0, 1)
        rank.forward_backward(1, 0)
    for _ in range(half_ranks - half_rank - 1):  # step 5: nB1F1B0
        rank.backward(1)
        rank.forward_backward(1, 0)
    steps_6 = half_rank + 1  # step 6: nB1B0, the second half of the chunks with W deferred
    zb = False
    for i in range(steps_6):
        if i == steps_6 // 2 and half_rank % 2 == 1:
            zb = True
        rank.backward(1, zb)
        if i == steps_6 // 2 and half_rank % 2 == 0:
            zb = True
        rank.backward(0, zb)
    for _ in range(half_ranks - half_rank - 1):  # step 7: nWB0
        rank.weight()
        rank.backward(0, zb=True)
    for _ in range(half_rank + 1):  # step 8: nW
        rank.weight()
    assert not rank.deferred
    return rank.chunks


def dualpipe_chunks(p: int, m: int) -> list[list[Chunk]]:
    """DualPipe on p ranks (even) with m micro-batches (even, >= 2p): m/2 enter at each end."""
    half = p // 2
    orders = []
    for i in range(p):
        swap = int(i >= half)
        rank = _Rank(swap, [0, m // 2])
        orders.append(_steps(rank, half, min(i, p - 1 - i), m // 2, i in (half - 1, half)))
    return orders


def dualpipev_chunks(p: int, m: int) -> list[list[Chunk]]:
    """DualPipeV on p ranks (2p stages in a V) with m >= 2p micro-batches, all entering at rank 0."""
    return [_steps(_Rank(0, [0, 0]), p, i, m, i == p - 1) for i in range(p)]


def dualpipe_rule(p: int, m: int, v: int) -> str | None:
    """DualPipe.step's asserts (num_ranks even; num_chunks even and >= 2 num_ranks), with one model copy of p
    stages per direction (vpp = 1: each rank holds two stages, one of each copy)."""
    if v != 1:
        return f"dualpipe holds two copies of one stage per rank: set parallel.vpp = 1 (not {v})"
    if p % 2:
        return f"dualpipe needs an even pp (not {p}): half the ranks send each way"
    if m % 2 or m < 2 * p:
        return f"dualpipe needs an even micro-batch count >= 2*pp = {2 * p} (not {m})"
    return None


def dualpipev_rule(p: int, m: int, v: int) -> str | None:
    """DualPipeV.step's assert (num_chunks >= 2 num_ranks), with the V's two model chunks per rank."""
    if v != 2:
        return f"dualpipev runs two model chunks per stage in a V: set parallel.vpp = 2 (not {v})"
    if m < 2 * p:
        return f"dualpipev needs micro-batches >= 2*pp = {2 * p} (not {m})"
    return None
