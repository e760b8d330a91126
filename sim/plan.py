"""Scenario -> Plan: every fact derived from the knobs, decided once.

In: a validated ``Scenario`` (schema and presets, SI units). Out: a frozen ``Plan`` that everything below the
configuration layer reads instead of re-interpreting the raw knobs: the parallel degrees and rank grid; the
batch (micro-batch, micro-batches per pipeline, sequence length); the dtypes and bytes per parameter of weights
and gradients; the pipeline's stage -> model chunk -> layer map for the schedule's layout (Megatron's
interleaving, or ZB-V's V) with the stages that hold the embedding and the LM head; the parameters each stage
holds; which layers full recomputation rebuilds; TP and PP message bytes; ZeRO/FSDP semantics (the stage, what is
sharded, unit layers, prefetch, shard and replica groups); and the calibration profile, loaded once.

Modelled on TorchTitan's ``ParallelDims``: the degrees are validated once (``sim.spec.rules``) and the derived
facts are named, cached properties. Each rule here is the one definition the workload emitters, the closed-form
estimate and the memory model share (docs/architecture.md, "Rules and where they live").
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from sim.costs import host
from sim.costs import profile as profiles
from sim.costs.profile import Profile
from sim.hardware.dtypes import bytes_per_element, parameter_dtype
from sim.model.flops import model_flops_per_step
from sim.model.memory import (
    Recompute,
    activation_bytes_per_layer,
    adam_step_bytes_per_param,
    loss_bytes,
    model_state_bytes,
    optimizer_bytes_per_param,
    rank_params,
)
from sim.model.params import LayerParams, layer_modules, layer_params
from sim.model.peft import (
    Peft,
    adapter_activation_bytes,
    dequant_buffer_bytes,
    embedding_split,
    head_split,
    layer_frozen_bytes,
    layer_trainable_params,
)
from sim.model.peft import model_flops_per_step as peft_model_flops
from sim.model.transformer import ModelSpec
from sim.network import deepep
from sim.parallel.chunks import Layout, chunk_location, model_chunk, stage_chunks
from sim.parallel.context import CpCommType, ring_buffer_bytes
from sim.parallel.grid import RankGrid
from sim.parallel.schedules import A2A_OVERLAP, SCHEDULES, Schedule
from sim.spec.degrees import Degrees, degrees
from sim.spec.method import peft_of
from sim.spec.scenario import CalibratedCostsSpec, DeepSpeedSpec, RooflineCostsSpec, Scenario
from sim.spec.sequence import LengthStats, PackStats, length_stats, pack_stats

_T = TypeVar("_T")


class cached_property(Generic[_T]):  # noqa: N801 (named as functools' is)
    """functools.cached_property without its lock: a fact computed on first use and kept in the instance's
    ``__dict__``, where later reads find it before this descriptor. Python 3.11's version takes an RLock on every
    first use (removed in 3.12), and the screen of ``sim search`` builds a Plan per layout, reading some 30 facts
    of each once: the lock cost about 7% of the screen. A Plan is not shared between threads while it is being
    resolved."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_property[_T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> _T | cached_property[_T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value


@dataclass(frozen=True, eq=False)
class Plan:
    """The resolved facts of one scenario. Build with ``resolve(scenario)``."""

    scenario: Scenario

    def __getstate__(self) -> dict[str, Scenario]:
        """Pickle only the scenario: the cached facts are rebuilt on use (some, like the schedule's functions,
        do not pickle), so a ``RunResult`` crosses process boundaries."""
        return {"scenario": self.scenario}

    def __setstate__(self, state: dict[str, Scenario]) -> None:
        object.__setattr__(self, "scenario", state["scenario"])

    # ------------------------------------------------------------------------------------- degrees and grid
    @cached_property
    def model(self) -> ModelSpec:
        return self.scenario.model

    @cached_property
    def degrees(self) -> Degrees:
        """Degrees and batch as the rules checked them (sim.spec.degrees)."""
        return degrees(self.scenario)

    @cached_property
    def tp(self) -> int:
        return self.degrees.tp

    @cached_property
    def pp(self) -> int:
        return self.degrees.pp

    @cached_property
    def vpp(self) -> int:
        return self.degrees.vpp

    @cached_property
    def num_gpus(self) -> int:
        return self.degrees.num_gpus

    @cached_property
    def dp(self) -> int:
        """Data-parallel degree: ``parallel.dp``, or the GPUs left by tp x pp."""
        return self.degrees.dp

    @cached_property
    def sequence_parallel(self) -> bool:
        return self.scenario.parallel.sequence_parallel

    @cached_property
    def cp(self) -> int:
        """Context-parallel degree: the ranks each sequence is split over (``parallel.cp``)."""
        return self.degrees.cp

    @cached_property
    def cp_comm_type(self) -> CpCommType:
        """How a CP rank's attention sees the others' K and V (``parallel.cp_comm_type``; sim.parallel.context)."""
        return self.scenario.parallel.cp_comm_type

    @cached_property
    def grid(self) -> RankGrid:
        if self.is_moe:
            return RankGrid(self.tp, self.pp, self.dp, self.scenario.cluster.gpus_per_node, self.ep, self.etp, self.cp)
        return RankGrid(self.tp, self.pp, self.dp, self.scenario.cluster.gpus_per_node, cp=self.cp)

    # ------------------------------------------------------------------------------------------------ batch
    @cached_property
    def micro_batch(self) -> int:
        return self.degrees.micro_batch

    @cached_property
    def seq_len(self) -> int:
        return self.degrees.seq_len

    @cached_property
    def local_seq_len(self) -> int:
        """Tokens of each sequence one rank holds: seq_len / cp (the rules make it whole). Every kernel but the
        attention core, every activation and every TP, PP and MoE message is sized by it."""
        return self.seq_len // self.cp

    @cached_property
    def microbatches(self) -> int:
        """Micro-batches per pipeline per step: ``training.microbatches``, or global_batch / (dp x micro_batch)."""
        return self.degrees.microbatches

    @cached_property
    def global_batch(self) -> int:
        return self.degrees.global_batch

    # ----------------------------------------------------------------------------------------------- dtypes
    @cached_property
    def dtype(self) -> str:
        return self.scenario.training.dtype

    @cached_property
    def elem_bytes(self) -> int:
        """Bytes of one activation or 16-bit weight element in the training dtype."""
        return bytes_per_element(self.dtype)

    @cached_property
    def grad_dtype(self) -> str:
        """The dtype gradients are accumulated and reduced in (``training.grad_dtype``, ``auto`` resolved).
        Megatron-LM: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"
        (arguments.py: accumulate_allreduce_grads_in_fp32), so 2 + 4 + 12 = 18 bytes per parameter; fp16 keeps
        fp16 grads. Sharded gradients (ZeRO-2/3, FSDP MixedPrecision reduce_dtype) stay in the parameters' dtype.
        FP8 training (Transformer Engine) runs only the GEMMs in FP8: the parameters and their gradients are
        bf16, so Megatron-LM keeps fp32 main gradients as for bf16 (issue 22: fp8 had dropped them).
        Without master weights (``training.master_weights: false``, pure 16-bit training as torchtune's) autograd
        accumulates into the parameters' own .grad, in their dtype."""
        t = self.scenario.training
        if t.grad_dtype != "auto":
            return t.grad_dtype
        params = parameter_dtype(t.dtype)
        if params == "fp32" or not t.master_weights:
            return params
        sharded_grads = self.scenario.fsdp is not None or self.zero_stage >= 2
        return "fp32" if params == "bf16" and not sharded_grads else params

    @cached_property
    def weight_bytes_per_param(self) -> int:
        """Bytes of a working (compute-dtype) weight: 4 for fp32/tf32 training, else 2 (mixed precision; FP8
        GEMMs cast from the 16-bit weights)."""
        return int(model_state_bytes(1.0, self.dtype).weights)

    @cached_property
    def grad_bytes_per_param(self) -> int:
        """Bytes of a gradient element as accumulated and reduced (``grad_dtype``): the DP/FSDP message sizes."""
        return bytes_per_element(self.grad_dtype)

    @cached_property
    def grad_storage_dtype(self) -> str:
        """The dtype of the gradients kept from the backward to the optimizer step, which Adam reads (memory
        model, optimizer step). It is ``grad_dtype`` except without master weights (pure 16-bit training), where
        the gradient is the parameter's own ``.grad`` in the parameters' dtype whatever the reduce dtype: FSDP2
        reduce-scatters in ``reduce_dtype`` and casts the result back to the sharded parameter's dtype before
        storing it (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce:
        ``_to_dtype_if_needed(reduce_output, orig_dtype)`` -> ``sharded_param.grad``; FSDP1 likewise,
        ``_cast_grad_to_param_dtype``). So TorchTitan's ``[training] dtype = "bfloat16"`` with its default
        ``mixed_precision_reduce = "float32"`` reduces in fp32 and stores bf16 gradients. That cast back is the
        sharded gradients' (FSDP, ZeRO-2/3); unsharded ones (DDP, ZeRO-1) stay in the buffer the buckets reduce,
        in ``grad_dtype`` (Megatron-LM's main-gradient buffer, ``main_grad_buffer``, which the memory model counts
        as the gradients themselves, with no bucket copy beside them)."""
        t = self.scenario.training
        sharded = self.scenario.fsdp is not None or self.zero_stage >= 2
        return parameter_dtype(t.dtype) if not t.master_weights and sharded else self.grad_dtype

    @cached_property
    def grad_storage_bytes_per_param(self) -> int:
        """Bytes of a stored gradient element (``grad_storage_dtype``)."""
        return bytes_per_element(self.grad_storage_dtype)

    @cached_property
    def optimizer_bytes_per_param(self) -> int:
        """Bytes of optimizer states per trained parameter (``training.master_weights``, ``optimizer_dtype``;
        sim.model.memory.optimizer_bytes_per_param): 12 in mixed precision, 4 in pure bf16."""
        t = self.scenario.training
        return optimizer_bytes_per_param(self.dtype, t.master_weights, t.optimizer_dtype)

    @cached_property
    def optimizer_step_bytes_per_param(self) -> float:
        """HBM bytes the Adam step moves per trained parameter (sim.model.memory.adam_step_bytes_per_param): 28
        in mixed precision with 16-bit gradients, 30 with fp32 ones, 14 in pure bf16."""
        t = self.scenario.training
        return adam_step_bytes_per_param(self.dtype, self.grad_storage_bytes_per_param, t.master_weights,
                                         t.optimizer_dtype)

    @cached_property
    def main_grad_buffer(self) -> bool:
        """Megatron-LM keeps wider-than-the-weights (fp32) gradients in one contiguous buffer its DP buckets
        view (param_and_grad_buffer.py), so they need no second copy as communication buffers."""
        return self.grad_bytes_per_param > self.elem_bytes

    # ------------------------------------------------------------------------------------------ pipeline
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

    def stage_layer_ids(self, stage: int) -> list[int]:
        """The transformer layers ``stage`` holds, chunk by chunk in model order."""
        return list(self._stage_layer_ids[stage])

    @cached_property
    def _stage_layer_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(layer for chunk in self.stage_chunks[s] for layer in self.chunk_layers(chunk))
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

    # ----------------------------------------------------------------------------- mixture of experts
    # Megatron-Core's MoE parallel folding: the routed experts of a MoE layer are split over ep ranks and each
    # expert's FFN over etp ranks, folded over a stage's tp x dp ranks; the edp = tp*dp/(ep*etp) ranks holding
    # the same experts reduce their gradients (and shard their optimizer states) among themselves.
    @cached_property
    def is_moe(self) -> bool:
        return self.model.is_moe

    @cached_property
    def ep(self) -> int:
        return self.degrees.ep

    @cached_property
    def etp(self) -> int:
        return self.degrees.etp

    @cached_property
    def edp(self) -> int:
        return self.degrees.edp

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

    @cached_property
    def moe_layer_params(self) -> LayerParams:
        return layer_params(self.model, moe=True)

    @cached_property
    def local_experts(self) -> int:
        """Routed experts on one rank of a MoE layer: E / ep."""
        return (self.model.num_moe_experts or 1) // self.ep

    @cached_property
    def dispatch_tokens(self) -> float:
        """Tokens one rank routes per micro-batch and MoE layer: b*s/(cp*tp) (sequence parallelism, which the rules
        require with tp > 1; a CP rank holds s/cp tokens)."""
        tokens = self.micro_batch * self.local_seq_len
        return tokens / self.tp if self.sequence_parallel else float(tokens)

    @cached_property
    def expert_load(self) -> float:
        """The most loaded expert rank's token-expert pairs / the mean (the slowest rank sets the pace):
        ``moe.capacity_factor`` when padded to capacity (every expert gets exactly its capacity), else
        ``moe.imbalance`` capped by the capacity factor (tokens over it are dropped) and by ep (a rank cannot
        receive more than every token: with ep = 1 the one rank computes all its pairs however they route)."""
        moe = self.scenario.moe
        if moe.capacity_factor is not None and moe.pad_to_capacity:
            return moe.capacity_factor
        if moe.capacity_factor is not None:
            return min(moe.imbalance, moe.capacity_factor, float(self.ep))
        return min(moe.imbalance, float(self.ep))

    @cached_property
    def routed_tokens(self) -> float:
        """Token-expert pairs this rank's local experts compute per micro-batch and MoE layer: its etp group's
        dispatched tokens x top-k (the alltoall dispatcher all-gathers the received tokens over the etp group;
        the allgather dispatcher keeps those routed to its experts out of the etp x ep group's), x the load of
        the most loaded rank (``expert_load``). Uniform: b*s/tp * topk * etp."""
        return self.dispatch_tokens * self.model.moe_router_topk * self.etp * self.expert_load

    @cached_property
    def dispatch_bytes(self) -> float:
        """The all-to-all "size" of one dispatch (and of one combine): the bytes a rank sends, its tokens x top-k
        x hidden x dtype (nccl-tests all_to_all: size/ep to each peer); padded to capacity, x the capacity factor
        (Megatron pads the exchanged tokens too). The hottest receiver's share is ``dispatch_skew``."""
        moe = self.scenario.moe
        padded = moe.capacity_factor if moe.capacity_factor is not None and moe.pad_to_capacity else 1.0
        return self.dispatch_tokens * self.model.moe_router_topk * self.model.hidden_size * self.elem_bytes * padded

    @cached_property
    def dispatch_skew(self) -> float:
        """The all-to-all's routing skew: the most loaded rank receives this x the mean (``expert_load``; 1 when
        padded, where every expert receives its capacity), at most ep (one rank receiving everything). The
        network prices it (sim.network.models, ``skew``: the hot receiver's ingress sets the time)."""
        moe = self.scenario.moe
        if moe.capacity_factor is not None and moe.pad_to_capacity:
            return 1.0
        return min(self.expert_load, float(self.ep))

    @cached_property
    def expert_gather_bytes(self) -> float:
        """With etp > 1 (alltoall dispatcher): the all-gather of the received tokens over the etp group, and the
        reduce-scatter of the outputs, each of the gathered size: routed tokens x hidden x dtype."""
        return self.routed_tokens * self.model.hidden_size * self.elem_bytes

    @cached_property
    def allgather_dispatch_bytes(self) -> float:
        """The allgather dispatcher's all-gather (and reduce-scatter) over the etp x ep group, gathered size:
        every member's tokens x hidden x dtype."""
        return self.dispatch_tokens * self.ep * self.etp * self.model.hidden_size * self.elem_bytes

    @cached_property
    def deepep_shape(self) -> tuple[int, int]:
        """flex (DeepEP): the EP group's (NVLink domains, ranks per domain), from rank 0's group (Megatron-Core
        lays the EP group out alike on every stage)."""
        domain = self.scenario.cluster.nvlink_domain
        group = self.grid.ep_group(0)
        domains = len({rank // domain for rank in group})
        return domains, len(group) // domains

    @cached_property
    def deepep_bytes(self) -> tuple[float, float]:
        """flex: (RDMA, NVLink) bytes one rank's dispatch (and combine) moves as DeepEP counts them: its tokens x
        distinct destination nodes (or ranks) x hidden x dtype (sim.network.deepep.deepep_bytes)."""
        domains, per_domain = self.deepep_shape
        return deepep.deepep_bytes(self.dispatch_tokens, self.model.hidden_size, self.elem_bytes,
                                   self.model.num_moe_experts or 1, self.model.moe_router_topk, domains, per_domain)

    @cached_property
    def moe_host_seconds(self) -> dict[str, float]:
        """Per direction (``forward``, ``backward``), the host's seconds to issue one MoE layer pass where the token
        dispatcher syncs the host every MoE layer (``moe.host_sync``; None: Megatron-Core's rule, every dropless
        dispatcher, i.e. all but alltoall with ``pad_to_capacity``), the pass then lasting at least that long
        (sim.costs.host, docs/mechanisms/moe_host_sync.md: eager ops, expert GEMM launches and Transformer Engine
        linear-module calls); 0 without a sync, under CUDA graphs, fixed costs or ``costs.eager_op_overhead`` 0."""
        moe, costs, training = self.scenario.moe, self.scenario.costs, self.scenario.training
        syncs = moe.host_sync if moe.host_sync is not None else not (
            moe.token_dispatcher == "alltoall" and moe.pad_to_capacity)
        if (not self.model.is_moe or not syncs or training.cuda_graphs
                or not isinstance(costs, (RooflineCostsSpec, CalibratedCostsSpec)) or not costs.eager_op_overhead):
            return {"forward": 0.0, "backward": 0.0}
        return {direction: host.moe_layer_host_seconds(direction, self.local_experts, costs.eager_op_overhead,
                                                       costs.launch_overhead, costs.te_module_overhead)
                for direction in ("forward", "backward")}

    @cached_property
    def deepep_seconds(self) -> tuple[float, float]:
        """flex: (dispatch, combine) seconds of one DeepEP exchange: the slower of its RDMA and NVLink parts at
        DeepEP's achieved bandwidths (``moe.deepep_rdma_bandwidth`` / ``deepep_nvlink_bandwidth``, defaults from
        DeepEP's README table), x the routing skew; 0 on the ideal network."""
        traffic = self.deepep_traffic
        if self.scenario.network.model == "ideal" or traffic is None:
            return 0.0, 0.0
        return (traffic.seconds(deepep.DISPATCH, self.dispatch_skew),
                traffic.seconds(deepep.COMBINE, self.dispatch_skew))

    @cached_property
    def deepep_traffic(self) -> deepep.DeepepTraffic | None:
        """flex: one rank's DeepEP bytes (``deepep_bytes``) and the achieved (dispatch, combine) bandwidths
        (``moe.deepep_rdma_bandwidth`` / ``deepep_nvlink_bandwidth``, defaults from DeepEP's README table over
        the GPU's NIC share and the node's NVLink), which the network models price the exchanges from (the
        contention model as flows on the links: sim.network.deepep.deepep_flows); None without flex."""
        if not self.is_moe or self.scenario.moe.token_dispatcher != "flex":
            return None
        moe, cluster = self.scenario.moe, self.scenario.cluster
        domains, _ = self.deepep_shape
        nic = cluster.inter_node.bandwidth * cluster.nics_per_node / cluster.gpus_per_node
        rdma, nvlink = self.deepep_bytes
        rdma_bw = tuple(moe.deepep_rdma_bandwidth or deepep.rdma_bandwidth(domains, nic, combine)
                        for combine in (False, True))
        nvlink_bw = tuple(moe.deepep_nvlink_bandwidth or deepep.nvlink_bandwidth(cluster.intra_node.bandwidth,
                                                                                   combine)
                          for combine in (False, True))
        return deepep.DeepepTraffic(rdma, nvlink, (rdma_bw[0], rdma_bw[1]), (nvlink_bw[0], nvlink_bw[1]))

    @cached_property
    def deepep_sms(self) -> int:
        """SMs a DeepEP exchange holds while it runs (``moe.deepep_sms`` with the flex dispatcher; 0 otherwise, or
        where the ideal network makes the exchanges free)."""
        moe = self.scenario.moe
        if not self.is_moe or moe.token_dispatcher != "flex" or self.scenario.network.model == "ideal":
            return 0
        return moe.deepep_sms

    @cached_property
    def expert_params_per_layer(self) -> float:
        """Routed-expert parameters of one MoE layer on one rank: all experts / (ep * etp)."""
        return self.moe_layer_params.experts_per_rank(self.ep, self.etp)

    def stage_expert_params(self, stage: int) -> float:
        """Routed-expert parameters one rank of ``stage`` holds (0 for a dense model)."""
        return self.stage_moe_layers(stage) * self.expert_params_per_layer if self.is_moe else 0.0

    @cached_property
    def expert_optimizer_shards(self) -> int:
        """Ranks the expert parameters' optimizer step is split over: edp with the distributed optimizer."""
        return self.edp if self.zero_stage >= 1 else 1

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """The expert-data-parallel group of ``rank``, which reduces its expert gradients."""
        return self.grid.edp_group(rank)

    # ------------------------------------------------------------------------------------------ fine-tuning
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

    @cached_property
    def tp_bytes(self) -> float:
        """Bytes of one Megatron TP collective: the b x s x h activations of a block (Narayanan et al. SC21)."""
        return float(self.micro_batch * self.local_seq_len * self.model.hidden_size * self.elem_bytes)

    @cached_property
    def p2p_bytes(self) -> float:
        """Bytes one rank sends per pipeline boundary and micro-batch: b x s x h / t (Megatron scatters the
        p2p tensor over the TP group and gathers it after the send)."""
        return self.tp_bytes / self.tp

    # --------------------------------------------------------------------------------------- recomputation
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

    # ------------------------------------------------------------------------------- documents in a row
    @cached_property
    def lengths(self) -> LengthStats | None:
        """Moments of the documents' lengths (``training.sequence``, sim.spec.sequence); None in the default case
        (one seq_len document per row), where nothing below changes."""
        seq = self.scenario.training.sequence
        return None if seq.default else length_stats(seq, self.seq_len)

    @cached_property
    def packing_tail(self) -> PackStats | None:
        """Greedy packing's padded row tails (``training.sequence.split_across_pack: false``, torchtune's
        PackedDataset; sim.spec.sequence.pack_stats); None where rows are full or documents padded one per row."""
        seq = self.scenario.training.sequence
        if self.lengths is None or not seq.packing or seq.split_across_pack:
            return None
        return pack_stats(seq, self.seq_len)

    @cached_property
    def documents_per_row(self) -> float:
        """Documents in one seq_len row: seq_len / E[s] packed (split across rows), the renewal average of greedy
        packing without splitting (``packing_tail``), one padded."""
        packed = self.lengths is not None and self.scenario.training.sequence.packing
        if self.packing_tail is not None:
            return self.packing_tail.documents_per_row
        return self.seq_len / self.lengths.mean if packed and self.lengths is not None else 1.0

    @cached_property
    def attention_work(self) -> tuple[float, float] | None:
        """(share of a row's full-matrix flash-attention FLOPs its documents need, the share of those a causal
        kernel executes). A row's documents, each attended alone by flash attention's varlen kernel, need
        n E[s^2] / seq_len^2 of the row's seq_len^2 (packed: n = seq_len / E[s]; padded: n = 1, transformers
        unpadding FlashAttention-2's input); each executes its own causal share. None (the row's full matrix and
        its causal share, as sim.model.attention_ops prices it) without flash attention or in the default case."""
        if self.lengths is None or not self.scenario.training.flash_attention:
            return None
        documents = self.documents_per_row * self.lengths.mean_square
        tail = self.packing_tail
        if tail is None:
            return documents / self.seq_len**2, self.lengths.causal_share
        # torchtune appends the padding to the row's seq_lens: the varlen kernel attends it as one more sequence
        work = documents + tail.pad_mean_square
        return work / self.seq_len**2, (documents * self.lengths.causal_share + tail.pad_causal_work) / work

    @cached_property
    def model_tokens_per_step(self) -> float:
        """Document tokens one step trains on (tokens/s counts these): global_batch x seq_len, less the padding
        (global_batch x E[s] when documents are padded, global_batch x documents per row x E[s] when greedy
        packing pads each row's tail)."""
        rows = self.global_batch * self.seq_len
        if self.lengths is None or (self.scenario.training.sequence.packing and self.packing_tail is None):
            return float(rows)
        return self.global_batch * self.documents_per_row * self.lengths.mean

    @cached_property
    def model_flops_per_step(self) -> float:
        """MFU's numerator: the model FLOPs of the step's documents (sim.model.flops.model_flops_per_step,
        or sim.model.peft's under a fine-tuning method). A sequence's FLOPs are a s + c s^2 (linear layers and
        logits per token, attention per token pair, Korthikanti et al. eq. 7's form), so the documents' FLOPs are
        rows x documents per row x (a E[s] + c E[s^2]): padding tokens and the attention between packed
        documents are not model FLOPs."""
        if self.lengths is None:
            return self._sequence_flops(self.global_batch, self.seq_len)
        linear, quadratic = self._flops_terms
        per_document = linear * self.lengths.mean + quadratic * self.lengths.mean_square
        return self.global_batch * self.documents_per_row * per_document

    @cached_property
    def causal_model_flops_per_step(self) -> float | None:
        """``model_flops_per_step`` under the causal convention: each sequence's attention counted over the
        s (s + 1) / 2 query-key pairs a causal mask keeps (half the s x s matrix plus its diagonal, what a causal
        flash kernel needs) instead of Megatron's full s^2 (megatron/training/training.py
        num_floating_point_operations, the convention of ``mfu``); None without causal attention. The summary
        reports MFU both ways (``mfu_causal``); at long context they differ most."""
        if not self.scenario.training.causal_attention:
            return None
        linear, quadratic = self._flops_terms
        if self.lengths is None:
            s = self.seq_len
            return self.global_batch * (linear * s + quadratic * s * (s + 1) / 2)
        per_document = linear * self.lengths.mean + quadratic * (self.lengths.mean_square + self.lengths.mean) / 2
        return self.global_batch * self.documents_per_row * per_document

    def _sequence_flops(self, rows: int, seq_len: int) -> float:
        """Model FLOPs of ``rows`` sequences of ``seq_len`` tokens (Megatron's count; PEFT's under a method)."""
        if self.peft.active:  # frozen weights have no weight-gradient GEMM (sim.model.peft)
            return peft_model_flops(self.model, self.peft, rows, seq_len)
        return model_flops_per_step(self.model, rows, seq_len)

    @cached_property
    def _flops_terms(self) -> tuple[float, float]:
        """(a, c) of one sequence's model FLOPs a s + c s^2, from the counts at s = 1 and s = 2."""
        one, two = self._sequence_flops(1, 1), self._sequence_flops(1, 2)
        quadratic = (two - 2 * one) / 2
        return one - quadratic, quadratic

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

    # --------------------------------------------------------------------------------------- ZeRO and FSDP
    @cached_property
    def zero_stage(self) -> int:
        """ZeRO stage: ``parallel.zero``, or FSDP's sharding strategy (FULL_SHARD and HYBRID_SHARD 3,
        SHARD_GRAD_OP 2, NO_SHARD 0)."""
        return self.degrees.zero_stage

    @cached_property
    def zero_stage_at_rest(self) -> int:
        """How model states are stored between uses: FSDP keeps every sharded strategy's weights sharded
        (SHARD_GRAD_OP only skips re-sharding between forward and backward); DeepSpeed ZeRO-2 keeps a replica."""
        return 3 if self.scenario.fsdp is not None and self.zero_stage >= 2 else self.zero_stage

    @cached_property
    def data_parallel(self) -> bool:
        """Whether there is a data-parallel group to reduce gradients over (dp x cp > 1: CP ranks hold the same
        weights and reduce their gradients with the DP ranks, ``grid.dp_group``)."""
        return self.dp * self.cp > 1

    @cached_property
    def gathers_units(self) -> bool:
        """Whether weights are all-gathered per unit before use: ZeRO-3 / FULL_SHARD / HYBRID_SHARD, and FSDP's
        SHARD_GRAD_OP (gathers in the forward, keeps them through the backward)."""
        fsdp = self.scenario.fsdp
        return self.zero_stage >= 3 or (fsdp is not None and fsdp.zero_stage == 2)

    @cached_property
    def pipelined_fsdp(self) -> bool:
        """FSDP with pipeline parallelism (pp > 1), as TorchTitan runs FSDP2 under torch.distributed.pipelining:
        with PP, ``reshard_after_forward`` defaults to False (torchtitan/distributed/fsdp.py
        get_fsdp_reshard_after_forward_policy: "do not reshard after forward to avoid per-microbatch
        all-gathers"), and the pipeline stage runs every backward with ``set_reshard_after_backward(False)`` and
        ``set_requires_gradient_sync(False)``, calling each unit's ``post_backward`` (its gradient reduce-scatter)
        once after the last micro-batch's backward (torch/distributed/pipelining/stage.py
        _backward_maybe_with_nosync). So each unit's weights are all-gathered once per step, in its first
        micro-batch's forward, and stay unsharded until the step's last backward; its gradients accumulate
        unsharded and are reduce-scattered once. Llama 3's FSDP (Llama 3 paper Sec. 3.3.2: model shards are not
        resharded after the forward) has the same once-per-step gather. NO_SHARD (DDP) is unaffected."""
        fsdp = self.scenario.fsdp
        return fsdp is not None and self.pp > 1 and fsdp.zero_stage >= 2

    @cached_property
    def flat_params(self) -> bool:
        """Whether gradients live in flat per-unit parameters (ZeRO-3 and every FSDP strategy): they are reduced
        per unit, and the gathered/unreduced buffers are counted apart, so there are no DDP-style buckets."""
        return self.zero_stage >= 3 or self.scenario.fsdp is not None

    @cached_property
    def hybrid(self) -> bool:
        """FSDP HYBRID_SHARD: shard inside a node, replicate across nodes."""
        fsdp = self.scenario.fsdp
        return fsdp is not None and fsdp.sharding == "HYBRID_SHARD"

    @cached_property
    def unit_layers(self) -> int:
        """Transformer layers per FSDP unit (one per ZeRO-3 'unit' otherwise)."""
        fsdp = self.scenario.fsdp
        return fsdp.unit_layers if fsdp is not None else 1

    @cached_property
    def deepspeed(self) -> DeepSpeedSpec | None:
        """DeepSpeed ZeRO-3's granularity knobs where they apply (a ``zero_optimization`` block at stage 3): the
        weights are gathered module by module and the gradients reduced in buckets (sim.workload.step
        gather_calls, reduce_buckets); None for FSDP, lower stages or a bare ``parallel.zero: 3``."""
        return self.scenario.deepspeed if self.zero_stage >= 3 and self.scenario.fsdp is None else None

    @cached_property
    def prefetch(self) -> bool:
        """FSDP's backward prefetch (BACKWARD_PRE); DeepSpeed ZeRO-3 prefetches while fewer than
        ``stage3_max_live_parameters`` elements are gathered and its prefetch bucket is not 0
        (partitioned_param_coordinator.py: max_params_to_prefetch = min(max_live - available, bucket)): after
        fetching a layer's largest module (the full tensor, all TP ranks' shards) there must be room left."""
        fsdp = self.scenario.fsdp
        if fsdp is not None:
            return fsdp.prefetch
        ds = self.deepspeed
        if ds is None:
            return True
        largest = max(sum(m.tensors) for m in layer_modules(self.model))
        return ds.stage3_prefetch_bucket_size > 0 and largest < ds.stage3_max_live_parameters

    @cached_property
    def zero_shards(self) -> int:
        """Ranks that share one copy of the sharded model states: a node's dp ranks under HYBRID_SHARD."""
        return len(self.shard_group(0))

    @cached_property
    def optimizer_shards(self) -> int:
        """Ranks the optimizer step's parameters are split over (1 without ZeRO)."""
        return self.zero_shards if self.zero_stage >= 1 else 1

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that shard model states with ``rank``: its DP group, or under HYBRID_SHARD the members of
        it on ``rank``'s node."""
        group = self.grid.dp_group(rank)
        if not self.hybrid:
            return group
        node = self.grid.node(rank)
        return tuple(r for r in group if self.grid.node(r) == node)

    def replica_group(self, rank: int) -> tuple[int, ...]:
        """HYBRID_SHARD: the ranks holding the same shard as ``rank`` on the other nodes (``(rank,)`` otherwise),
        which all-reduce their reduced gradient shards."""
        if not self.hybrid:
            return (rank,)
        group, shard = self.grid.dp_group(rank), self.shard_group(rank)
        local, per_node = shard.index(rank), len(shard)
        return tuple(group[i] for i in range(local, len(group), per_node))

    # ------------------------------------------------------------------------------------------- profile
    @cached_property
    def profile(self) -> Profile | None:
        """The calibration profile the cost model (and, if it has link tiers, the topology) uses: the measured
        one under ``costs: calibrated``, the GPU's shipped default under ``roofline`` with shape efficiency."""
        costs = self.scenario.costs
        if isinstance(costs, CalibratedCostsSpec):
            return profiles.load(costs.profile)
        if isinstance(costs, RooflineCostsSpec) and costs.shape_efficiency:
            return profiles.default_for(self.scenario.cluster.gpu.name)
        return None


def resolve(scenario: Scenario, implied: Degrees | None = None) -> Plan:
    """The plan of a validated scenario (cheap: every fact is computed on first use and kept). ``implied``: the
    scenario's degrees where the caller has them (``check_rules`` returns them), kept as ``Plan.degrees``."""
    plan = Plan(scenario)
    if implied is not None:
        plan.__dict__["degrees"] = implied  # where the cached property keeps it
    return plan
