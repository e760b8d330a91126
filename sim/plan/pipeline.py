"""The Plan's pipeline: the schedule, the stage -> model chunk -> layer map, the embedding and head stages.

In: the schedule and layer split knobs, and the degrees (``DtypeFacts`` and below). Out: ``PipelineFacts``: the
schedule's orders (Megatron-Core's combined 1F1B under ``moe.a2a_overlap``) and its chunk layout (Megatron's
interleaving, ZB-V's V, DualPipe's two copies); the layers of each model chunk and of each stage; which stages run an
input embedding and an LM head, and which keeps its own copy of tied embeddings; the MoE layers of each stage.
"""

from __future__ import annotations

import itertools

from sim.parallel.chunks import Layout, chunk_location, model_chunk, stage_chunks
from sim.parallel.schedules import A2A_OVERLAP, SCHEDULES, Schedule
from sim.plan.cached import cached_property
from sim.plan.dtypes import DtypeFacts
from sim.spec.parallel import cuda_device_max_connections


class PipelineFacts(DtypeFacts):
    """The pipeline's chunk map (a base of ``sim.plan.Plan``)."""

    @cached_property
    def schedule(self) -> Schedule:
        """The pipeline schedule's orders; with ``moe.a2a_overlap`` (a MoE model), Megatron-Core's combined 1F1B
        (sim.parallel.schedules.A2A_OVERLAP: F&B pairs issued as units, whose MoE exchanges the emitter and the
        estimate overlap with the other pass's compute)."""
        if self.scenario.moe.a2a_overlap and self.model.is_moe:
            return A2A_OVERLAP[self.scenario.schedule]
        return SCHEDULES[self.scenario.schedule]

    @cached_property
    def a2a_overlap(self) -> bool:
        """Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm): F&B pairs of the steady state."""
        return self.scenario.moe.a2a_overlap and self.model.is_moe

    @cached_property
    def cuda_device_max_connections(self) -> int:
        """CUDA_DEVICE_MAX_CONNECTIONS (``parallel.cuda_device_max_connections``); None: 32 under the EP A2A
        overlap, whose pairs need concurrent streams (Megatron-Core's MoE README: "CUDA_DEVICE_MAX_CONNECTIONS >
        1"), else Megatron-LM's 1. The rule is the spec's (sim.spec.parallel.cuda_device_max_connections), which
        the Megatron-LM launch script's export reads too."""
        return cuda_device_max_connections(self.scenario)

    @cached_property
    def layout(self) -> Layout:
        """How model chunks sit on stages: Megatron's interleaving (chunk c of stage s is model chunk c*p + s),
        or ZB-V's V (stage s holds model chunks s and 2p-1-s)."""
        return self.schedule.layout

    @cached_property
    def local_chunks(self) -> int:
        """Model chunks each stage holds: vpp, or two in DualPipe's ``dual`` layout, where vpp = 1 splits the
        model into pp chunks and every stage holds one of each of its two copies."""
        return 2 if self.layout == "dual" else self.vpp

    @cached_property
    def splits_backward(self) -> bool:
        """Whether the schedule runs the weight-gradient pass (W) apart from the input-gradient pass (B)."""
        return self.schedule.splits_backward

    @cached_property
    def chunks(self) -> int:
        """Model chunks in all: pp x vpp."""
        return self.pp * self.vpp

    @cached_property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Layers of each of the pp*vpp model chunks, in model order."""
        return self.degrees.chunk_sizes

    @cached_property
    def chunk_starts(self) -> tuple[int, ...]:
        """First layer of each model chunk, plus num_layers at the end."""
        return tuple(itertools.accumulate(self.chunk_sizes, initial=0))

    def model_chunk(self, stage: int, chunk: int) -> int:
        """The model chunk that ``stage``'s local ``chunk`` holds."""
        return model_chunk(self.layout, self.pp, stage, chunk)

    def chunk_location(self, global_chunk: int, copy: int = 0) -> tuple[int, int]:
        """(stage, local chunk) holding a model chunk (of model copy ``copy`` in the ``dual`` layout)."""
        return chunk_location(self.layout, self.pp, global_chunk, copy)

    def chunk_layers(self, global_chunk: int) -> range:
        starts = self.chunk_starts
        return range(starts[global_chunk], starts[global_chunk + 1])

    @cached_property
    def stage_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, the model chunks its local chunks 0..v-1 hold."""
        return stage_chunks(self.layout, self.pp, self.local_chunks)

    @cached_property
    def _stage_layers(self) -> tuple[int, ...]:
        return tuple(sum(self.chunk_sizes[g] for g in chunks) for chunks in self.stage_chunks)

    def stage_layers(self, stage: int) -> int:
        """Transformer layers held by a pipeline stage (over its chunks)."""
        return self._stage_layers[stage]

    @cached_property
    def embedding_stage(self) -> int:
        """The stage running the input embedding: the one holding model chunk 0."""
        return self.chunk_location(0)[0]

    @cached_property
    def head_stage(self) -> int:
        """The stage running the final norm and LM head: the one holding the last model chunk (pp-1, or 0 in
        ZB-V's V, whose last chunk comes back to the first GPU)."""
        return self.chunk_location(self.chunks - 1)[0]

    def holds_embedding(self, stage: int) -> bool:
        """Whether ``stage`` runs an input embedding: the embedding stage, and in the ``dual`` layout also the last
        stage, where the reverse copy's micro-batches enter."""
        return stage == self.embedding_stage or (self.layout == "dual" and stage == self.pp - 1)

    def holds_head(self, stage: int) -> bool:
        """Whether ``stage`` runs a final norm and LM head: the head stage, and in the ``dual`` layout also stage 0,
        where the reverse copy's micro-batches leave."""
        return stage == self.head_stage or (self.layout == "dual" and stage == 0)

    def tied_copy(self, stage: int) -> bool:
        """Whether ``stage`` keeps its own copy of tied word embeddings for the output layer: Megatron-LM does
        when the head runs on another stage than the embedding (and all-reduces the two copies' gradients);
        on the same stage the head reuses the embedding's weights (DualPipe's end stages hold both)."""
        return (self.model.tied_embeddings and stage == self.head_stage
                and self.head_stage != self.embedding_stage and self.layout != "dual")

    def stage_layer_ids(self, stage: int) -> list[int]:
        """The transformer layers ``stage`` holds, chunk by chunk in model order."""
        return list(self._stage_layer_ids[stage])

    @cached_property
    def _stage_layer_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(layer for chunk in self.stage_chunks[s] for layer in self.chunk_layers(chunk))
                     for s in range(self.pp))

    @cached_property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per global layer, whether it is a MoE layer (the model's ``moe_layers``; all False for a dense model)."""
        return self.model.moe_layers

    def stage_moe_layers(self, stage: int) -> int:
        """MoE layers ``stage`` holds."""
        return self._stage_moe_layers[stage]

    @cached_property
    def _stage_moe_layers(self) -> tuple[int, ...]:
        return tuple(sum(self.moe_layers[layer] for layer in self._stage_layer_ids[s]) for s in range(self.pp))
