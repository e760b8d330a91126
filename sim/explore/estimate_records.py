"""The records the closed-form estimate's parts pass between them (sim.explore.estimate).

In: nothing (plain NamedTuples and frozen dataclasses). Out: ``Estimate``, the step time and its parts, MFU and the
memory bound a caller reads; and the estimator's own records, each kept in its caches: one layer's times
(``_LayerTimes``), its blocks as DualPipe's F&B pairs cut them (``_PairBlocks``, ``_ChunkLayers``), what sets a stage
apart (``_StageShape``), a stage's data-parallel tail apart from its times (``_TailShape``), what a layout's shape
decides (``_ShapeParts``) and its stage times' key (``_Timing``), where a first forward waits for weight all-gathers
(``_Gate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from sim.costs.models import ComputePhase
from sim.explore.pair_replay import Block


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    pipeline_s: float
    exposed_dp_s: float
    optimizer_s: float
    mfu: float
    tflops_per_gpu: float
    peak_memory_bytes: float
    fits_in_memory: bool
    bound_s: float  # no layout's step is shorter: each stage runs its m micro-batches' work back to back


class _Timing(NamedTuple):
    """What a layout's estimate reads that its stage times' key decides (the pipeline and the micro-batches), kept
    with them (``Estimator._timing``), so the screen reads no fact of a layout's plan once its parts are priced."""

    hop: float  # one pipeline send (Estimator._p2p)
    microbatches: int
    visits: float  # micro-batches each stage runs per step (half of them per copy in DualPipe's two copies)
    pp: int
    vpp: int
    local_chunks: int
    interleaved: bool  # the interleaved schedule (its chunks' backwards end apart: Estimator._tail)
    # under a split backward, per stage and local chunk the (F, B, W) passes after the chunk's last W
    # (Estimator._after_last_weight); None without one
    after_weight: tuple[tuple[tuple[int, int, int], ...], ...] | None


class _Gate(NamedTuple):
    """Where a stage's first forward waits for weight all-gathers under ZeRO-1/2's ``overlap_param_gather``
    (``Estimator._param_gates``): at a layer where a bucket of the dense chain (0) or the expert chain (1) starts."""

    chunk: int  # the stage's local chunk
    waits: tuple[tuple[int, float], ...]  # (chain, the bucket's all-gather seconds), dense first
    layers: int  # layers computed from here to the next gate, or to the chunk's end
    next_chunk: bool  # the next gate is in a later chunk: the pipeline fill runs before it


class _ShapeParts(NamedTuple):
    """What a layout's estimate reads that its shape (``LayoutKeys.shape``: no micro-batch size, recomputation or
    SP) decides: its sharding's facts, FSDP + PP's unit gathers and every stage's tail shape
    (``Estimator._parts_of_shape``)."""

    stages_zero: int | None  # the ZeRO stage where it changes the stage times (weights gathered per unit), else None
    # ZeRO-1/2's per-bucket weight gathers under the forward (step.overlaps_param_gather): per stage, where its
    # first forward waits for them (Estimator._param_gates); else None
    param_gates: list[list[_Gate]] | None
    unit_ends: list[list[list[float]]] | None  # FSDP + PP: Estimator._unit_gather_ends, else None
    unit_layers: int
    tails: list[_TailShape]  # every stage's (Estimator._tail_shape)
    data_parallel: bool
    zero_stage: int
    pipelined_fsdp: bool
    owner: Any  # keeps the objects the shape key names alive


class _LayerTimes(NamedTuple):
    """One transformer layer's times for one micro-batch (Estimator._layer_times)."""

    split: bool  # the schedule splits the backward (its weight gradients run apart)
    backward_phase: ComputePhase  # the phase the backward's pieces are priced in
    forward: float  # TP collectives and CP's exposed exchanges included
    backward: float  # fused (or input-gradient) pass, selective recomputation and CP included
    weight: float  # the split weight-gradient pass (0 unless split)
    frozen: tuple[float, float] | None  # (backward, weight) of a layer ``training.method: frozen`` freezes
    dense: tuple[float, float, float]  # a MoE model's dense layer: (forward, backward, weight); zeros if dense
    moe: tuple[float, float, float]  # its MoE layer's; zeros in a dense model
    pair: _PairBlocks | None  # a MoE model's layers as DualPipe's F&B pairs cut them (Estimator._pair_overlap)
    rebuilt_moe: float  # what full recomputation adds to a MoE layer's backward (Estimator._rebuilt_moe); 0 if dense


class _PairBlocks(NamedTuple):
    """A MoE model's layers as blocks (sim.explore.pair_replay.Block), (forward, backward) each, for
    ``Estimator._pair_overlap``: a dense layer is one block per pass, a MoE layer is cut at its exchanges
    (``Estimator._moe_layer``)."""

    dense: tuple[tuple[Block, ...], tuple[Block, ...]]
    moe: tuple[tuple[Block, ...], tuple[Block, ...]]


# A local chunk as a DualPipe pair runs it: (embedding, head, (MoE layer, recomputed) per layer in forward order)
_ChunkLayers = tuple[bool, bool, tuple[tuple[bool, bool], ...]]


class _StageShape(NamedTuple):
    """What sets a stage's times apart from another's of the same layout (Estimator._stages)."""

    layers: int
    moe_layers: int  # of them MoE layers (0 in a dense model)
    recomputed: int  # layers full recomputation rebuilds
    recomputed_moe: int  # of them MoE layers (a MoE model's dense layers rebuild at their own price)
    frozen: int  # layers ``training.method: frozen`` freezes (0 unless that method)
    offloaded: int  # layers whose activations go to the host
    first_layer: int  # the first layer of the stage's first chunk where it offloads (its copy's size), else -1
    embedding: bool
    head: bool
    sends: tuple[int, int]  # blocking sends per micro-batch, forward and backward (_blocking_sends)
    pair_chunks: tuple[_ChunkLayers, ...]  # per local chunk, under DualPipe / a2a_overlap with MoE layers (else empty)
    pair_mix: tuple[tuple[int, int, int], ...]  # a2a_overlap: (F chunk, B chunk, pairs) of the stage's steady state


@dataclass(frozen=True)
class _TailShape:
    """What a stage's data-parallel tail and optimizer step are, apart from when its backward runs
    (``Estimator._tail_shape``)."""

    chunks: list[tuple[int, tuple[int, ...]]]  # (local chunk, its layers last first), the last chunk first
    embedding: bool  # the input embedding's gradients join the stage's first layer's
    after_backward: bool  # one bucket per chunk after the whole backward (key -2)
    unit_chunks: list[int]  # FSDP + PP: the local chunks whose units reduce after the chunk's last backward (-10 - c)
    buckets: list[tuple[int, float]]  # (the layer whose gradients close it, its collective's seconds), in order
    per_microbatch: float  # the buckets' seconds, summed in order
    experts: bool  # expert gradients reduce on their own stream (Estimator._expert_tail)
    copies: float | None  # DualPipe's all-reduce of the two model copies' gradients
    optimizer: float  # optimizer step, gradient checks and the weight all-gather after it
    kind: int  # equal for two stages' shapes that differ only in their layers' numbers (Estimator._tail_shape)
