"""Cross-field rules of a scenario: the checks no single field's type can express.

In: a ``Scenario`` whose fields each passed pydantic validation. Out: nothing, or a ``ValueError`` whose one-line
message starts with the field(s) it concerns and states the rule (``parallel: tp*pp*dp = 96 but the cluster has
64 GPUs``); ``sim.spec.scenario`` turns it into the CLI's error line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from sim.costs import profile
from sim.network import deepep
from sim.parallel.context import check_context
from sim.parallel.grid import RankGrid
from sim.parallel.schedules import A2A_OVERLAP, SCHEDULES
from sim.spec.degrees import Degrees, degrees, pipeline_slots
from sim.spec.method import check_method
from sim.spec.sequence import check_sequence
from sim.spec.variation import check_variation

if TYPE_CHECKING:
    from sim.spec.scenario import MoeSpec, Scenario


class Rule(NamedTuple):
    """One cross-field rule: ``check(s, d)`` raises its one-line ValueError or returns; ``reads`` names the scenario
    fields (dotted paths; a section's name stands for all its fields) it reads, those behind the degrees it reads
    included, wherever a caller may vary them: a caller that checks many scenarios differing in a few fields (the
    search's layouts) runs a rule once per distinct value of the fields it reads (``sim.explore.layout_table``).
    The model, cluster and other fields no search varies are read freely."""

    reads: tuple[str, ...]
    check: Callable[[Scenario, Degrees], None]


# What the degrees' fields are read from (sim.spec.degrees): the data-parallel degree, the micro-batches, the chunks
_DP = ("parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp")
_MICROBATCHES = (*_DP, "training.micro_batch", "training.microbatches", "training.global_batch")
_CHUNKS = ("parallel.pp", "parallel.vpp", "parallel.first_stage_layers", "parallel.last_stage_layers",
           "parallel.account_for_embedding_in_pipeline_split", "parallel.account_for_loss_in_pipeline_split")
_ZERO = ("parallel.zero", "fsdp")
_SEQ_LEN = ("training.seq_len",)


def check_rules(s: Scenario) -> Degrees:
    """Cross-field rules (``RULES``, in this order: the first that fails is the one reported); each message starts
    with the field(s) it concerns. Returns the degrees it checked (``degrees(s)``), for a caller that resolves the
    scenario next (the search's candidates)."""
    d = degrees(s)
    for rule in RULES:
        rule.check(s, d)
    return d


def _gpus(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    gpus = d.num_gpus
    split, name = p.tp * p.cp * p.pp, "tp*pp" if p.cp == 1 else "tp*cp*pp"
    if p.dp is None and gpus % split:
        raise ValueError(f"parallel: {name} = {split} does not divide the cluster's {gpus} GPUs")
    if split * d.dp != gpus:
        raise ValueError(f"parallel: {name}*dp = {split * d.dp} but the cluster has {gpus} GPUs")


def _pipeline_split(s: Scenario, d: Degrees) -> None:
    p, m = s.parallel, s.model
    uneven = p.first_stage_layers is not None or p.last_stage_layers is not None
    slots = pipeline_slots(s)
    if uneven:
        _check_uneven_stages(s)
    elif slots:
        _check_split_slots(s, slots)
    elif m.num_layers % (p.pp * p.vpp):
        what = "pp" if p.vpp == 1 else "pp*vpp"
        raise ValueError(f"parallel.{what}: {p.pp * p.vpp} does not divide model.num_layers = {m.num_layers}")


def _tp_divides(s: Scenario, d: Degrees) -> None:
    p, m = s.parallel, s.model
    if m.num_attention_heads % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.num_attention_heads = {m.num_attention_heads}")
    if m.kv_heads % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.num_kv_heads = {m.kv_heads}")
    if m.ffn % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.ffn_hidden_size = {m.ffn}")


def _async_tp_chunks(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if p.tp_comm_overlap_method == "async_tp" and p.tp_comm_overlap_chunks not in (None, 1, p.tp):
        # torch/distributed/_symmetric_memory: one chunk per rank of the group (1: the ablation, not split)
        raise ValueError(f"parallel.tp_comm_overlap_chunks: {p.tp_comm_overlap_chunks} under async_tp, whose "
                         f"collectives move one chunk per TP rank: leave it unset (tp = {p.tp}) or 1 (not split)")


def _one_sharding(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.deepspeed is not None:
        raise ValueError("deepspeed: a scenario runs either PyTorch FSDP (fsdp) or DeepSpeed ZeRO "
                         "(zero_optimization / deepspeed), not both")


def _batch(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.global_batch is None and t.microbatches is None:
        raise ValueError("training: give global_batch (sequences per step) or microbatches (per pipeline)")
    if t.global_batch is not None and t.global_batch % (d.dp * t.micro_batch):
        raise ValueError(
            f"training.global_batch: {t.global_batch} is not a multiple of dp*micro_batch = "
            f"{d.dp}*{t.micro_batch} = {d.dp * t.micro_batch}"
        )
    # Both given: they must describe the same step (global_batch = microbatches * dp * micro_batch). Degrees takes
    # global_batch as given, so compare with the product, not with d.global_batch (which is the same field).
    if t.global_batch is not None and t.microbatches is not None and \
            t.global_batch != t.microbatches * d.dp * t.micro_batch:
        raise ValueError(f"training.microbatches: {t.microbatches} disagrees with global_batch {t.global_batch}: "
                         f"global_batch = microbatches*dp*micro_batch needs microbatches = "
                         f"{t.global_batch // (d.dp * t.micro_batch)}")


def _recompute_layers(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.recompute_num_layers is not None:
        if t.recompute != "full":
            raise ValueError(f"training.recompute_num_layers: needs recompute: full (got {t.recompute})")
        if t.recompute_num_layers > d.layers_per_chunk:
            raise ValueError(f"training.recompute_num_layers: {t.recompute_num_layers} exceeds the "
                             f"{d.layers_per_chunk} layers of a model chunk")


def _offload_layers(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.cpu_offloading_num_layers:
        # Megatron-Core TransformerConfig: "CPU offloading can be done only for layers less than num_layers" and
        # "CPU offloading does not work when activation recomputation is enabled".
        if s.parallel.pp > 1:  # TransformerConfig: "Currently there is no support for Pipeline parallelism with
            # CPU offloading" (1e05700595 and d98e8a64dd); Megatron-LM's fine-grained offloading has no such check
            raise ValueError(f"training.cpu_offloading_num_layers: Megatron-Core offloads activations only without "
                             f"pipeline parallelism (parallel.pp = {s.parallel.pp}; it refuses "
                             "--cpu-offloading-num-layers with --pipeline-model-parallel-size > 1)")
        if t.recompute != "none":
            raise ValueError(f"training.cpu_offloading_num_layers: activation offload needs recompute: none (got "
                             f"{t.recompute}), as Megatron-Core refuses both together")
        if t.cpu_offloading_num_layers >= min(d.chunk_sizes):
            raise ValueError(f"training.cpu_offloading_num_layers: {t.cpu_offloading_num_layers} must be below the "
                             f"{min(d.chunk_sizes)} layers of a model chunk (the last layer's backward starts at once)")


def _seq_len(s: Scenario, d: Degrees) -> None:
    m = s.model
    if m.position_embedding == "learned" and d.seq_len > m.max_seq_len:
        raise ValueError(f"training.seq_len: {d.seq_len} exceeds model.max_seq_len = {m.max_seq_len}")


def _sequence_parallel(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if p.sequence_parallel and d.seq_len % p.tp:
        raise ValueError(f"parallel.sequence_parallel: seq_len {d.seq_len} is not a multiple of tp = {p.tp}")


def _dtype(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.dtype not in s.cluster.gpu.peak_flops:
        raise ValueError(f"training.dtype: {t.dtype} has no tensor-core peak on {s.cluster.gpu.name}")


def _reshard(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.fsdp.reshard_after_forward is not None:
        _check_reshard_after_forward(s.fsdp.sharding, s.fsdp.reshard_after_forward, s.parallel.pp)


def _fsdp_zero(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if s.fsdp is not None and p.zero not in (0, s.fsdp.zero_stage):
        raise ValueError(f"fsdp.sharding: {s.fsdp.sharding} is ZeRO-{s.fsdp.zero_stage} but parallel.zero = {p.zero}")


def _deepspeed_pipeline(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if d.zero_stage >= 2 and s.fsdp is None and p.pp > 1:
        # DeepSpeed's PipelineEngine asserts zero_optimization_stage() < ZeroStageEnum.gradients ("ZeRO-2 and
        # ZeRO-3 are incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py).
        raise ValueError(f"parallel.zero: ZeRO-{d.zero_stage} with pp = {p.pp}: DeepSpeed's pipeline engine refuses "
                         "ZeRO-2/3 with pipelines; use an fsdp section (FSDP2 + pipelining) or ZeRO-1")


def _unit_per_stage(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.parallel.pp > 1 and any(size % s.fsdp.unit_layers for size in d.chunk_sizes):
        raise ValueError(f"fsdp.unit_layers: {s.fsdp.unit_layers} does not divide the layers of every model chunk "
                         f"({sorted(set(d.chunk_sizes))}); an FSDP unit lives on one pipeline stage")


def _sharded_split_backward(s: Scenario, d: Degrees) -> None:
    if d.zero_stage >= 2 and SCHEDULES[s.schedule].splits_backward:
        raise ValueError(f"schedule: {s.schedule} splits the backward; with ZeRO-{d.zero_stage}/FSDP use 1f1b or gpipe")


def _unit_layers(s: Scenario, d: Degrees) -> None:
    m = s.model
    if s.fsdp is not None and m.num_layers % s.fsdp.unit_layers:
        raise ValueError(f"fsdp.unit_layers: {s.fsdp.unit_layers} does not divide model.num_layers = {m.num_layers}")


def _hybrid_shard(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if s.fsdp is not None and s.fsdp.sharding == "HYBRID_SHARD":
        # FSDP shards over the gradient group, dp x cp (context parallelism's ranks reduce gradients too)
        per_node = s.cluster.gpus_per_node // p.tp if s.cluster.gpus_per_node % p.tp == 0 else 0
        ranks, what = d.dp * p.cp, f"dp = {d.dp}" if p.cp == 1 else f"dp x cp = {d.dp * p.cp}"
        if per_node < 1 or ranks % per_node or ranks == per_node:
            raise ValueError(f"fsdp.sharding: HYBRID_SHARD needs the {what} ranks to span several whole nodes "
                             f"({max(per_node, 1)} per node)")


def _method(s: Scenario, d: Degrees) -> None:
    check_method(s)


def _sequence(s: Scenario, d: Degrees) -> None:
    check_sequence(s.training.sequence, d.seq_len)


def _context(s: Scenario, d: Degrees) -> None:
    p, m, t = s.parallel, s.model, s.training
    check_context(p.cp, p.cp_comm_type, d.seq_len, p.tp, p.sequence_parallel, m.num_attention_heads, m.kv_heads,
                  flash_attention=t.flash_attention, sliding_window=m.window_size is not None,
                  latent_attention=m.multi_latent_attention)


def _variation(s: Scenario, d: Degrees) -> None:
    check_variation(s)


def _schedule(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    reason = SCHEDULES[s.schedule].invalid_reason(p.pp, d.microbatches, p.vpp)
    if reason:
        raise ValueError(f"schedule: {reason}")


def _offload(s: Scenario, d: Degrees) -> None:
    p, t = s.parallel, s.training
    if s.offload.params and not s.offload.optimizer:
        raise ValueError("offload.params: the host keeps the master weights only with offload.optimizer: true "
                         "(FSDP's CPUOffload and ZeRO-Infinity offload both)")
    if s.offload.params and d.zero_stage < 3:
        raise ValueError(f"offload.params: offloading the weights needs ZeRO-3/FSDP FULL_SHARD (zero stage is "
                         f"{d.zero_stage})")
    if p.overlap_param_gather and (d.zero_stage not in (1, 2) or s.fsdp is not None):
        raise ValueError(f"parallel.overlap_param_gather: needs the distributed optimizer (parallel.zero 1 or 2 "
                         f"without fsdp; zero stage is {d.zero_stage})")
    if p.overlap_param_gather and s.offload.optimizer:
        raise ValueError("parallel.overlap_param_gather: the weights come back from the host after the step "
                         "(offload.optimizer); set one of them false")
    if s.offload.optimizer and d.zero_stage < 1 and d.dp > 1:
        raise ValueError("offload.optimizer: ZeRO-Offload partitions the optimizer over dp; set parallel.zero >= 1")
    if not t.master_weights and t.dtype in ("fp32", "tf32"):
        raise ValueError(f"training.master_weights: false needs 16-bit weights (training.dtype {t.dtype}: fp32 "
                         "weights are their own master)")
    if s.offload.optimizer and (not t.master_weights or t.optimizer_dtype != "fp32"):
        raise ValueError("offload.optimizer: the host Adam is modelled with an fp32 master and fp32 moments "
                         "(DeepSpeed's CPUAdam); set training.master_weights: true and optimizer_dtype: fp32")


def _calibrated(s: Scenario, d: Degrees) -> None:
    t = s.training
    if s.costs.model == "calibrated":
        measured = profile.load(s.costs.profile)  # ProfileError: file, format, version, fields
        if t.dtype not in measured.gemm:
            raise ValueError(f"costs.profile: {s.costs.profile} has no {t.dtype} GEMM measurements (it has: "
                             f"{', '.join(sorted(measured.gemm)) or 'none'}); set training.dtype or recalibrate")


def _check_reshard_after_forward(sharding: str, reshard: bool, pp: int) -> None:
    """``fsdp.reshard_after_forward`` set explicitly: what it contradicts or what is not modelled."""
    if sharding == "NO_SHARD":
        raise ValueError("fsdp.reshard_after_forward: NO_SHARD never shards the weights; leave it unset")
    if sharding == "SHARD_GRAD_OP" and reshard:
        raise ValueError("fsdp.reshard_after_forward: true contradicts fsdp.sharding SHARD_GRAD_OP (FSDP's strategy "
                         "that keeps the weights gathered after the forward); use FULL_SHARD")
    if sharding == "HYBRID_SHARD" and not reshard:
        raise ValueError("fsdp.reshard_after_forward: false with HYBRID_SHARD is not modelled (use FULL_SHARD or "
                         "SHARD_GRAD_OP)")
    if pp > 1 and reshard:
        raise ValueError(f"fsdp.reshard_after_forward: true with parallel.pp = {pp} (gathers per micro-batch under "
                         "pipelining) is not modelled; FSDP + PP keeps each unit gathered for the step, "
                         "TorchTitan's default")


def _check_sm_contention(s: Scenario) -> None:
    net, gpu = s.network, s.cluster.gpu
    if not net.nccl_sms:
        return
    if gpu.sms is None:
        raise ValueError(f"network.nccl_sms: {gpu.name} has no SM count; set cluster.gpu.sms")
    for field, held in (("nccl_sms", net.nccl_sms), ("nccl_p2p_sms", net.nccl_p2p_sms)):
        if held >= gpu.sms:
            raise ValueError(f"network.{field}: {held} SMs must leave some of {gpu.name}'s {gpu.sms} to compute")


def _check_uneven_stages(s: Scenario) -> None:
    p, layers = s.parallel, s.model.num_layers
    given_fields = [name for name in ("first_stage_layers", "last_stage_layers") if getattr(p, name) is not None]
    field = "parallel." + "/".join(given_fields)
    if p.pp < 2:
        raise ValueError(f"{field}: needs pp >= 2 (pp = {p.pp})")
    if p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split:
        raise ValueError(f"{field}: not with parallel.account_for_embedding/loss_in_pipeline_split (Megatron-Core "
                         "refuses both at once)")
    given = (p.first_stage_layers is not None) + (p.last_stage_layers is not None)
    rest = layers - (p.first_stage_layers or 0) - (p.last_stage_layers or 0)
    others = p.pp - given
    if rest < others or (others and rest % others) or (not others and rest):
        raise ValueError(f"{field}: the other {others} stage(s) cannot split the remaining {rest} of "
                         f"model.num_layers = {layers} evenly")
    # With interleaving, each stage's layers split evenly over its vpp chunks (Megatron-Core transformer_config.py:
    # the first, the last and each middle stage's layers must be divisible by the virtual pipeline degree).
    _check_chunk_order(s, field)
    middle = rest // others if others else None
    for name, count in (("parallel.first_stage_layers", p.first_stage_layers),
                        ("parallel.last_stage_layers", p.last_stage_layers), (field, middle)):
        if count is not None and count % p.vpp:
            raise ValueError(f"{name}: a stage of {count} layers does not split over vpp = {p.vpp} model chunks "
                             "(Megatron-Core requires each stage's layers divisible by vpp)")


def _check_chunk_order(s: Scenario, field: str) -> None:
    """Uneven chunks are laid out in Megatron's interleaved order (chunk a * pp + b on stage b): not in the V or
    DualPipe layouts."""
    if s.parallel.vpp > 1 and SCHEDULES[s.schedule].layout != "interleaved":
        raise ValueError(f"{field}: uneven model chunks need the interleaved layout (schedule {s.schedule} places "
                         "its chunks otherwise)")


def _check_split_slots(s: Scenario, slots: int) -> None:
    """Megatron-Core's account_for_embedding/loss_in_pipeline_split: num_layers plus the slots the embedding and
    the loss take must split evenly over pp, and each stage's share over vpp (transformer_config.py)."""
    p, layers = s.parallel, s.model.num_layers
    if p.pp < 2:
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: needs pp >= 2 (pp = {p.pp})")
    _check_chunk_order(s, "parallel.account_for_embedding_in_pipeline_split")
    total = layers + slots
    if total % (p.pp * p.vpp):
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: model.num_layers + {slots} = {total} "
                         f"does not split evenly over pp*vpp = {p.pp * p.vpp} model chunks")
    if total == p.pp:
        # one slot per stage: the first stage holds the embedding alone (and the last the loss). Megatron-Core can
        # build such a stage; the simulator keeps a stage's head and embedding gradients with its layers, so it
        # refuses the layout rather than drop them
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: model.num_layers + {slots} = {total} "
                         f"over pp = {p.pp} stages leaves the embedding's or the loss's stage without a transformer "
                         "layer, which is not modelled")


def _check_recompute_modules(s: Scenario) -> None:
    """``training.recompute_modules``: Megatron-Core's rules (transformer_config.py __post_init__): mla_up_proj needs
    multi-head latent attention; and, where Megatron would silently do nothing, a module the model does not have is
    refused instead (moe, moe_act, shared_experts on a model without one). As in Megatron, the list is read only
    under selective recomputation (none and full ignore it, so a search over recompute modes keeps one base)."""
    t, m = s.training, s.model
    if t.recompute_modules is None:
        return
    for module in t.recompute_modules:
        if module == "mla_up_proj" and not m.multi_latent_attention:
            raise ValueError("training.recompute_modules: mla_up_proj needs multi-head latent attention "
                             "(model.multi_latent_attention)")
        if module in ("moe", "moe_act") and not m.is_moe:
            raise ValueError(f"training.recompute_modules: {module} needs a MoE model (model.num_moe_experts is "
                             "not set)")
        if module == "shared_experts" and not m.moe_shared_expert_intermediate_size:
            raise ValueError("training.recompute_modules: shared_experts needs a shared expert "
                             "(model.moe_shared_expert_intermediate_size is not set)")
        if module == "mlp" and m.is_moe and all(m.moe_layers):
            raise ValueError("training.recompute_modules: mlp recomputes dense MLPs and every layer is a MoE "
                             "layer (use moe or moe_act)")


@functools.cache
def _default_moe(spec: type[MoeSpec]) -> MoeSpec:
    """The default ``moe`` section, built once (the search checks the rules of thousands of layouts)."""
    return spec()


def _check_experts(s: Scenario, d: Degrees) -> None:
    """Expert parallelism (Megatron-Core's rules for MoE parallel folding, megatron/core/parallel_state.py and
    transformer_config.py), each naming its field; ``d``: the scenario's degrees."""
    p, m, moe = s.parallel, s.model, s.moe
    if not m.is_moe:
        if s.moe != _default_moe(type(s.moe)):
            raise ValueError("moe: the token-dispatch settings need a MoE model (model.num_moe_experts is not set)")
        if p.ep > 1 or (p.etp is not None and p.etp > 1):
            field = "ep" if p.ep > 1 else "etp"
            raise ValueError(f"parallel.{field}: expert parallelism needs a MoE model (model.num_moe_experts is "
                             "not set)")
        return
    experts = m.num_moe_experts or 0
    if experts % p.ep:
        raise ValueError(f"parallel.ep: {p.ep} does not divide model.num_moe_experts = {experts}")
    if m.moe_ffn % d.etp:
        raise ValueError(f"parallel.etp: {d.etp} does not divide the expert FFN size {m.moe_ffn}")
    if (d.tp * d.cp * d.dp) % (d.ep * d.etp):
        folded = "tp*dp" if d.cp == 1 else "tp*cp*dp"
        raise ValueError(f"parallel.ep: ep*etp = {d.ep * d.etp} does not divide {folded} = {d.tp * d.cp * d.dp} (the "
                         f"ranks of a pipeline stage the experts are folded over)")
    if p.tp > 1 and not p.sequence_parallel:
        raise ValueError(f"parallel.sequence_parallel: a MoE model with tp = {p.tp} needs sequence parallelism "
                         "(Megatron-Core requires it with expert layers)")
    if d.zero_stage >= 2 or s.fsdp is not None:
        raise ValueError(f"parallel.zero: ZeRO-{d.zero_stage}/FSDP with a MoE model is not modelled; use ZeRO-0 or "
                         "ZeRO-1 (Megatron's distributed optimizer)")
    if moe.pad_to_capacity and moe.capacity_factor is None:
        raise ValueError("moe.pad_to_capacity: padding to capacity needs moe.capacity_factor")
    if moe.force_load_balancing and moe.imbalance != 1.0:
        raise ValueError(f"moe.imbalance: {moe.imbalance:g} cannot be combined with moe.force_load_balancing (the "
                         "random router's imbalance is derived from the tokens, top-k, experts and ep); set one")
    if moe.token_dispatcher == "flex" and d.etp > 1:
        raise ValueError(f"moe.token_dispatcher: flex (DeepEP) with parallel.etp = {d.etp} is not modelled; use "
                         "etp 1 or the alltoall dispatcher")
    if moe.token_dispatcher == "flex" and d.ep > 1:  # DeepEP V1's peer limits (docs/mechanisms/deepep.md)
        grid = RankGrid(d.tp, d.pp, d.dp, s.cluster.gpus_per_node, d.ep, d.etp, d.cp)
        why = deepep.beyond_peer_limits(*deepep.ep_group_shape(grid.ep_group(0), s.cluster.nvlink_domain))
        if why:
            raise ValueError(f"moe.token_dispatcher: flex (DeepEP): {why}; use the alltoall dispatcher or another "
                             "layout")
    if moe.a2a_overlap:
        _check_a2a_overlap(s, d)
    if len(m.moe_layers) != m.num_layers:
        raise ValueError(f"model.moe_layer_freq: {len(m.moe_layers)} entries but model.num_layers = {m.num_layers}")


def _check_a2a_overlap(s: Scenario, d: Degrees) -> None:
    """``moe.a2a_overlap`` (--overlap-moe-expert-parallel-comm): Megatron-Core's conditions (transformer_config.py
    __post_init__), each naming its field."""
    t = s.training
    if d.ep == 1:
        raise ValueError("moe.a2a_overlap: needs expert parallelism (parallel.ep > 1)")
    if s.moe.token_dispatcher not in ("alltoall", "flex"):
        raise ValueError(f"moe.a2a_overlap: needs the alltoall or flex token dispatcher, not "
                         f"{s.moe.token_dispatcher}")
    if s.parallel.pp > 1 and s.schedule != "interleaved":
        raise ValueError(f"schedule: moe.a2a_overlap with pp = {s.parallel.pp} runs in Megatron-Core's interleaved "
                         f"schedule (virtual pipeline size given), not {s.schedule}")
    if s.parallel.pp > 1 and s.parallel.vpp < 2:
        # transformer_config.py __post_init__: "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size
        # must be specified when pipeline_model_parallel_size > 1"; arguments.py sets a virtual size of 1 to None.
        # The combined 1F1B exists only without pipelining and interleaved (combined_1f1b.py).
        raise ValueError(f"parallel.vpp: moe.a2a_overlap with pp = {s.parallel.pp} needs virtual pipeline stages "
                         f"(vpp >= 2, not {s.parallel.vpp}; Megatron-Core asserts a virtual pipeline size when pp > "
                         "1)")
    if s.parallel.pp == 1 and s.schedule not in A2A_OVERLAP:
        raise ValueError(f"schedule: moe.a2a_overlap with pp = 1 is Megatron-Core's no-pipelining combined 1F1B, not "
                         f"{s.schedule}")
    if t.recompute == "full":
        raise ValueError("training.recompute: full recomputation cannot run with moe.a2a_overlap (Megatron-Core "
                         "requires it off)")
    if t.recompute == "selective" and "moe" in (t.recompute_modules or ()):
        raise ValueError("training.recompute_modules: module moe cannot be recomputed with moe.a2a_overlap "
                         "(Megatron-Core requires it off)")
    if t.dtype not in ("bf16", "fp16", "fp8"):
        raise ValueError(f"training.dtype: moe.a2a_overlap needs a bf16 or fp16 model, not {t.dtype}")
    if s.parallel.cuda_device_max_connections == 1:
        # Megatron-Core's MoE README: "Requirements for EP A2A Overlap: ... CUDA_DEVICE_MAX_CONNECTIONS > 1"; at 1
        # the pair's kernels launch in issue order across streams and the overlap breaks up (Megatron-LM #2730)
        raise ValueError("parallel.cuda_device_max_connections: moe.a2a_overlap needs more than 1 hardware queue "
                         "(Megatron-Core's requirement; at 1 kernels launch in issue order, which is not modelled)")


def _experts(s: Scenario, d: Degrees) -> None:
    _check_experts(s, d)


# The rules in the order check_rules runs them, each with the fields it reads (``Rule.reads``).
RULES: tuple[Rule, ...] = (
    Rule(_DP, _gpus),
    Rule((*_CHUNKS, "schedule"), _pipeline_split),
    Rule(("parallel.tp",), _tp_divides),
    Rule(("parallel.tp_comm_overlap_method", "parallel.tp_comm_overlap_chunks", "parallel.tp"), _async_tp_chunks),
    Rule(("fsdp", "deepspeed"), _one_sharding),
    Rule(_MICROBATCHES, _batch),
    Rule((*_CHUNKS, "training.recompute", "training.recompute_num_layers"), _recompute_layers),
    Rule(("training.recompute_modules",), lambda s, d: _check_recompute_modules(s)),
    Rule((*_CHUNKS, "training.recompute", "training.cpu_offloading_num_layers"), _offload_layers),
    Rule(_SEQ_LEN, _seq_len),
    Rule(("parallel.sequence_parallel", "parallel.tp", *_SEQ_LEN), _sequence_parallel),
    Rule(("training.dtype",), _dtype),
    Rule(("fsdp", "parallel.pp"), _reshard),
    Rule(_ZERO, _fsdp_zero),
    Rule((*_ZERO, "parallel.pp"), _deepspeed_pipeline),
    Rule(("fsdp", *_CHUNKS), _unit_per_stage),
    Rule((*_ZERO, "schedule"), _sharded_split_backward),
    Rule(("fsdp",), _unit_layers),
    Rule(("fsdp", *_DP), _hybrid_shard),
    # check_method reads the training method's fields, the dtype and (under a DeepSpeed block) parallel.zero
    Rule(("training.method", "training.frozen_layers", "training.frozen_embedding", "training.lora",
          "training.qlora", "training.dtype", "deepspeed", "parallel.zero"), _method),
    Rule(("training.sequence", *_SEQ_LEN), _sequence),
    Rule(("network",), lambda s, d: _check_sm_contention(s)),
    Rule(("parallel.ep", "parallel.etp", "parallel.sequence_parallel", "parallel.vpp", "training.recompute",
          "training.recompute_modules", "training.dtype", "schedule", "moe", *_ZERO, *_DP), _experts),
    Rule(("parallel.cp", "parallel.cp_comm_type", "parallel.tp", "parallel.sequence_parallel",
          "training.flash_attention", *_SEQ_LEN), _context),
    Rule(("variation", "ranks", "network"), _variation),
    Rule(("schedule", "parallel.vpp", *_MICROBATCHES), _schedule),
    Rule(("offload", "parallel.overlap_param_gather", "training.master_weights", "training.dtype",
          "training.optimizer_dtype", *_ZERO, *_DP), _offload),
    Rule(("costs", "training.dtype"), _calibrated),
)
