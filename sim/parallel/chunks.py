"""Model chunks on pipeline stages, and which pass of a micro-batch waits for which.

In: the layout (Megatron's interleaving, ZB-V's V, or DualPipe's two copies), stages p, and a (stage, local
chunk) or a model chunk. Out: ``model_chunk`` and its inverse ``chunk_location``; ``upstream``: the cross-chunk
dependency rule every pipeline consumer shares (the task-graph emitter's sends, the estimate's stage-level replay,
and the ZB-H2 and ZB-V schedule builders).
"""

from __future__ import annotations

import functools
from typing import Literal

PassKind = Literal["F", "B", "W"]
Layout = Literal["interleaved", "v", "dual"]


def model_chunk(layout: Layout, p: int, stage: int, chunk: int) -> int:
    """Which of the model's p*v chunks a stage's local chunk is: c*p + s interleaved (Megatron), and in a V
    chunk 0 of stage s is model chunk s and chunk 1 is model chunk 2p-1-s. DualPipe's ``dual`` layout keeps two
    copies of the model's p chunks (DeepSeek-V3 report Sec. 3.2.1): chunk 0 of stage s is chunk s of the copy whose
    micro-batches enter at stage 0, chunk 1 is chunk p-1-s of the copy whose micro-batches enter at stage p-1."""
    if layout == "v":
        return stage if chunk == 0 else 2 * p - 1 - stage
    if layout == "dual":
        return stage if chunk == 0 else p - 1 - stage
    return chunk * p + stage


@functools.cache
def stage_chunks(layout: Layout, p: int, local_chunks: int) -> tuple[tuple[int, ...], ...]:
    """Per stage, the model chunks its local chunks 0..local_chunks-1 hold (``model_chunk``), built once per
    (layout, p, local chunks): the search's plans ask for it layout after layout."""
    return tuple(tuple(model_chunk(layout, p, s, c) for c in range(local_chunks)) for s in range(p))


def chunk_location(layout: Layout, p: int, global_chunk: int, copy: int = 0) -> tuple[int, int]:
    """(stage, local chunk) holding a model chunk: the inverse of ``model_chunk``; in the ``dual`` layout, of the
    given copy (0: the forward-direction copy, 1: the reverse one), which is also the local chunk."""
    if layout == "v":
        return (global_chunk, 0) if global_chunk < p else (2 * p - 1 - global_chunk, 1)
    if layout == "dual":
        return (global_chunk, 0) if copy == 0 else (p - 1 - global_chunk, 1)
    return global_chunk % p, global_chunk // p


def upstream(phase: PassKind, global_chunk: int, microbatch: int,
             last_chunk: int) -> tuple[PassKind, int, int] | None:
    """The pass (phase, model chunk, micro-batch) that a micro-batch's pass on ``global_chunk`` needs first: a
    forward the forward of the chunk before (none on chunk 0); an input-gradient backward the backward of the
    chunk after, or on the last chunk its own forward (the loss); a weight-gradient pass its own backward."""
    if phase == "F":
        return ("F", global_chunk - 1, microbatch) if global_chunk > 0 else None
    if phase == "B":
        return ("B", global_chunk + 1, microbatch) if global_chunk < last_chunk else ("F", global_chunk, microbatch)
    return ("B", global_chunk, microbatch)
