"""The Plan's activation memory: which layers recompute or offload, the bytes each keeps and what lives transiently.

In: ``training.recompute`` / ``recompute_num_layers`` / ``recompute_modules``, ``cpu_offloading_num_layers``,
``cross_entropy``, the model, batch, MoE routed tokens, PEFT adapters and CP (``SequenceFacts`` and below). Out:
``ActivationFacts``: per layer, whether full recomputation rebuilds it and whether its activations are offloaded;
the modules selective recomputation replays, and the host time module ``moe``'s replay adds to a MoE layer's
backward behind the dispatcher's host sync (``moe_replay_host_seconds``, sim.costs.host); a layer's kept
activations (Korthikanti et al. 2022 Table 2) under a recompute mode; what a layer stashes from its forward to its
backward (``stash_bytes``), the layer being rebuilt (``rebuild_bytes``) and the transient peak beside the stash:
rebuild, the loss head's logits, CP's KV buffers, QLoRA's dequantised linear (``transient_bytes``). The memory
bound and timeline (sim.workload.footprint) read the bytes; the emitter and the estimate the host time.
"""

from __future__ import annotations

import bisect

from sim.costs import host
from sim.model.memory import (
    Recompute,
    activation_bytes_per_layer,
    loss_bytes,
)
from sim.model.peft import (
    adapter_activation_bytes,
    dequant_buffer_bytes,
)
from sim.parallel.context import ring_buffer_bytes
from sim.plan.cached import cached_property
from sim.plan.sequence import SequenceFacts
from sim.spec.scenario import CalibratedCostsSpec, RooflineCostsSpec


class ActivationFacts(SequenceFacts):
    """Recompute, offload and the activation bytes kept and transient (a base of ``sim.plan.Plan``)."""

    # ------------------------------------------------------------------------------------------- recomputation
    def recomputes(self, layer: int) -> bool:
        """Whether full recomputation rebuilds this layer's activations in its backward (the first
        ``recompute_num_layers`` layers of each model chunk)."""
        t = self.scenario.training
        if t.recompute != "full" or t.recompute_num_layers is None:
            return t.recompute == "full"
        starts = self.chunk_starts
        return layer - starts[bisect.bisect_right(starts, layer) - 1] < t.recompute_num_layers

    def recomputed_layers(self, stage: int) -> int:
        """Layers of a stage whose forward runs twice (over its chunks)."""
        t = self.scenario.training
        if t.recompute != "full":
            return 0
        if t.recompute_num_layers is None:
            return self.stage_layers(stage)
        return sum(min(t.recompute_num_layers, self.chunk_sizes[g]) for g in self.stage_chunks[stage])

    @cached_property
    def recompute_modules(self) -> frozenset[str]:
        """The submodules selective recomputation replays in the backward (``training.recompute_modules``;
        Megatron-Core's default ``core_attn``, Korthikanti's selective recompute); empty without it."""
        t = self.scenario.training
        if t.recompute != "selective":
            return frozenset()
        return frozenset(t.recompute_modules if t.recompute_modules is not None else ("core_attn",))

    @cached_property
    def moe_replay_host_seconds(self) -> float:
        """Seconds selective recomputation of module ``moe`` (``recompute_modules``, Megatron's --recompute-modules
        moe) adds to the host's time to issue a MoE layer's backward: the replayed MoE part's forward, host sync
        included (sim.costs.host.moe_part_host_seconds); 0 without the replay or the host bound
        (``moe_host_seconds``)."""
        costs = self.scenario.costs
        if "moe" not in self.recompute_modules or not self.moe_host_seconds["forward"]:
            return 0.0
        assert isinstance(costs, (RooflineCostsSpec, CalibratedCostsSpec))  # moe_host_seconds is 0 otherwise
        return host.moe_part_host_seconds(self.local_experts, costs.eager_op_overhead, costs.launch_overhead,
                                          costs.te_module_overhead, costs.megatron_moe_host_ops,
                                          bool(self.model.moe_shared_expert_intermediate_size))

    # -------------------------------------------------------------------------------------- activation offload
    def offloads(self, layer: int) -> bool:
        """Whether ``layer``'s activations go to the host between its forward and backward (activation offload,
        ``training.cpu_offloading_num_layers``: the first N layers of each model chunk, as Transformer Engine's
        CPU offload context counts the layers of the TransformerBlock it wraps)."""
        offloaded = self.scenario.training.cpu_offloading_num_layers
        if not offloaded:
            return False
        starts = self.chunk_starts
        return layer - starts[bisect.bisect_right(starts, layer) - 1] < offloaded

    def offloaded_layers(self, stage: int) -> int:
        """Layers of a stage whose activations are offloaded (over its chunks)."""
        return sum(self.offloads(layer) for g in self.stage_chunks[stage] for layer in self.chunk_layers(g))

    # -------------------------------------------------------------------------------- bytes kept and transient
    def activation_bytes(self, recompute: Recompute | None = None, moe: bool = False) -> float:
        """Bytes one transformer layer keeps for its backward per micro-batch and TP rank (Korthikanti et al.
        2022 Table 2) under ``recompute`` (default: the scenario's mode, with its ``recompute_modules``);
        ``moe``: a MoE layer, whose MLP part is the router and the ``routed_tokens`` its local experts compute."""
        t = self.scenario.training
        mode = recompute or t.recompute
        modules = self.recompute_modules if mode == t.recompute else None
        if moe:
            return activation_bytes_per_layer(self.model, self.micro_batch, self.local_seq_len, self.tp,
                                              self.sequence_parallel, mode, t.flash_attention,
                                              moe=True, routed_tokens=self.routed_tokens, etp=self.etp,
                                              modules=modules)
        kept = activation_bytes_per_layer(self.model, self.micro_batch, self.local_seq_len, self.tp,
                                          self.sequence_parallel, mode, t.flash_attention, modules=modules)
        if self.peft.adapters and mode != "full":  # LoRA's A outputs (and dropped inputs), sim.model.peft
            kept += adapter_activation_bytes(self.model, self.peft, self.micro_batch * self.local_seq_len, self.tp,
                                             self.elem_bytes)
        return kept

    def _selective_bytes(self, modules: frozenset[str], moe: bool = False) -> float:
        """A layer's kept activations with only ``modules`` recomputed (selective recomputation)."""
        t = self.scenario.training
        return activation_bytes_per_layer(self.model, self.micro_batch, self.local_seq_len, self.tp,
                                          self.sequence_parallel, "selective", t.flash_attention, moe=moe,
                                          routed_tokens=self.routed_tokens, etp=self.etp, modules=modules)

    @cached_property
    def _kept_bytes(self) -> tuple[float, float]:
        """(a layer's activations under the scenario's recompute mode, a whole layer's without recomputation)."""
        return self.activation_bytes(), self.activation_bytes("none")

    @cached_property
    def _kept_moe_bytes(self) -> tuple[float, float]:
        """``_kept_bytes`` of a MoE layer."""
        return self.activation_bytes(moe=True), self.activation_bytes("none", moe=True)

    def stash_bytes(self, layer: int) -> float:
        """Activations ``layer`` keeps per micro-batch from its forward to its last backward pass: only its input
        where full recomputation rebuilds it, everything where ``recompute_num_layers`` leaves it alone."""
        stashed, whole = self._kept_moe_bytes if self.is_moe and self.moe_layers[layer] else self._kept_bytes
        return whole if self.scenario.training.recompute == "full" and not self.recomputes(layer) else stashed

    @cached_property
    def rebuild_bytes(self) -> float:
        """Activations of the one layer recomputation is rebuilding during its backward (0 without; the larger
        of a dense and a MoE layer's in a MoE model): the whole layer's under full recomputation, what its
        ``recompute_modules`` dropped under selective recomputation (they are live again until its backward
        is done)."""
        t = self.scenario.training
        rebuilds = t.recompute == "full" and t.recompute_num_layers != 0
        if t.recompute == "selective":  # beyond Korthikanti's attention core, which his peak leaves out
            core, modules = self.recompute_modules & {"core_attn"}, self.recompute_modules
            dense = self._selective_bytes(core) - self._selective_bytes(modules) if not all(self.moe_layers) else 0.0
            moe = (self._selective_bytes(core, moe=True) - self._selective_bytes(modules, moe=True)
                   if self.is_moe else 0.0)
            return max(dense, moe)
        if rebuilds and self.is_moe:
            return max(self._kept_moe_bytes[1], self._kept_bytes[1] if not all(self.moe_layers) else 0.0)
        return self._kept_bytes[1] if rebuilds else 0.0

    def transient_bytes(self, stage: int) -> float:
        """Activations beside the stash that live for part of a stage's backward, the larger of two that never
        overlap: the layer full recomputation is rebuilding (``rebuild_bytes``) and, on a stage that runs the LM
        head, the loss head's logits at their peak (``training.cross_entropy``, sim.model.memory.LOSS_BYTES; the
        head's backward ends before the first layer is rebuilt); plus, under context parallelism (p2p, all_gather),
        the larger of the forward's and the backward's KV buffers (``sim.parallel.context.ring_buffer_bytes``),
        counted beside either (an upper bound: the forward's buffers never meet the layer being rebuilt). Under
        QLoRA the layer's backward also holds its largest linear dequantised to bf16
        (sim.model.peft.dequant_buffer_bytes), with or without recomputation."""
        rebuilding = self.rebuild_bytes if self.recomputed_layers(stage) > 0 or self.recompute_modules else 0.0
        rebuilding += dequant_buffer_bytes(self.model, self.peft, self.tp, self.elem_bytes)
        mode = self.scenario.training.cross_entropy
        ring = max(ring_buffer_bytes(self.cp_comm_type, self.cp, direction, self.micro_batch, self.local_seq_len,
                                     self.model.kv_dim / self.tp, self.elem_bytes)
                   for direction in ("forward", "backward"))
        if mode == "fused" or not self.holds_head(stage):
            return rebuilding + ring
        return max(rebuilding, loss_bytes(self.model, self.micro_batch, self.local_seq_len, self.tp, mode)) + ring
