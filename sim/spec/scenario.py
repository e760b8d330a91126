"""Scenario files: the one boundary where YAML becomes typed specs.

In: a scenario YAML path (or a dict) and ``--set a.b=value`` overrides. Out: a frozen ``Scenario`` in SI
units with every default filled (GPU and model presets expanded, link defaults from the node preset), or a
``ConfigError`` whose one-line message names the field and the rule, e.g.
``parallel: tp*pp*dp = 96 but the cluster has 64 GPUs``.

Shorthands: ``model: gpt3-175b`` (preset), ``model: path/config.json`` (Hugging Face config, relative to the
scenario file), ``model: {preset: llama2-7b, num_layers: 4}`` (preset with overrides); the same
``preset`` form for ``cluster.gpu``; ``costs: roofline`` and ``network: analytic`` for ``{model: ...}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from sim.errors import ConfigError
from sim.hardware.dtypes import parameter_dtype
from sim.hardware.frozen import FrozenSpec
from sim.model.hf_config import find_hf_config, read_hf_config
from sim.model.presets import MODEL_PRESETS
from sim.model.transformer import ModelSpec
from sim.spec.cluster import ClusterSpec, expand_preset
from sim.spec.degrees import degrees
from sim.spec.method import LoraSpec, QloraSpec
from sim.spec.rules import check_rules
from sim.spec.sequence import SequenceSpec
from sim.spec.variation import VariationSpec
from sim.units import Bytes, BytesPerSecond, Count, Seconds, parse_seconds

MiB = 2**20
# Input bounds (issue 27): a scenario is a few kB; these keep a malformed or hostile file from exhausting time or
# memory, and each is reported as one line naming what was exceeded.
# A scenario larger than this is refused unread: the largest bundled one is 2.4 kB, and PyYAML's pure-Python safe
# loader parses about 150 kB/s of a flow list (benchmarks/bench_loader.py), so this bounds a load near 2 s.
# (libyaml's CSafeLoader is faster but crashes the process on deep nesting: not used.)
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 32  # nesting of mappings/lists; the deepest bundled scenario nests 4 levels
MAX_NAME_CHARS = 200  # names are printed in titles and file headers
# Megatron-Core's --recompute-modules choices that this simulator prices (transformer_config.py; the gated-delta-net
# and hyper-connection ones concern layers it does not model).
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]


class TrainingSpec(FrozenSpec):
    global_batch: int | None = Field(default=None, ge=1, description="sequences per optimizer step")
    microbatches: int | None = Field(default=None, ge=1, description="m per pipeline; global_batch / (dp*micro_batch)")
    micro_batch: int = Field(default=1, ge=1)
    seq_len: int | None = Field(default=None, ge=1, description=(
        "tokens per sequence. Default: 8192 or the model's max_seq_len if shorter (sim.spec.degrees.DEFAULT_SEQ_LEN; "
        "never silently a long-context model's maximum), noted by sim check"))
    dtype: Literal["fp32", "tf32", "fp16", "bf16", "fp8"] = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_num_layers: int | None = Field(default=None, ge=0, description=(
        "with full recompute: layers of each model chunk recomputed, the first ones (Megatron-LM's "
        "--recompute-method block); the rest keep their activations. Default: all"))
    recompute_modules: list[RecomputeModule] | None = Field(default=None, description=(
        "with recompute: selective: the submodules whose activations are dropped in the forward and recomputed "
        "in the backward (Megatron-Core --recompute-modules, transformer_config.py recompute_modules). "
        "core_attn: the attention core (Korthikanti et al. 2022 Sec. 5); layernorm: the input and pre-MLP norms' "
        "outputs; mla_up_proj: MLA's up projections and RoPE (Q, K, V); mlp: a dense layer's MLP; moe_act: the "
        "routed experts' activation output; shared_experts: the shared expert MLP; moe: the whole MoE layer "
        "(router, dispatch, experts, combine: its all-to-alls run again). Default: [core_attn], Megatron's; read "
        "only with recompute: selective, as Megatron"))
    flash_attention: bool = False
    attention_backend: Literal["auto", "fused", "flash"] = Field(default="auto", description=(
        "which flash attention kernel runs, priced on its measured curves where the GPU's profile has them "
        "(docs/mechanisms/attention_kernels.md). fused: cuDNN's fused attention, what Transformer Engine runs on "
        "Hopper and later (it disables FlashAttention 'to give FusedAttention preference on Hopper+'; Megatron-LM "
        "--attention-backend fused); flash: FlashAttention-2 (the flash-attn package, and PyTorch SDPA's default "
        "backend, which tries flash before cuDNN). auto: fused with fused_kernels (Megatron-LM / NeMo on TE), "
        "flash without (eager PyTorch: HF, FSDP scripts, TorchTitan's SDPA)"))
    causal_attention: bool = Field(default=True, description=(
        "decoder LMs mask attention causally: flash attention computes only the score tiles on and below the "
        "diagonal (model.flash_tiles.causal_fraction: its time; MFU and HFU keep Megatron's full-matrix FLOPs); "
        "false: bidirectional attention (every tile)"))
    grad_dtype: Literal["auto", "fp32", "fp16", "bf16"] = Field(default="auto", description=(
        "what gradients are accumulated and reduced in. auto: fp32 for bf16 unless gradients are sharded "
        "(Megatron-LM forces fp32 accumulation and all-reduce for bf16, in its contiguous grad buffer), the "
        "training dtype under ZeRO-2/3, FSDP or a DeepSpeed block (their reduce dtype defaults to it)"))
    master_weights: bool = Field(default=True, description=(
        "the optimizer keeps an fp32 master copy of each trained 16-bit parameter (mixed precision: Megatron-LM, "
        "DeepSpeed, PyTorch AMP, TorchTitan's fp32 FSDP shards), 4 bytes per trained parameter, updated and cast "
        "back each step. false: pure 16-bit training, the optimizer updates the bf16 weights in place "
        "(torchtune's dtype: bf16: 'all activations, gradients and optimizer states are in bfloat16'). "
        "sim.model.memory.optimizer_bytes_per_param"))
    optimizer_dtype: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", description=(
        "dtype of Adam's moments (exp_avg, exp_avg_sq): 2 x 4 bytes per trained parameter in fp32, 2 x 2 in bf16 "
        "(Megatron-Core's --exp-avg-dtype / --exp-avg-sq-dtype; torch.optim.AdamW allocates them like the "
        "parameter, so pure bf16 training such as torchtune's sets master_weights: false, optimizer_dtype: bf16: "
        "2 + 2 + 4 = 8 bytes per trained parameter instead of 16)"))
    fp8_attention: bool = Field(default=False, description=(
        "with dtype fp8: also run the attention core (QK^T, softmax-V; flash attention) in FP8, as Megatron-LM's "
        "--fp8-dot-product-attention (Transformer Engine's fp8_dpa). Default false: fp8_autocast makes only the "
        "linear layers' GEMMs FP8 and attention stays bf16"))
    fp8_cast_kernels: bool = Field(default=True, description=(
        "with dtype fp8: Transformer Engine's cast/transpose kernels around each FP8 linear GEMM (input cast, "
        "weight cast, output-gradient cast, with the transposes the backward needs; delayed scaling). False: "
        "free casts (an FP8 model without them). docs/mechanisms/fp8.md"))
    fp8_recipe: Literal["delayed", "current"] = Field(default="delayed", description=(
        "with dtype fp8: per-tensor scaling recipe. delayed: Transformer Engine's DelayedScaling (the scale from "
        "the amax history; the cast writes the amax as a by-product). current: the scale from the tensor's own "
        "amax, scanned before the cast (TE Float8CurrentScaling; torchao's tensorwise dynamic scaling, "
        "TorchTitan's FP8): one more read of every bf16 tensor cast (docs/mechanisms/fp8.md)"))
    fp8_weight_cache: bool = Field(default=True, description=(
        "with dtype fp8: weights are cast to FP8 once per step and cached for its other micro-batches "
        "(Megatron-LM passes is_first_microbatch to TE's modules); false: cast in every micro-batch's forward "
        "(TE modules called without is_first_microbatch, e.g. under DeepSpeed or FSDP)"))
    fused_kernels: bool = Field(default=True, description="Megatron-LM's fused norm/activation/dropout-add kernels; "
                                "false: the unfused element-wise kernels of PyTorch eager mode (no torch.compile)")
    fused_norm_rope: bool | None = Field(default=None, description=(
        "RMSNorm and rotary embedding as fused kernels (true) or eager PyTorch (false) whatever fused_kernels says; "
        "default: as fused_kernels. Eager modelling code that calls flash-attn's fused kernels when installed "
        "(Qwen-7B's modeling_qwen.py: flash_attn.ops.rms_norm and apply_rotary_emb_func) sets fused_kernels false "
        "and this true"))
    cuda_graphs: bool = Field(default=False, description=(
        "the layers' kernels replay from CUDA graphs, so the CPU launches none of them one by one (no "
        "costs.launch_overhead). Off by default in Megatron-LM (--enable-cuda-graph / --external-cuda-graph), "
        "NeMo 24.x, DeepSpeed and PyTorch FSDP (eager; torch.compile mode='reduce-overhead' turns it on)"))
    clip_grad: float = Field(default=1.0, ge=0, description=(
        "gradient clipping by global norm (Megatron-LM's --clip-grad, default 1.0; 0 = off): before the optimizer "
        "step a multi-tensor L2-norm kernel reads every gradient the rank updates and one float is all-reduced over "
        "the model-parallel group (every rank when the optimizer is sharded). DeepSpeed's gradient_clipping "
        "defaults to 0; PyTorch FSDP clips when the training script calls clip_grad_norm_ (TorchTitan: 1.0)"))
    train_metric_states: int = Field(default=0, ge=0, description=(
        "torchmetrics metric states the trainer syncs across every rank after each step, on the host with the GPU "
        "idle (sim.workload.train_metrics; docs/mechanisms/train_metric_sync.md): each a barrier, world-size "
        "zeros_like, an all-gather and world-size copies. 0 (default): Megatron-LM, NeMo, TorchTitan, DeepSpeed "
        "and the HF Trainer reduce only the loss. MosaicML Composer computes the model's train metrics every "
        "batch: llm-foundry's MPT has LanguageCrossEntropy and LanguagePerplexity, two states each: 4"))
    train_tokens: Count | None = Field(default=None, description=(
        "a token budget (e.g. 15T): the summary adds the steps, time-to-train, GPU-hours, energy and cost of "
        "training on it (sim.output.planning); none: those figures are null"))
    cross_entropy: Literal["fused", "megatron", "hf"] = Field(default="fused", description=(
        "how the loss head holds its logits (sim.model.memory.LOSS_BYTES; docs/mechanisms/loss_head.md). fused: "
        "not held beyond the kernel (the accounting of earlier versions; chunked fused linear-cross-entropy "
        "kernels); megatron: vocab-parallel cross entropy, an fp32 copy of the bf16 logits kept for the backward "
        "(megatron/core/tensor_parallel/cross_entropy.py); hf: Hugging Face transformers under the Trainer's "
        "bf16 autocast, logits upcast to fp32 for log_softmax and its gradient (12 bytes per logit at the peak)"))
    cpu_offloading_num_layers: int = Field(default=0, ge=0, description=(
        "activation offload (Megatron-LM --cpu-offloading-num-layers N, which turns cpu_offloading on; Transformer "
        "Engine's get_cpu_offload_context): the first N layers of each model chunk copy their activations to the "
        "host over PCIe after their forward, on a copy stream under the next layer's forward, and back under the next "
        "layer's backward; 0: off. docs/mechanisms/activation_offload.md"))
    sequence: SequenceSpec = Field(default_factory=SequenceSpec, description=(
        "supervised fine-tuning inputs: document lengths and packing (sim.spec.sequence; "
        "docs/mechanisms/sequence_packing.md)"))
    # Fine-tuning (sim.spec.method, sim.model.peft; docs/mechanisms/peft.md).
    method: Literal["full", "lora", "qlora", "frozen"] = Field(default="full", description=(
        "full: every parameter trains; lora: the base model is frozen and low-rank adapters train (training.lora); "
        "qlora: LoRA on a base stored in 4-bit NF4 (training.qlora); frozen: full training except "
        "training.frozen_layers"))
    lora: LoraSpec = LoraSpec()
    qlora: QloraSpec = QloraSpec()
    frozen_layers: list[int] = Field(default_factory=list, description="method frozen: transformer layers (0-based) "
                                     "whose weights do not train")
    frozen_embedding: bool = Field(default=False, description="method frozen: the input embedding does not train")


class ParallelSpec(FrozenSpec):
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1, description="default: GPUs / (tp*cp*pp)")
    vpp: int = Field(default=1, ge=1, description="model chunks per pipeline stage (interleaved schedule)")
    sequence_parallel: bool = False
    first_stage_layers: int | None = Field(default=None, ge=1, description="layers of the first pipeline stage, "
                                           "when it differs (Megatron's --decoder-first-pipeline-num-layers)")
    last_stage_layers: int | None = Field(default=None, ge=1, description="layers of the last pipeline stage "
                                          "(--decoder-last-pipeline-num-layers); the rest split evenly")
    account_for_embedding_in_pipeline_split: bool = Field(default=False, description=(
        "Megatron-Core's flag of that name: the input embedding counts as one layer when the layers are split "
        "evenly over the pp*vpp model chunks, so the first chunk holds one transformer layer fewer (none if "
        "chunks hold one: the embedding alone, as in Llama 3's pipeline)"))
    account_for_loss_in_pipeline_split: bool = Field(default=False, description=(
        "the same for the output layer and loss: the last model chunk holds one transformer layer fewer"))
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage: 1 optimizer, 2 + gradients, 3 + weights")
    ep: int = Field(default=1, ge=1, description=(
        "expert parallelism (Megatron-Core --expert-model-parallel-size): a MoE layer's routed experts split over "
        "ep ranks, folded over the tp x dp ranks of a pipeline stage (MoE parallel folding)"))
    etp: int | None = Field(default=None, ge=1, description=(
        "expert tensor parallelism (--expert-tensor-parallel-size): each expert's FFN split over etp ranks; "
        "default tp, as Megatron-Core (expert_tensor_parallel_size None -> tensor_model_parallel_size)"))
    cp: int = Field(default=1, ge=1, description=(
        "context parallelism (Megatron-LM --context-parallel-size, TorchTitan context_parallel_degree): each "
        "sequence split over cp ranks in 2*cp load-balanced chunks; dp = GPUs / (tp*cp*pp); docs/mechanisms/"
        "context_parallel.md"))
    cp_comm_type: Literal["p2p", "all_gather", "a2a"] = Field(default="p2p", description=(
        "how attention sees the other ranks' keys and values (Megatron-LM --cp-comm-type): p2p, Transformer "
        "Engine's ring attention; all_gather, an all-gather of K and V before attention (Llama 3); a2a, "
        "DeepSpeed Ulysses' all-to-all of q, k, v (heads scattered) and of the output"))
    # PyTorch DDP's default bucket_cap_mb = 25.
    dp_bucket_size: Bytes = Field(default=25 * MiB, gt=0)
    grad_bucket_view: bool = Field(default=False, description="DDP gradient_as_bucket_view: grads live in the "
                                   "buckets (else the buckets are a second copy of the gradients, torch's default)")
    tp_comm_overlap: bool = Field(default=False, description=(
        "false: a TP collective blocks the compute stream in issue order (Megatron-LM's synchronous all-reduce / "
        "reduce-scatter); true: only its consumer waits, and with sequence parallelism each block's all-gather "
        "and reduce-scatter run in chunks under the GEMM beside them (Transformer Engine's userbuffers: NeMo "
        "ub_tp_comm_overlap, Megatron-LM --tp-comm-overlap; TorchTitan's async TP), only one chunk exposed; "
        "docs/mechanisms/tp_comm_overlap.md"))
    tp_comm_overlap_chunks: int | None = Field(default=None, ge=1, description=(
        "with tp_comm_overlap and sequence parallelism: the chunks a TP collective is split into under its GEMM; "
        "default tp (TE's ring exchange moves one shard per peer; the pipelined reduce-scatter's num_splits is 4 "
        "in NeMo's H100 userbuffers configs); 1: not split, the whole collective exposed"))
    tp_comm_overlap_method: Literal["userbuffers", "async_tp"] = Field(default="userbuffers", description=(
        "with chunked TP collectives: whose implementation runs them. userbuffers (default): Transformer Engine's "
        "(NeMo, Megatron-LM); async_tp: PyTorch's micro-pipelined TP (TorchTitan enable_async_tensor_parallel: "
        "torch.distributed._symmetric_memory), whose reduce-scatter leaves the tp partial sums of each shard to one "
        "reduction kernel after its chunks (priced on HBM, exposed), whose GEMMs are issued one per chunk and whose "
        "copies take no SMs (the defaults of tp_comm_overlap_chunk_gemms and tp_comm_overlap_sms follow); "
        "docs/mechanisms/tp_comm_overlap.md"))
    tp_comm_overlap_chunk_gemms: bool | None = Field(default=None, description=(
        "with chunked TP collectives (tp_comm_overlap_chunks > 1): true prices the GEMMs beside them as one GEMM "
        "per chunk, each at its own size on the cost model's GEMM curve (TE's ring exchange and pipelined "
        "reduce-scatter, PyTorch AsyncTP's fused_all_gather_matmul / fused_matmul_reduce_scatter issue one per "
        "chunk); false: priced as one GEMM. Default by tp_comm_overlap_method: false for userbuffers (on the "
        "measured rows the chunk GEMMs made the NeMo rows slower than measured), true for async_tp (one torch.mm "
        "per shard in its Python loop; docs/mechanisms/tp_comm_overlap.md)"))
    tp_comm_overlap_sms: int | None = Field(default=None, ge=0, description=(
        "with chunked TP collectives: SMs the reduce-scatter after a block's row-parallel GEMM takes from that GEMM "
        "(Transformer Engine's num_sm with set_sm_margin: the GEMM runs on the rest; 0 without the margin); default "
        "TE's own when no userbuffers config names it, 16 (what Megatron-LM's --tp-comm-overlap without "
        "--tp-comm-overlap-cfg runs; NeMo's H100 configs take 20 in bf16, proj_fprop 24 / fc2_fprop 16, and 1 in fp8, "
        "a ring exchange); 0 for PyTorch's AsyncTP, whose reduce-scatter copies chunks between GEMMs and sums them "
        "after (sim import torchtitan sets it); needs cluster.gpu.sms; docs/mechanisms/tp_comm_overlap.md"))
    overlap_p2p_comm: bool = Field(default=False, description=(
        "false: a stage's next compute waits for its pipeline send to complete (Megatron-LM's _communicate waits on "
        "every batched isend/irecv request before returning; always so in the non-interleaved 1F1B schedule); "
        "true: only the receiver waits (Megatron's --overlap-p2p-communication, interleaved schedule)"))
    cuda_device_max_connections: int | None = Field(default=None, ge=1, description=(
        "CUDA_DEVICE_MAX_CONNECTIONS: the hardware work queues the process's CUDA streams share. 1 (Megatron-LM's "
        "setting with tp > 1, arguments.py): kernels launch in issue order, so the TP collectives Megatron's "
        "linear backward issues asynchronously (SP's input all-gather before the input-gradient GEMM, the "
        "input-gradient reduce-scatter or all-reduce before the weight-gradient GEMM) start first and run under "
        "those GEMMs; > 1: nothing launches them before the GEMMs ('necessary for a speedup', megatron/core/"
        "tensor_parallel/layers.py), so each runs after the GEMM it would hide under, exposed. None: 32 with "
        "moe.a2a_overlap (Megatron-Core's EP A2A overlap needs > 1: its MoE README; the MoE ModelZoo's configs "
        "set 32 for it), else 1. docs/mechanisms/a2a_overlap.md"))
    overlap_grad_reduce: bool = Field(default=True, description=(
        "DDP / ZeRO-1: true: a gradient bucket is reduced as soon as its gradients are final in the last "
        "micro-batch's backward (PyTorch DDP; Megatron-LM --overlap-grad-reduce; NeMo overlap_grad_sync); false: "
        "one reduction per model chunk after the whole backward (Megatron-LM's default: bucket_size None). "
        "ZeRO-2/3: false runs each reduce-scatter on the compute stream, so the backward waits for it (DeepSpeed "
        "overlap_comm false, the default at stages 1-2; a zero_optimization block sets it). "
        "docs/mechanisms/distributed_optimizer.md"))
    overlap_param_gather: bool = Field(default=False, description=(
        "ZeRO-1/2 (Megatron's distributed optimizer): the updated weights are all-gathered per gradient bucket "
        "under the next step's forward, each layer's forward waiting for its bucket (Megatron-LM "
        "--overlap-param-gather, NeMo/Apex overlap_param_sync); false: one all-gather after the optimizer step"))
    align_param_gather: bool = Field(default=False, description=(
        "with overlap_param_gather: every bucket's all-gather is issued at the step start (Megatron-LM core "
        "0.9+'s default, --no-align-param-gather turns it off); false: the next bucket's all-gather is issued when "
        "the forward reaches the previous bucket (Megatron core_r0.8 and Apex DistributedFusedAdam)"))


class MoeSpec(FrozenSpec):
    """How a MoE model's tokens reach their experts (Megatron-Core's MoE knobs; used only with a MoE model)."""

    token_dispatcher: Literal["alltoall", "allgather", "flex"] = Field(default="alltoall", description=(
        "--moe-token-dispatcher-type: alltoall: tokens go to their experts' ranks by an all-to-all over the EP "
        "group (and come back by another); allgather: every rank all-gathers the tokens of the etp x ep group and "
        "reduce-scatters the outputs; flex: DeepEP's normal kernels (--moe-flex-dispatcher-backend deepep): a "
        "token sent once per destination node over RDMA and forwarded once per destination rank over NVLink "
        "(sim.network.deepep, docs/mechanisms/deepep.md)"))
    deepep_rdma_bandwidth: BytesPerSecond | None = Field(default=None, gt=0, description=(
        "flex: DeepEP's achieved RDMA bandwidth per GPU, counted as DeepEP's tests count it (tokens x distinct "
        "destination nodes x hidden x bytes / time); None: the DeepEP README's H800 table by nodes in the EP group "
        "(2: 43, 4: 58, 8+: 51 GB/s dispatch; 43/57/50 combine), scaled by the GPU's NIC line rate / 50 GB/s"))
    deepep_nvlink_bandwidth: BytesPerSecond | None = Field(default=None, gt=0, description=(
        "flex: DeepEP's achieved NVLink bandwidth per GPU (tokens received per rank x hidden x bytes / time); "
        "None: the README's intranode EP 8 row (153 GB/s dispatch, 158 combine on H800's 200 GB/s NVLink) as a "
        "fraction of this node's NVLink line rate"))
    deepep_sms: int = Field(default=20, ge=0, description=(
        "flex: SMs DeepEP's kernels hold while they run (Megatron-Core --moe-flex-dispatcher-num-sms, None -> 20, "
        "'DeepEP's historical mcore default'): compute overlapping a dispatch or combine (moe.a2a_overlap's pairs, "
        "a shared expert) runs on the rest (sim.engine.sm_contention); 0: off"))
    capacity_factor: float | None = Field(default=None, gt=0, description=(
        "--moe-expert-capacity-factor: an expert takes at most this x its even share of the token-expert pairs "
        "(the rest are dropped); None: dropless"))
    pad_to_capacity: bool = Field(default=False, description=(
        "--moe-pad-expert-input-to-capacity: every expert's input padded to its capacity (fixed shapes)"))
    imbalance: float = Field(default=1.0, ge=1.0, description=(
        "routing imbalance: the most loaded expert rank's token-expert pairs / the mean; the slowest rank sets the "
        "pace of the all-to-all and the expert GEMMs (1: even routing; not with force_load_balancing)"))
    force_load_balancing: bool = Field(default=False, description=(
        "--moe-router-force-load-balancing (benchmarking): the router's logits replaced by i.i.d. normal ones, new "
        "per micro-batch and layer, so each token goes to a uniformly random top-k subset of the experts; the "
        "busiest EP rank's expected token-expert pairs / the mean then replace moe.imbalance, from the tokens, "
        "top-k, experts and ep (sim.parallel.forced_balance, docs/mechanisms/forced_load_balancing.md)"))
    host_sync: bool | None = Field(default=None, description=(
        "whether the token dispatcher waits on the host for the routed token counts in every MoE layer's forward "
        "(Megatron-Core: the dropless alltoall dispatcher's cuda_dtoh_stream.synchronize(), the allgather "
        "dispatcher's .cpu(), DeepEP's dispatch waiting for the received counts): then a MoE layer pass takes at "
        "least the host's time to issue it (costs.eager_op_overhead; docs/mechanisms/moe_host_sync.md). None: "
        "Megatron's rule, every dispatcher but alltoall with pad_to_capacity (fixed shapes, no sync); off under "
        "training.cuda_graphs"))
    a2a_overlap: bool = Field(default=False, description=(
        "--overlap-moe-expert-parallel-comm --delay-wgrad-compute (Megatron-Core's combined 1F1B): one more "
        "warm-up forward, then each steady forward issued with a backward of another micro-batch, the two "
        "interleaved layer by layer so each one's dispatch/combine runs under the other's compute "
        "(docs/mechanisms/a2a_overlap.md); needs ep > 1, the alltoall or flex dispatcher, the interleaved "
        "schedule with vpp >= 2 when pp > 1, no full recomputation and no recompute module moe"))


class FsdpSpec(FrozenSpec):
    """PyTorch FSDP (Zhao et al. VLDB 2023): FULL_SHARD is ZeRO-3, SHARD_GRAD_OP ZeRO-2, HYBRID_SHARD shards
    inside a node and replicates across nodes, NO_SHARD is DDP."""

    sharding: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD"
    unit_layers: int = Field(default=1, ge=1, description="transformer layers per FSDP unit")
    prefetch: bool = Field(default=True, description="backward prefetch (FSDP BACKWARD_PRE): issue the next unit's "
                           "gather before this unit's reduce-scatter; false = backward_prefetch=None")
    version: Literal[1, 2] = Field(default=1, description=(
        "1: torch.distributed.fsdp.FullyShardedDataParallel (flat parameters): each micro-batch's backward also "
        "runs its gradient kernels, the copy of the parameters' gradients into the flat gradient, the cast to the "
        "reduce dtype and the pre-division (docs/mechanisms/fsdp_grad_kernels.md); 2: fully_shard (FSDP2, "
        "TorchTitan), per-parameter sharding, those kernels not priced"))
    reshard_after_forward: bool | None = Field(default=None, description=(
        "FSDP2's fully_shard(reshard_after_forward=...), TorchTitan's parallelism.fsdp_reshard_after_forward: "
        "true frees each unit's gathered weights after its forward and gathers them again for its backward "
        "(FULL_SHARD); false keeps them to the backward (SHARD_GRAD_OP: FULL_SHARD with false is the same; the "
        "Llama 3 paper's 'no reshard after forward', Sec. 3.3.2). null: the framework's default, true with pp = 1 "
        "and false with pp > 1 (TorchTitan's get_fsdp_reshard_after_forward_policy 'default': 'do not reshard "
        "after forward to avoid per-microbatch all-gathers')"))

    @property
    def zero_stage(self) -> int:
        """ZeRO stage the strategy amounts to: FULL_SHARD / HYBRID_SHARD 3, SHARD_GRAD_OP (or FULL_SHARD kept
        gathered after the forward, ``reshard_after_forward: false``) 2, NO_SHARD 0."""
        if self.sharding == "FULL_SHARD" and self.reshard_after_forward is False:
            return 2
        return {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD": 3, "NO_SHARD": 0}[self.sharding]


class DeepSpeedSpec(FrozenSpec):
    """What DeepSpeed ZeRO-3 issues, by DeepSpeed's own config names and defaults (deepspeed/runtime/zero/config.py;
    counts are parameter elements, not bytes). Set from a scenario's ``zero_optimization`` block. With ZeRO-3,
    every leaf module's parameters are all-gathered when its pre-forward/pre-backward hook fetches them
    (partitioned_param_coordinator.py fetch_sub_module): parameters of at most
    ``stage3_param_persistence_threshold`` elements stay whole on every rank and are never gathered
    (partition_parameters.py: ds_numel <= threshold); the next modules' parameters are prefetched in one coalesced
    all-gather of at least ``stage3_prefetch_bucket_size`` elements (a module is never split), as long as fewer
    than ``stage3_max_live_parameters`` are gathered (0: no prefetch); gradients are reduce-scattered in buckets of
    ``reduce_bucket_size`` elements, a bucket being reduced when the next gradient would overflow it
    (stage3.py reduce_independent_p_g_buckets_and_remove_grads). See docs/mechanisms/zero3_granularity.md."""

    stage3_prefetch_bucket_size: float = Field(default=5e7, ge=0, description="elements per prefetch all-gather")
    stage3_param_persistence_threshold: float = Field(default=1e5, ge=0, description="parameters of at most this "
                                                      "many elements are not partitioned (never gathered)")
    stage3_max_live_parameters: float = Field(default=1e9, ge=0, description="elements gathered at once before "
                                              "prefetching stops")
    reduce_bucket_size: float = Field(default=5e8, gt=0, description="elements per gradient reduce-scatter")


class OffloadSpec(FrozenSpec):
    """CPU offload (ZeRO-Offload, Ren et al. ATC 2021; ZeRO-Infinity; FSDP CPUOffload). ``optimizer``: the fp32
    master weights and Adam states live in host memory; each rank copies its reduced gradient shard to the host
    over PCIe, the host runs Adam, and the updated 16-bit weights come back. ``params``: the 16-bit weight shards
    live on the host too (ZeRO-3/FSDP), copied to the GPU before each all-gather."""

    optimizer: bool = False
    params: bool = False
    # Host memory bandwidth per GPU for the host Adam step: a DGX H100's two Xeon 8480C have 16 DDR5-4800
    # channels (614 GB/s) for 8 GPUs, 77 GB/s each; we assume Adam's mixed read/write stream reaches half of that
    # (an assumption, not a measurement: set it from a STREAM run on the host).
    host_bandwidth: BytesPerSecond = Field(default=38e9, gt=0, description="per GPU, for the host Adam step")


class MemorySpec(FrozenSpec):
    """What the allocator adds to what the tensors need: the CUDA context and library workspaces (``reserved``,
    typically 0.5-1 GiB) and the caching allocator's fragmentation (``allocator_overhead``, a fraction of the
    dynamic peak, typically 5-15%). Both default to 0, so reported peaks are the tensors' own bytes."""

    reserved: Bytes = Field(default=0.0, ge=0)
    allocator_overhead: float = Field(default=0.0, ge=0, le=1)


class FixedCostsSpec(FrozenSpec):
    model: Literal["fixed"]
    forward: Seconds = Field(gt=0, description="one transformer layer's forward, one micro-batch")
    backward: Seconds = Field(gt=0, description="one layer's backward; its input-gradient part (B) if weight_grad "
                              "is given")
    weight_grad: Seconds = Field(default=0.0, description="one layer's weight-gradient pass (W)")
    optimizer: Seconds = 0.0


class KernelCostsSpec(FrozenSpec):
    """What the roofline and calibrated cost models share: the end-to-end factor and the launch overheads."""

    end_to_end_factor: float | None = Field(default=None, gt=0, description=(
        "every kernel's time x this; default: the profile's factor (a shipped default profile: the GPU type's, "
        "fitted on named rows, docs/mechanisms/end_to_end_calibration.md; a measured profile: 1); 1 = the "
        "microbenchmark curves as measured"))
    kernel_floor: Seconds = Field(default=parse_seconds("1.2 us"), ge=0, description=(
        "the least device time of one kernel launch (a tiny kernel and the gap to the next): 1.1-1.3 us measured "
        "for a 1024-element add (pytorch/pytorch#161104)"))
    launch_overhead: Seconds = Field(default=parse_seconds("5 us"), ge=0, description=(
        "CPU time to launch one kernel without CUDA graphs (training.cuda_graphs: false): a piece of work of n "
        "launches takes at least n times this. 5 us: the low end of HTA's 5-20 us for the CPU launch event"))
    eager_op_overhead: Seconds = Field(default=parse_seconds("32 us"), ge=0, description=(
        "host time per kernel an eager PyTorch op issues from Python (dispatch, autograd bookkeeping, launch): "
        "what a MoE layer pass's eager ops cost the host behind the token dispatcher's host sync (moe.host_sync; "
        "sim.costs.host). 32 us: the median of an H100 host's 26-35 us per kernel replaying Megatron-Core's MoE "
        "layer (sim/data/reference/moe_host_measurements.csv); 0 = off"))
    te_module_overhead: Seconds = Field(default=parse_seconds("83 us"), ge=0, description=(
        "host time one Transformer Engine linear module's forward call costs beyond the eager op counted for its "
        "GEMM, added per TE linear module of Megatron-Core's TE layer spec (qkv and proj, or multi-head latent "
        "attention's 4-5; the experts' fc1 and fc2; a shared expert's 2: sim.costs.host.te_linear_modules) to a MoE "
        "layer forward's host time behind the dispatcher's sync. 83 us: 115 us measured per Megatron-Core "
        "TEColumnParallelLinear forward (BF16, TP 1; NVIDIA/TransformerEngine#1191, "
        "sim/data/reference/te_module_host_measurements.csv) less costs.eager_op_overhead's 32 us; 0 = off"))
    megatron_moe_host_ops: float = Field(default=63, ge=0, description=(
        "host time Megatron-Core's own MoE code (TopKRouter, the token dispatcher, the unpermute) adds to a MoE "
        "layer forward behind the dispatcher's sync, in eager ops at costs.eager_op_overhead each (sim.costs.host). "
        "63: the median over two H100/H200 hosts, two runs and two permute paths of Megatron-LM 1e05700595's "
        "router + dispatch + unpermute host time less the plain-PyTorch replay's for the same op sequence, over the "
        "replay's host time per kernel on the same host (sim/data/reference/megatron_moe_host_measurements.csv, "
        "docs/mechanisms/moe_host_sync.md); the backward adds none (measured no more than the replay's); 0 = off"))
    fp8_split_accumulation: float = Field(default=1.15, ge=1, description=(
        "with dtype fp8: how much slower an FP8 GEMM runs with split (FP32-promoted) accumulation than with "
        "Hopper's fast accumulation. Transformer Engine's recipe (and torchao's) accumulates the forward GEMM fast "
        "and the input- and weight-gradient GEMMs split (_2X_ACC_DGRAD/_2X_ACC_WGRAD); 1.15: the middle of the "
        "1.1-1.2x that fast accumulation measured (pytorch/ao#2377); 1 = fast accumulation everywhere. "
        "docs/mechanisms/fp8.md"))
    attention_curves: bool = Field(default=True, description=(
        "price the flash attention kernel at the profile's measured attention rates for training.attention_backend "
        "where the profile has them (the shipped H100 profile: cuDNN fused and FlashAttention-2; "
        "docs/mechanisms/attention_kernels.md); false: as a GEMM of the same FLOPs on the GEMM curve"))


class RooflineCostsSpec(KernelCostsSpec):
    model: Literal["roofline"] = "roofline"
    shape_efficiency: bool = Field(default=True, description="GEMM efficiency by size from the GPU's default "
                                   "profile (else the flat large-GEMM efficiency)")
    fp8_gemm: Literal["scaled_bf16", "profile"] = Field(default="scaled_bf16", description=(
        "FP8 GEMMs: scaled_bf16 prices an FP8 GEMM of f FLOPs as a bf16 GEMM of f/R FLOPs (R = FP8/bf16 peak, "
        "2 on Hopper): the bf16 curve's shape at twice the rate; profile: the profile's own fp8 curve, or the "
        "preset's flat efficiency of the FP8 peak where it has none (H100)"))


class CalibratedCostsSpec(KernelCostsSpec):
    """A measured profile (``sim calibrate``): its GEMM curve and copy bandwidth, and its link tiers if any."""

    model: Literal["calibrated"]
    profile: str = Field(description="path to a profile JSON (relative to the scenario file)")


class NetworkSpec(FrozenSpec):
    """``analytic``: closed forms per algorithm; ``contention``: flows sharing links max-min fairly (use with
    ``ranks: all`` so concurrent groups really share); ``ideal``: free communication. ``algorithm``: ``auto``
    picks the fastest per collective as NCCL's tuner does, or fix one (NCCL_ALGO)."""

    model: Literal["ideal", "analytic", "contention"] = "analytic"
    algorithm: Literal["auto", "ring", "tree", "nvls", "hierarchical"] = "auto"
    protocol: Literal["auto", "LL", "LL128", "Simple"] = Field(default="auto", description=(
        "NCCL protocol of rings across nodes (NCCL_PROTO): per-hop latency and bandwidth from NCCL's tuning "
        "model (sim.network.collectives.RING_PROTOCOLS); auto: the fastest per collective, as NCCL's tuner"))
    nccl_sms: int = Field(default=0, ge=0, description="SMs an in-flight collective holds (NCCL channels); "
                          "overlapped compute runs at (SMs - held) / SMs of its rate "
                          "(sim.engine.sm_contention); 0: off")
    nccl_p2p_sms: int = Field(default=2, ge=0, description="SMs an in-flight send holds, when nccl_sms > 0")


def _shorthand(value: Any) -> Any:
    return {"model": value} if isinstance(value, str) else value


class Scenario(FrozenSpec):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    seed: int = 0
    cluster: ClusterSpec
    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec = ParallelSpec()
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev"] = "1f1b"
    costs: Annotated[FixedCostsSpec | RooflineCostsSpec | CalibratedCostsSpec,
                     Field(discriminator="model")] = RooflineCostsSpec()
    network: NetworkSpec = NetworkSpec()
    ranks: Literal["slice", "all"] = Field(default="slice", description="slice: one rank per pipeline stage "
                                           "(symmetric groups costed whole); all: every rank")
    fold_tp: bool = Field(default=True, description="ranks: all: one process per TP group when its ranks are in "
                          "lockstep (same times, 1/tp of the tasks); false keeps every rank in the trace")
    engine: Literal["auto", "event"] = Field(default="auto", description="auto: exact longest-path evaluation "
                                             "when no time depends on contention, else the simpy replay")
    fsdp: FsdpSpec | None = None
    deepspeed: DeepSpeedSpec | None = Field(default=None, description="DeepSpeed ZeRO's communication granularity "
                                            "(set by a zero_optimization block)")
    offload: OffloadSpec = OffloadSpec()
    memory: MemorySpec = MemorySpec()
    moe: MoeSpec = MoeSpec()
    variation: VariationSpec = VariationSpec()

    @model_validator(mode="before")
    @classmethod
    def _deepspeed_block(cls, data: Any) -> Any:
        """A DeepSpeed ``zero_optimization`` block sets parallel.zero and the gradient bucket size."""
        if not isinstance(data, dict) or "zero_optimization" not in data:
            return data
        data = dict(data)
        block = data.pop("zero_optimization")
        if not isinstance(block, dict):
            raise ValueError("zero_optimization: expected a mapping like {stage: 2, reduce_bucket_size: 5e8}")
        known = {"stage", "reduce_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter",
                 "allgather_partitions", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                 "stage3_param_persistence_threshold", "stage3_max_live_parameters", "offload_optimizer",
                 "offload_param"}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"zero_optimization: unsupported key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        parallel = dict(data.get("parallel") or {})
        if "stage" in block:
            parallel["zero"] = block["stage"]
        # overlap_comm: whether gradient reductions run on their own stream (under the backward) or on the compute
        # stream (stage_1_and_2.py reduce_ipg_grads / stage3.py: ``self.reduction_stream`` only with overlap_comm).
        # DeepSpeed's default is true at stage 3 and false at stages 1-2 (zero/config.py overlap_comm_valid).
        overlap = block.get("overlap_comm", block.get("stage", 0) == 3)
        if not isinstance(overlap, bool):
            raise ValueError(f"zero_optimization.overlap_comm: expected true or false (got {overlap!r})")
        parallel.setdefault("overlap_grad_reduce", overlap)
        if "reduce_bucket_size" in block:  # DeepSpeed counts elements; 2 bytes each in mixed precision
            parallel["dp_bucket_size"] = float(block["reduce_bucket_size"]) * 2
        data["parallel"] = parallel
        data["deepspeed"] = {**{key: block[key] for key in DeepSpeedSpec.model_fields if key in block},
                             **dict(data.get("deepspeed") or {})}
        training = dict(data.get("training") or {})  # DeepSpeed reduces in the parameters' dtype by default
        dtype = training.get("dtype", TrainingSpec.model_fields["dtype"].default)
        training.setdefault("grad_dtype", parameter_dtype(dtype) if isinstance(dtype, str) else dtype)
        data["training"] = training
        offload = dict(data.get("offload") or {})
        for key, field in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
            device = (block.get(key) or {}).get("device", "none") if isinstance(block.get(key), dict) else "none"
            if device not in ("cpu", "none"):
                raise ValueError(f"zero_optimization.{key}.device: {device!r} is not modelled (cpu or none)")
            if device == "cpu":
                offload[field] = True
        if offload:
            data["offload"] = offload
        return data

    @field_validator("costs", "network", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any, info: ValidationInfo) -> Any:
        value = _shorthand(value)
        if info.field_name == "costs" and isinstance(value, dict) and "model" not in value:
            value = {**value, "model": "roofline"}  # the default model, so `--set costs.x=...` needs no tag
        if isinstance(value, dict) and value.get("model") == "calibrated" and isinstance(value.get("profile"), str):
            base_dir = Path((info.context or {}).get("base_dir", "."))
            value = {**value, "profile": str(base_dir / value["profile"])}  # an absolute path stays as it is
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model_source(cls, value: Any, info: ValidationInfo) -> Any:
        base_dir = Path((info.context or {}).get("base_dir", "."))
        if isinstance(value, str) and value.endswith(".json"):
            value = {"hf_config": value}
        if isinstance(value, dict) and "hf_config" in value:
            overrides = {k: v for k, v in value.items() if k != "hf_config"}
            fields = read_hf_config(str(value["hf_config"]), base_dir)
            fields.update(overrides)
            return fields
        return expand_preset(value, MODEL_PRESETS, "model")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Scenario:
        check_rules(self)  # sim.spec.rules: the cross-field rules, each naming its field
        return self


def _field_name(part: int | str) -> str:
    """A location part as printed: a key that is empty, padded or unprintable (a newline) is quoted, so the
    message stays on one line and still names it."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _format_error(error: ValidationError) -> str:
    first = error.errors()[0]
    # "fixed" / "roofline" after a field are a tagged union's tags, not keys; a top-level key of that name is one
    loc = ".".join(_field_name(part) for i, part in enumerate(first["loc"])
                   if i == 0 or part not in ("fixed", "roofline"))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    more = error.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{loc}: {message}{suffix}" if loc else f"{message}{suffix}"


def _depth(value: Any) -> int:
    """Nesting depth of parsed YAML (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def parse_yaml(text: str, what: str) -> Any:
    """YAML text -> data, with every failure one ``ConfigError`` naming ``what``: syntax, tags the safe loader
    refuses (``!!python/...``), and nesting deeper than ``MAX_DEPTH`` (PyYAML's composer recurses per level)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what}: not valid YAML{where} ({getattr(error, 'problem', None) or 'syntax'})") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    return data


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file (a BOM is allowed), read no further than ``MAX_FILE_BYTES``; every failure is one
    ``ConfigError`` naming ``what``."""
    if path.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} is a directory, not a file")
    if not path.is_file():
        raise ConfigError(f"{what}: file {str(path)!r} not found")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{what}: cannot read {str(path)!r}: {error.strerror or error}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{what}: {str(path)!r} is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what}: {str(path)!r} is not UTF-8 text (byte {error.start})") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (value parsed as YAML) to a raw scenario dict."""
    shorthand_key = {("costs",): "model", ("network",): "model", ("model",): "preset", ("cluster", "gpu"): "preset"}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected a.b=value")
        path_text, value_text = item.split("=", 1)
        keys = path_text.strip().split(".")
        path_text = ".".join(_field_name(key) for key in keys)  # as printed in errors: one line, quoted if odd
        node: dict[str, Any] = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if isinstance(child, str) and tuple(keys[: depth + 1]) in shorthand_key:
                child = {shorthand_key[tuple(keys[: depth + 1])]: child}
            if child is None:
                child = {}
            if not isinstance(child, dict):
                where = ".".join(map(_field_name, keys[: depth + 1]))
                raise ConfigError(f"--set {path_text}: {where} is not a mapping")
            node[key] = child
            node = child
        node[keys[-1]] = parse_yaml(value_text, f"--set {path_text}")
    return data


def scenario_from_dict(data: dict[str, Any], base_dir: Path | str = ".") -> Scenario:
    try:
        return Scenario.model_validate(data, context={"base_dir": str(base_dir)})
    except ValidationError as error:
        raise ConfigError(_format_error(error)) from None


def absolute_paths(data: dict[str, Any], base_dir: Path | str) -> dict[str, Any]:
    """A copy of a raw scenario mapping (or a fragment of one) whose file fields are absolute paths, resolved as
    validation resolves them: ``model`` (a ``config.json`` path or ``{hf_config: path, ...}``, found by
    ``find_hf_config``: the scenario's directory, then the working directory; left as written when neither has
    it, so the error stays the same) and ``costs.profile`` (against ``base_dir``, as ``_model_shorthand`` does).
    For a run elsewhere: a Dask worker started in another directory reads the same files (issue 26)."""
    base = Path(base_dir)
    data = dict(data)
    model = data.get("model")
    if isinstance(model, str) and model.endswith(".json"):
        found = find_hf_config(model, base)
        if found is not None:
            data["model"] = str(found.absolute())
    elif isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        found = find_hf_config(model["hf_config"], base)
        if found is not None:
            data["model"] = {**model, "hf_config": str(found.absolute())}
    costs = data.get("costs")
    if isinstance(costs, dict) and isinstance(costs.get("profile"), str):
        data["costs"] = {**costs, "profile": str((base / costs["profile"]).absolute())}
    return data


def absolute_override(item: str, base_dir: Path | str) -> str:
    """A ``--set a.b=value`` override with a file value made absolute (``absolute_paths``); any other override,
    or one that does not parse (its error is the run's to report), as given."""
    try:
        fragment = apply_overrides({}, [item])
    except ConfigError:
        return item
    resolved = absolute_paths(fragment, base_dir)
    if resolved == fragment:
        return item
    key = item.split("=", 1)[0].strip()
    value: Any = resolved
    for part in key.split("."):
        value = value[part]
    return f"{key}={json.dumps(value)}"  # JSON is YAML: reads back as the same value


def load_scenario(path: Path | str, overrides: list[str] | None = None) -> Scenario:
    path = Path(path)
    data = parse_yaml(read_text(path, "scenario"), f"scenario {path}")
    if not isinstance(data, dict):
        raise ConfigError(f"scenario: {path} must be a mapping of keys (name, cluster, model, ...)")
    return scenario_from_dict(apply_overrides(data, overrides or []), base_dir=path.parent)


def resolved_yaml(scenario: Scenario) -> str:
    """The scenario with every default filled and units written out (the batch and degrees the knobs imply
    included); loading it gives the same Scenario."""
    data = scenario.model_dump(mode="json")
    implied = degrees(scenario)
    data["training"]["seq_len"] = implied.seq_len
    data["training"]["global_batch"] = implied.global_batch
    data["training"]["microbatches"] = implied.microbatches
    data["parallel"]["dp"] = implied.dp
    return yaml.safe_dump(data, sort_keys=False)
