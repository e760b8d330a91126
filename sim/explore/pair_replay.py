"""The span of a DualPipe F&B pair: its two passes' blocks taking turns on the compute stream, and the MoE
exchanges of both queued on one ``ep`` stream, with the dependencies the emitter gives them.

In: each pass as its blocks (``Block``), in the order the pass runs them: a pass is cut before every compute
task that waits for an ``ep`` exchange (``sim.workload.pair_interleave.interleave_pair``), so a block is the
compute up to the exchange it issues, that exchange (the collectives of one dispatch or combine, back to back),
and the compute issued after it that does not wait for it (the shared expert beside the dispatch and beside the
dispatch's gradient, Megatron-Core ``--moe-shared-expert-overlap``), with the TP collective that trails it and
where its first TP collective comes (one TP stream per rank, under sequence parallelism). Out: ``alone``, the
seconds of a pass run by itself, and ``pair_span``, the seconds from a pair's first compute task to its last;
the estimate's pair overlap is the difference (sim.explore.estimate).

The replay is the task graph's, block by block: the compute stream runs F0 B0 F1 B1 ... (F first, as DualPipe's
``overlapped_forward_backward`` issues them); a block starts when the block before it on the compute stream has
ended and its own pass's exchange has arrived; an exchange starts when its block has issued it and the ``ep``
stream has run every exchange issued before it, in that merged order. With a serial ``ep`` stream the pair is
bound by whichever of the two streams, with the waits between them, is longer: not by the sum of each
exchange hidden under the other pass's next block on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple


class Block(NamedTuple):
    """A piece of one pass between two MoE cut points (seconds). TP collectives the compute waits for (Megatron's
    synchronous ones) count as compute; the TP stream is one per rank, so one that trails a block holds it."""

    before: float  # compute up to where the block issues its exchange (all of it when it issues none)
    exchange: float | None  # the exchange it issues on the ``ep`` stream; None: none (a pass's last block)
    after: float  # compute issued after the exchange that does not wait for it (the shared expert)
    trailing: float = 0.0  # a TP collective after ``after`` (the shared expert's SP reduce-scatter): its own pass's
    # next block waits for it, the compute stream does not
    lead: float | None = None  # compute before the block's first TP collective (None: it has none), which waits
    # for the TP stream


def chain(pieces: Iterable[Sequence[Block]]) -> list[Block]:
    """Pieces of one pass (layers, a recomputed forward, the embedding, the head) joined in the order they run:
    a piece whose last block issues no exchange runs on into the next piece's first block (no cut between; a
    collective trailing it is waited for there)."""
    blocks: list[Block] = []
    for piece in pieces:
        for block in piece:
            if blocks and blocks[-1].exchange is None:
                last = blocks.pop()
                head = last.before + last.after + last.trailing
                lead = last.lead if last.lead is not None else (None if block.lead is None else head + block.lead)
                block = Block(head + block.before, block.exchange, block.after, block.trailing, lead)
            blocks.append(block)
    return blocks


def alone(blocks: Sequence[Block]) -> float:
    """Seconds of a pass by itself: after each block the next waits for the block's exchange and for the compute
    issued beside it with its trailing collective, whichever ends later."""
    return sum(b.before + (b.after + b.trailing if b.exchange is None else max(b.exchange, b.after + b.trailing))
               for b in blocks)


def pair_span(forward: Sequence[Block], backward: Sequence[Block], held: float = 0.0) -> float:
    """Seconds from the pair's first task to its last compute task: F's and B's blocks alternating on the compute
    stream (F0 B0 F1 B1 ..., a pass with fewer blocks leaving the rest to the other), their exchanges on one
    ``ep`` stream in that order, each block after its own pass's previous exchange and trailing collective, and
    its first TP collective after the TP stream's trailing one. ``held``: the share of the GPU's SMs an exchange
    holds while it runs (DeepEP's, n/S): compute progresses at 1 - held while the ``ep`` stream is busy, as
    sim.engine.sm_contention's fixed point has it (a task overlapped by H seconds of exchange takes d + held H)."""
    compute = ep = tp = 0.0  # when each stream is next free (tp: of the collectives that trail a block)
    arrives = [0.0, 0.0]  # per pass: when what its next block waits for ends
    busy: list[tuple[float, float]] = []  # the ep stream's exchanges so far, in time order
    passes = (forward, backward)
    for i in range(max(len(forward), len(backward))):
        for k, blocks in enumerate(passes):
            if i >= len(blocks):
                continue
            block = blocks[i]
            start = max(compute, arrives[k])
            if block.lead is not None and tp > start + block.lead:
                start = tp - block.lead
            issued = _advance(start, block.before, busy, held)
            if block.exchange is not None:
                begins = max(ep, issued)
                ep = begins + block.exchange
                busy.append((begins, ep))
            compute = arrives[k] = _advance(issued, block.after, busy, held)
            if block.trailing:
                tp = arrives[k] = max(tp, compute) + block.trailing
            if block.exchange is not None:
                arrives[k] = max(arrives[k], ep)
    return compute


def _advance(start: float, work: float, busy: Sequence[tuple[float, float]], held: float) -> float:
    """When ``work`` seconds of compute begun at ``start`` end: at rate 1, or 1 - ``held`` inside the ``busy``
    intervals (disjoint, in order)."""
    if not held or work <= 0:
        return start + work
    now, left = start, work
    for begins, ends in busy:
        if ends <= now:
            continue
        if begins > now:  # a free stretch before this exchange
            if now + left <= begins:
                return now + left
            left -= begins - now
            now = begins
        rate = 1.0 - held
        if now + left / rate <= ends:
            return now + left / rate
        left -= (ends - now) * rate
        now = ends
    return now + left
