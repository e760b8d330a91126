"""The Plan's parameters: what each stage and layer holds on one TP rank, and under fine-tuning what it trains.

In: the model, the chunk map (``PipelineFacts``) and ``training.method``. Out: ``ParamFacts``: a stage's parameters
per TP rank (layers, embedding and head where they run; a MoE model's dense ones apart from its routed experts), a
layer's (what the data-parallel group reduces), the routed experts' per rank; the fine-tuning method (``Peft``), the
parameters that get gradients, and the frozen weights' bytes in their storage dtype (QLoRA's NF4).
"""

from __future__ import annotations

from sim.model.memory import (
    rank_params,
)
from sim.model.params import LayerParams, layer_params
from sim.model.peft import (
    Peft,
    embedding_split,
    head_split,
    layer_frozen_bytes,
    layer_trainable_params,
)
from sim.plan.cached import cached_property
from sim.plan.pipeline import PipelineFacts
from sim.spec.method import peft_of


class ParamFacts(PipelineFacts):
    """Parameters held and trained per stage and layer (a base of ``sim.plan.Plan``)."""

    def stage_params(self, stage: int) -> float:
        """Parameters held by one TP rank of ``stage``: its layers, plus the embedding and head where they run.
        For a MoE model: the dense parameters only (attention, norms, router, shared experts), reduced over dp;
        the routed experts' are ``stage_expert_params``."""
        return self._stage_params[stage]

    @cached_property
    def _stage_params(self) -> tuple[float, ...]:
        """``stage_params`` of every stage, counted once per plan (the estimate and the emitters ask per stage,
        several times each)."""
        if not self.is_moe:
            return tuple(rank_params(self.model, self.tp, self.stage_layers(s), embedding=self.holds_embedding(s),
                                     head=self.holds_head(s), tied_copy=self.tied_copy(s)) for s in range(self.pp))
        moe_dense = self.moe_layer_params.per_tp_rank(self.tp)
        return tuple(rank_params(self.model, self.tp, self.stage_layers(s) - self.stage_moe_layers(s),
                                 embedding=self.holds_embedding(s), head=self.holds_head(s),
                                 tied_copy=self.tied_copy(s)) + self.stage_moe_layers(s) * moe_dense
                     for s in range(self.pp))

    def layer_params(self, layer: int) -> float:
        """Dense (non-expert) parameters of ``layer`` on one TP rank: what the data-parallel group reduces."""
        if self.is_moe and self.moe_layers[layer]:
            return self.moe_layer_params.per_tp_rank(self.tp)
        return self.dense_layer_params

    @cached_property
    def dense_layer_params(self) -> float:
        """A dense layer's parameters on one TP rank (``layer_params(model).per_tp_rank(tp)``), counted once per
        plan: FSDP's units ask for it per unit."""
        return layer_params(self.model).per_tp_rank(self.tp)

    @cached_property
    def moe_layer_params(self) -> LayerParams:
        return layer_params(self.model, moe=True)

    @cached_property
    def expert_params_per_layer(self) -> float:
        """Routed-expert parameters of one MoE layer on one rank: all experts / (ep * etp)."""
        return self.moe_layer_params.experts_per_rank(self.ep, self.etp)

    def stage_expert_params(self, stage: int) -> float:
        """Routed-expert parameters one rank of ``stage`` holds (0 for a dense model)."""
        return self.stage_moe_layers(stage) * self.expert_params_per_layer if self.is_moe else 0.0

    # --------------------------------------------------------------------------------------------- fine-tuning
    @cached_property
    def peft(self) -> Peft:
        """The fine-tuning method (``training.method``; ``Peft()``: full training, every rule below as before)."""
        return peft_of(self.scenario)

    def layer_grad_params(self, layer: int) -> float:
        """Parameters of transformer layer ``layer`` that get gradients, per TP rank (all of them in full
        training; LoRA's adapters; none in a frozen layer)."""
        if not self.peft.active:
            return self.dense_layer_params
        return layer_trainable_params(self.model, self.peft, layer, self.tp)

    def layer_weight_bytes(self, layer: int) -> float:
        """Bytes of layer ``layer``'s weights on one TP rank (what ZeRO-3/FSDP gathers): trainable ones in the
        compute dtype, frozen ones in their storage dtype (QLoRA's NF4)."""
        if not self.peft.active:
            return layer_params(self.model).per_tp_rank(self.tp) * self.weight_bytes_per_param
        return (self.layer_grad_params(layer) * self.weight_bytes_per_param
                + layer_frozen_bytes(self.model, self.peft, layer, self.tp, self.weight_bytes_per_param))

    @cached_property
    def embedding_trains(self) -> float:
        """1 where the input embedding gets gradients, 0 where it is frozen."""
        return 1.0 if self.peft.embedding_trainable else 0.0

    @cached_property
    def head_trains(self) -> float:
        """1 where the final norm and LM head get gradients, 0 where they are frozen (LoRA)."""
        return 1.0 if self.peft.head_trainable else 0.0

    def stage_trainable_params(self, stage: int) -> float:
        """Parameters one TP rank of ``stage`` trains (its gradients and optimizer states): ``stage_params`` in
        full training."""
        return self._stage_trainable[stage][0] if self.peft.active else self.stage_params(stage)

    def stage_frozen_bytes(self, stage: int) -> float:
        """Bytes of the frozen weights one TP rank of ``stage`` holds, in their storage dtype (0 in full training)."""
        return self._stage_trainable[stage][1] if self.peft.active else 0.0

    @cached_property
    def _stage_trainable(self) -> tuple[tuple[float, float], ...]:
        model, peft, tp, weight = self.model, self.peft, self.tp, self.weight_bytes_per_param
        out = []
        for stage in range(self.pp):
            layers = [layer for chunk in self.stage_chunks[stage] for layer in self.chunk_layers(chunk)]
            trainable = sum(self.layer_grad_params(layer) for layer in layers)
            frozen = sum(layer_frozen_bytes(model, peft, layer, tp, weight) for layer in layers)
            if stage == self.embedding_stage:
                train, keep = embedding_split(model, peft)
                trainable, frozen = trainable + train / tp, frozen + keep / tp * weight
            if stage == self.head_stage:
                train, keep = head_split(model, peft)
                trainable, frozen = trainable + train / tp, frozen + keep / tp * weight
            if self.tied_copy(stage):
                copy = model.vocab_size * model.hidden_size / tp
                if peft.head_trainable:
                    trainable += copy
                else:
                    frozen += copy * weight
            out.append((trainable, frozen))
        return tuple(out)
