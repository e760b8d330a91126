"""Megatron-LM's ``pretrain_gpt.py`` arguments -> a scenario (and the mapping NeMo shares).

In: a launch script (bash: variables, arrays, ``torchrun ... pretrain_gpt.py ...``) or an argument list (read into
``Args`` by ``sim.interop.megatron_args``), and the command line's ``Options``. Out: a ``Draft`` whose report lists
every flag. Flag names, defaults and the rules refused are Megatron-LM's (megatron/training/arguments.py,
core_r0.x): e.g. ``--fp16`` with ``--bf16``, ``--num-layers-per-virtual-pipeline-stage`` with
``--num-virtual-stages-per-pipeline-rank``, ``--overlap-param-gather`` without ``--use-distributed-optimizer`` and
``--overlap-grad-reduce``, and ``--recompute-method`` with selective recompute are each one line naming the flag.

The mapping itself (``apply``; the model's shape and MoE flags in ``sim.interop.megatron_model``) reads argument
*destinations* (``tensor_model_parallel_size``), so NeMo's configuration, whose model keys are the same names, goes
through it too (sim.interop.nemo). Every flag the mapping did not read is reported by ``leftovers``: the
launcher's, harmless ones (data, logging, the optimizer's hyperparameters) as ignored, the rest as unknown.
"""

from __future__ import annotations

import re
from typing import Any

from sim.interop.draft import Draft, Options, Status, cluster, refuse
from sim.interop.megatron_args import NEGATED, Args, parse_tokens, read_file_argument, read_launch
from sim.interop.megatron_model import MEGATRON_MLA, MlaDefaults, apply_model
from sim.spec.scenario import ParallelSpec, parse_yaml

# The launcher's own flags (torchrun / torch.distributed.run) and the ones read into the cluster.
TORCHRUN = frozenset({"nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_id",
                      "rdzv_backend", "rdzv_endpoint", "rdzv_conf", "standalone", "max_restarts", "monitor_interval",
                      "start_method", "redirects", "tee", "log_dir", "role", "local_addr"})
# Arguments that do not change one step's time or memory: data, tokenizer, paths, logging, checkpointing, the
# learning-rate schedule and optimizer hyperparameters, initialisation, dropout rates, the eval cadence.
HARMLESS_PREFIXES = (
    "lr", "min_lr", "decoupled_", "weight_decay", "adam_", "sgd_", "init_method", "log_", "save", "load", "data_",
    "split", "vocab_file", "merge_file", "tokenizer_", "eval_", "tensorboard", "wandb_", "train_iters",
    "train_samples", "seed", "exit_", "hidden_dropout", "attention_dropout", "ckpt_", "distributed_timeout",
    "profile", "mock_data", "num_workers", "use_mcore_models", "use_legacy_models", "no_load_", "rotary_",
    "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_load_balancing_type", "moe_router_score_function",
    "moe_router_dtype", "layernorm_epsilon", "norm_epsilon", "manual_gc", "empty_unused_memory_level",
    "calculate_per_token_loss", "tiktoken_", "no_create_attention_mask", "no_mmap_bin_files", "use_dist_ckpt",
    "async_save", "dataloader_type", "finetune", "no_persist_layer_norm", "initial_loss_scale", "loss_scale",
    "min_loss_scale", "hysteresis", "fp8_amax_", "fp8_margin", "fp8_interval", "use_rotary_position_embeddings",
    "accumulate_allreduce_grads_in_fp32", "distributed_backend", "timing_log", "use_cpu_initialization",
    "micro_batch_size_", "ckpt_format", "dist_ckpt", "override_opt_param_scheduler", "use_checkpoint_",
    "apply_layernorm_1p", "untie_embeddings", "position_embedding_type", "num_layers_per", "rampup_batch_size",
    "step_batch_size_schedule", "mid_level_dataset", "object_storage", "log_interval", "moe_router_pre_softmax",
    "moe_grouped_gemm", "no_masked_softmax_fusion", "attention_softmax_in_fp32",
    "fp8_param_gather", "clip_grad", "add_position_embedding", "bias_swiglu", "no_bias_", "no_rope_fusion",
    "enable_one_logger",
)
HARMLESS_NOTE = {
    "rampup_batch_size": "a batch-size ramp: the steady-state --global-batch-size is simulated",
    "step_batch_size_schedule": "a batch-size schedule: the steady-state --global-batch-size is simulated",
    "fp8_param_gather": "FP8 weights gathered by the distributed optimizer: its all-gather bytes are not halved "
                        "in the simulation (bf16 bytes)",
    "moe_grouped_gemm": "grouped GEMMs are what the simulator prices for experts",
}


def ddp_bucket_elements(dp: int) -> int:
    """Megatron-Core's default gradient bucket, in elements, for ``dp`` data-parallel ranks (the data-parallel
    group without cp): ``max(40000000, 1000000 * dp)`` (megatron/core/distributed/distributed_data_parallel.py, when
    DistributedDataParallelConfig.bucket_size is None: larger dp, larger buckets, so each rank's ring chunk stays
    bandwidth-bound; the same at 1e05700595 and at d98e8a64dd). Megatron-LM's --ddp-bucket-size and NeMo's
    ``model.optim.ddp_bucket_size`` / ``trainer.strategy.ddp.bucket_size`` leave it None unless given."""
    return max(40_000_000, 1_000_000 * dp)


def apply(draft: Draft, args: Args, options: Options, world: dict[str, tuple[int, str]],
          mcore_ddp: bool = True, mla: MlaDefaults = MEGATRON_MLA) -> None:
    """Megatron's argument destinations -> scenario fields (the rules refused, the defaults written out).
    ``mcore_ddp``: Megatron-Core's DistributedDataParallel buckets the gradients (``ddp_bucket_size`` or its
    default); false where another optimizer does (NeMo 1.x's Apex distributed_fused_adam, sim.interop.nemo).
    ``mla``: the multi-head latent attention widths the framework builds where none is given (NeMo's config
    classes, sim.interop.nemo.mla_defaults; Megatron-LM's arguments.py otherwise)."""
    def put(target: str, dest: str, value: Any, note: str = "", status: Status = "mapped") -> None:
        draft.put(target, value, args.source(dest), args.raw(dest) if args.has(dest) else None, note, status)

    gpus = cluster(draft, options, world.get("nodes"), world.get("per_node"), world.get("world"))
    # Precision (arguments.py: fp16 and bf16 are exclusive; fp8 runs on top of either).
    fp16, bf16 = args.flag("fp16"), args.flag("bf16")
    if fp16 and bf16:
        raise refuse(f"{args.source('fp16')}: cannot be combined with {args.source('bf16')} (Megatron-LM asserts "
                     "one half-precision type)")
    fp8 = args.get("fp8_format") or args.get("fp8")
    if isinstance(fp8, str) and fp8.lower() in ("false", "none", "null", ""):
        fp8 = None
    if fp8 and fp8 is not True and str(fp8).lower() not in ("hybrid", "e4m3", "true"):
        raise refuse(f"{args.source('fp8_format')}: {fp8!r} is not modelled (hybrid or e4m3: FP8 GEMMs with "
                     "Transformer Engine's delayed scaling)")
    if fp8:
        put("training.dtype", "fp8_format" if args.has("fp8_format") else "fp8", "fp8",
            "Transformer Engine FP8 GEMMs (the rest in bf16)")
        if bf16 or fp16:
            draft.row(args.source("bf16" if bf16 else "fp16"), True, "mapped", "the non-FP8 kernels' type (bf16 in "
                      "the simulation)", "training.dtype = fp8")
    elif bf16:
        put("training.dtype", "bf16", "bf16")
    elif fp16:
        put("training.dtype", "fp16", "fp16")
    else:
        put("training.dtype", "bf16", "fp32", "no --bf16/--fp16: Megatron-LM trains in fp32", "default")
    if args.flag("grad_reduce_in_bf16"):
        put("training.grad_dtype", "grad_reduce_in_bf16", "bf16")
    # Megatron-Core's precision-aware optimizer (Transformer Engine's FusedAdam; arguments.py
    # --use-precision-aware-optimizer with --exp-avg-dtype / --exp-avg-sq-dtype / --main-params-dtype /
    # --main-grads-dtype, each fp32 by default and read only with it): the moments' dtype is
    # training.optimizer_dtype; the master stays fp32 (an fp16 master, or moments of two dtypes, is not modelled).
    if args.flag("use_precision_aware_optimizer"):
        if not args.flag("use_distributed_optimizer"):  # megatron/core/optimizer/__init__.py raises the same
            raise refuse(f"{args.source('use_precision_aware_optimizer')}: needs --use-distributed-optimizer "
                         "(Megatron-Core supports it only with the distributed optimizer)")
        avg, avg_sq = str(args.get("exp_avg_dtype", "fp32")), str(args.get("exp_avg_sq_dtype", "fp32"))
        for dest, value in (("exp_avg_dtype", avg), ("exp_avg_sq_dtype", avg_sq)):
            if value not in ("fp32", "bf16", "fp16"):
                raise refuse(f"{args.source(dest)}: {value!r} optimizer states are not modelled (fp32, bf16, fp16)")
        if avg != avg_sq:
            raise refuse(f"{args.source('exp_avg_sq_dtype')}: {avg_sq!r} differs from {args.source('exp_avg_dtype')} "
                         f"{avg!r} (one training.optimizer_dtype for both moments)")
        main_params = str(args.get("main_params_dtype", "fp32"))
        if main_params != "fp32":
            raise refuse(f"{args.source('main_params_dtype')}: {main_params} master weights are not modelled (fp32, "
                         "or none with training.master_weights: false)")
        draft.row(args.source("use_precision_aware_optimizer"), True, "mapped",
                  "Adam's moments in --exp-avg-dtype / --exp-avg-sq-dtype", f"training.optimizer_dtype = {avg}")
        put("training.optimizer_dtype", "exp_avg_dtype", avg, "exp_avg and exp_avg_sq (fp32 master kept)",
            status="mapped" if args.has("exp_avg_dtype") else "default")
        if args.get("main_grads_dtype") == "bf16":
            put("training.grad_dtype", "main_grads_dtype", "bf16")
    else:
        for dest in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype", "main_grads_dtype"):
            if args.has(dest):
                args.get(dest)
                draft.row(args.source(dest), args.raw(dest), "ignored",
                          "read by Megatron-LM only with --use-precision-aware-optimizer")
    # Layout.
    tp = args.int("tensor_model_parallel_size", 1) or 1
    pp = args.int("pipeline_model_parallel_size", 1) or 1
    put("parallel.tp", "tensor_model_parallel_size", tp, status="mapped" if args.has(
        "tensor_model_parallel_size") else "default")
    put("parallel.pp", "pipeline_model_parallel_size", pp, status="mapped" if args.has(
        "pipeline_model_parallel_size") else "default")
    layers = args.int("num_layers")
    per_virtual = args.int("num_layers_per_virtual_pipeline_stage")
    virtual = args.int("num_virtual_stages_per_pipeline_rank") or args.int("virtual_pipeline_model_parallel_size")
    if per_virtual is not None and virtual is not None:
        raise refuse(f"{args.source('num_layers_per_virtual_pipeline_stage')}: cannot be combined with "
                     f"{args.source('num_virtual_stages_per_pipeline_rank')} (Megatron-LM takes one of them)")
    vpp = virtual or 1
    if per_virtual is not None:
        if layers is None or layers % (pp * per_virtual):
            raise refuse(f"{args.source('num_layers_per_virtual_pipeline_stage')}: {per_virtual} layers per virtual "
                         f"stage do not divide the {layers} layers of pp = {pp} stages evenly")
        vpp = layers // pp // per_virtual
        put("parallel.vpp", "num_layers_per_virtual_pipeline_stage", vpp,
            f"{layers} layers / pp {pp} / {per_virtual} per virtual stage")
    elif virtual is not None:
        dest = "num_virtual_stages_per_pipeline_rank" if args.has("num_virtual_stages_per_pipeline_rank") \
            else "virtual_pipeline_model_parallel_size"
        put("parallel.vpp", dest, vpp)
    if vpp > 1:
        put("schedule", "num_layers_per_virtual_pipeline_stage", "interleaved",
            "Megatron's interleaved 1F1B with virtual stages", "default")
        given = args.has("overlap_p2p_comm")
        put("parallel.overlap_p2p_comm", "overlap_p2p_comm", args.flag("overlap_p2p_comm", True),
            "" if given else "Megatron-LM's default (--no-overlap-p2p-communication turns it off)",
            "mapped" if given else "default")
    first, last = args.int("decoder_first_pipeline_num_layers"), args.int("decoder_last_pipeline_num_layers")
    if first is not None:
        put("parallel.first_stage_layers", "decoder_first_pipeline_num_layers", first)
    if last is not None:
        put("parallel.last_stage_layers", "decoder_last_pipeline_num_layers", last)
    for dest in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if args.flag(dest):  # the embedding / the loss counted as one layer's slot in the split (arguments.py)
            put(f"parallel.{dest}", dest, True)
    if args.flag("sequence_parallel"):
        if tp > 1:
            put("parallel.sequence_parallel", "sequence_parallel", True)
        else:
            draft.row(args.source("sequence_parallel"), True, "ignored", "Megatron-LM turns it off with tp = 1")
    cp = args.int("context_parallel_size", 1) or 1
    if args.has("context_parallel_size"):
        if "cp" in ParallelSpec.model_fields:
            put("parallel.cp", "context_parallel_size", cp)
        elif cp > 1:
            draft.row(args.source("context_parallel_size"), cp, "unmapped",
                      "context parallelism is not in the scenario yet (parallel.cp): its ranks are simulated as "
                      "data-parallel ranks, each with whole sequences")
        else:
            draft.row(args.source("context_parallel_size"), cp, "ignored", "1: no context parallelism")
    _cp_comm_type(draft, args, cp)
    if args.has("expert_model_parallel_size"):
        put("parallel.ep", "expert_model_parallel_size", args.int("expert_model_parallel_size"))
    if args.has("expert_tensor_parallel_size"):
        put("parallel.etp", "expert_tensor_parallel_size", args.int("expert_tensor_parallel_size"))
    distributed = args.flag("use_distributed_optimizer")
    if distributed:
        put("parallel.zero", "use_distributed_optimizer", 1, "Megatron's distributed optimizer shards the optimizer "
            "states over dp (ZeRO-1)")
    overlap_reduce = args.flag("overlap_grad_reduce")
    put("parallel.overlap_grad_reduce", "overlap_grad_reduce", overlap_reduce,
        "" if overlap_reduce else "Megatron-LM's default: one reduction per model chunk after the backward",
        "mapped" if args.has("overlap_grad_reduce") else "default")
    # The bucket, in elements of the gradient buffer's dtype (DistributedDataParallelConfig.bucket_size): fp32 main
    # gradients (arguments.py sets accumulate_allreduce_grads_in_fp32 under --bf16), 2 bytes with
    # --grad-reduce-in-bf16 or fp16 training.
    element = 2 if args.flag("grad_reduce_in_bf16") or fp16 else 4
    elements = args.int("ddp_bucket_size") if mcore_ddp else None
    if elements is not None:
        put("parallel.dp_bucket_size", "ddp_bucket_size", elements * element, f"{elements:,} gradients of {element} "
            "bytes" + ("" if overlap_reduce else " (read only with --overlap-grad-reduce)"))
    elif overlap_reduce and mcore_ddp:  # without it Megatron-Core sets bucket_size None (one bucket per chunk)
        dp = max(1, gpus // (tp * pp * cp))
        elements = ddp_bucket_elements(dp)
        put("parallel.dp_bucket_size", "ddp_bucket_size", elements * element, f"Megatron-Core's default max(40e6, "
            f"1e6 x dp {dp}) = {elements:,} gradients of {element} bytes", "default")
    if args.flag("overlap_param_gather"):
        if not distributed:
            raise refuse(f"{args.source('overlap_param_gather')}: needs --use-distributed-optimizer (Megatron-LM "
                         "asserts it)")
        if not overlap_reduce:
            raise refuse(f"{args.source('overlap_param_gather')}: needs --overlap-grad-reduce (Megatron-LM asserts "
                         "it)")
        put("parallel.overlap_param_gather", "overlap_param_gather", True)
        given = args.has("align_param_gather")
        put("parallel.align_param_gather", "align_param_gather", args.flag("align_param_gather", True),
            "" if given else "Megatron-LM core 0.9+'s default (--no-align-param-gather turns it off)",
            "mapped" if given else "default")
    if args.flag("tp_comm_overlap"):
        put("parallel.tp_comm_overlap", "tp_comm_overlap", True)
    # Batch.
    micro = args.int("micro_batch_size", 1) or 1
    put("training.micro_batch", "micro_batch_size", micro, status="mapped" if args.has("micro_batch_size")
        else "default")
    if args.has("global_batch_size"):
        put("training.global_batch", "global_batch_size", args.int("global_batch_size"))
    else:
        put("training.microbatches", "global_batch_size", 1, "Megatron-LM's default global batch: "
            "micro_batch_size x dp (one micro-batch)", "default")
    if args.has("seq_length"):
        put("training.seq_len", "seq_length", args.int("seq_length"))
    # Recompute (arguments.py: a method only with full granularity).
    granularity = args.get("recompute_granularity")
    method = args.get("recompute_method")
    if granularity == "selective":
        if method is not None:
            raise refuse(f"{args.source('recompute_method')}: not with --recompute-granularity selective "
                         "(Megatron-LM asserts it)")
        put("training.recompute", "recompute_granularity", "selective")
        modules = args.get("recompute_modules")  # Megatron-Core's names, the scenario's (its default core_attn)
        if modules:
            put("training.recompute_modules", "recompute_modules", [modules] if isinstance(modules, str) else modules)
    elif granularity == "full":
        count = args.int("recompute_num_layers")
        put("training.recompute", "recompute_granularity", "full")
        if method == "block" and count is not None:
            put("training.recompute_num_layers", "recompute_num_layers", count,
                "block: the first N layers of each chunk recomputed")
        elif method == "uniform" and count not in (None, 1):
            draft.row(args.source("recompute_method"), method, "unmapped",
                      f"uniform groups of {count} layers: simulated as every layer recomputed (the same compute; "
                      "fewer stashed inputs are not modelled)")
        elif method is not None:
            draft.row(args.source("recompute_method"), method, "mapped", "every layer recomputed",
                      "training.recompute = full")
    elif granularity is not None:
        raise refuse(f"{args.source('recompute_granularity')}: {granularity!r} is not full or selective")
    elif method is not None:
        draft.row(args.source("recompute_method"), method, "ignored", "no --recompute-granularity: Megatron-LM "
                  "does not recompute")
    # Activation offload (Megatron-Core TransformerConfig cpu_offloading / cpu_offloading_num_layers: Megatron-LM's
    # --cpu-offloading-num-layers, which arguments.py turns cpu_offloading on for when above 0; NeMo's keys both).
    # The rules then refuse what Megatron-Core refuses beside it (pp > 1, recomputation), naming the field.
    # The count is read only with offload on: NeMo's megatron_gpt_config.yaml writes cpu_offloading: False beside
    # cpu_offloading_num_layers: ${sum:${.num_layers},-1}, an interpolation it never evaluates then.
    dest = "cpu_offloading_num_layers"
    if not args.flag("cpu_offloading", True):  # NeMo's key; Megatron-LM has no such flag (on by the count)
        if args.has(dest):
            args.get(dest)
            draft.row(args.source(dest), args.raw(dest), "ignored", "cpu_offloading off")
    elif offloaded := args.int(dest) or 0:
        put("training.cpu_offloading_num_layers", dest, offloaded)
    elif args.has("cpu_offloading") or args.has(dest):
        draft.row(args.source(dest), args.raw(dest) if args.has(dest) else 0, "ignored", "0 layers: none offloaded")
    # Attention kernel: TE's flash/fused attention unless the unfused path is asked for.
    # NeMo 2.0 configs write Megatron-Core's enum member (AttnBackend.flash); the flag its name.
    backend = str(args.get("attention_backend", "auto")).removeprefix("AttnBackend.")
    if args.flag("use_flash_attn") or backend in ("auto", "flash", "fused"):
        dest = "use_flash_attn" if args.flag("use_flash_attn") else "attention_backend"
        draft.put("training.flash_attention", True, args.source(dest), args.raw(dest) if args.has(dest) else "auto",
                  "Transformer Engine's flash/fused attention (attention backend auto)",
                  "mapped" if args.has(dest) else "default")
        if backend in ("flash", "fused"):  # the kernel asked for: its measured curve prices it (attention_kernels.md)
            put("training.attention_backend", "attention_backend", backend,
                "FlashAttention-2" if backend == "flash" else "cuDNN fused attention (TE FusedAttention)")
    elif backend in ("unfused", "local"):
        put("training.flash_attention", "attention_backend", False)
    else:
        raise refuse(f"{args.source('attention_backend')}: {backend!r} is not auto, flash, fused, unfused or local")
    if args.has("clip_grad"):
        put("training.clip_grad", "clip_grad", args.float("clip_grad"))
    if args.flag("enable_cuda_graph") or args.flag("external_cuda_graph") or args.get("cuda_graph_impl") in (
            "local", "transformer_engine"):
        dest = next(d for d in ("enable_cuda_graph", "external_cuda_graph", "cuda_graph_impl") if args.has(d))
        put("training.cuda_graphs", dest, True)
    _connections(draft, args)
    apply_model(draft, args, options, tp, mla)


# The environment variable Megatron-LM reads for the hardware work queues (never a flag): the launch script's export
# (sim.interop.megatron_args.Script.environment), NeMo-Framework-Launcher's env_vars (sim.interop.nemo).
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def _connections(draft: Draft, args: Args) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS -> ``parallel.cuda_device_max_connections``: a positive whole number, else one
    line naming it (CUDA reads 1 to 32, default 8). Unset, the field stays unset: the simulator's 1, or 32 under
    the EP A2A overlap (sim.spec.parallel.cuda_device_max_connections), which is what Megatron-LM runs (arguments.py
    asserts 1 under tensor or context parallelism before Blackwell unless the overlap or FSDP is on). The rules
    refuse 1 with the overlap (sim.spec.rules_moe), blamed on this variable."""
    if not args.has(CONNECTIONS):
        return
    raw = args.get(CONNECTIONS)
    written = str(raw).strip()
    if isinstance(raw, bool) or not re.fullmatch(r"[0-9]+", written) or int(written) < 1:
        raise refuse(f"{args.source(CONNECTIONS)}: {raw!r} is not a positive whole number (the hardware work queues "
                     "the CUDA streams share; CUDA takes 1 to 32)")
    draft.put("parallel.cuda_device_max_connections", int(written), args.source(CONNECTIONS), raw,
              "hardware work queues: 1 launches kernels in issue order (Megatron's TP backward overlap), more lets "
              "streams run concurrently (the EP A2A overlap)")


# Megatron-LM's --cp-comm-type (arguments.py, one value for every layer; passed to Transformer Engine's attention,
# which checks p2p / all_gather / a2a / a2a+p2p) -> parallel.cp_comm_type; 'a2a+p2p' (hierarchical: Ulysses inside
# a node, a ring across) is not modelled.
CP_COMM_TYPES = {"p2p": "p2p", "all_gather": "all_gather", "a2a": "a2a"}


def _cp_comm_type(draft: Draft, args: Args, cp: int) -> None:
    """``--cp-comm-type`` (with context parallelism, ``cp`` > 1) -> ``parallel.cp_comm_type``; a value it cannot
    model is refused in one line naming the flag; without context parallelism it is ignored."""
    if not args.has("cp_comm_type"):
        return
    raw = args.get("cp_comm_type")
    if cp == 1:
        draft.row(args.source("cp_comm_type"), args.raw("cp_comm_type"), "ignored", "no context parallelism (cp 1)")
        return
    values = {str(value) for value in raw} if isinstance(raw, list) else {str(raw)}
    if len(values) != 1 or next(iter(values)) not in CP_COMM_TYPES:
        raise refuse(f"{args.source('cp_comm_type')}: {' '.join(sorted(values))} is not modelled (one of "
                     f"{', '.join(CP_COMM_TYPES)} for every layer)")
    draft.put("parallel.cp_comm_type", CP_COMM_TYPES[next(iter(values))], args.source("cp_comm_type"),
              args.raw("cp_comm_type"))


# TE userbuffers' pipelined reduce-scatters after the two row-parallel GEMMs (attention's output projection, the
# MLP's FC2) in a userbuffers config, the ub_cfgs Transformer Engine's initialize_ub reads (NeMo's
# model.ub_tp_comm_overlap_cfg; Megatron-LM's --tp-comm-overlap-cfg YAML, megatron/training/initialize.py
# _initialize_tp_communicators): each one's num_sm (the SMs its reduce-scatter takes, set_sm_margin) and num_splits
# (its chunks). NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_*.yaml: bf16
# proj_fprop num_sm 24, fc2_fprop 16 or 20, both method pipeline, num_splits 4 at tp 2, 4 and 8.
USERBUFFERS_ROW_GEMMS = ("proj_fprop", "fc2_fprop")
USERBUFFERS_FIELDS = {"num_sm": ("parallel.tp_comm_overlap_sms", "the SMs its reduce-scatter takes"),
                      "num_splits": ("parallel.tp_comm_overlap_chunks", "the chunks of its reduce-scatter")}


def te_userbuffers_default(method: str) -> dict[str, Any]:
    """Transformer Engine's settings for a userbuffers GEMM of ``method`` whose config entry omits them
    (transformer_engine/pytorch/module/base.py ``initialize_ub``, ``get_default_config``, TE 2.0 to d0067d0da; the
    entry's keys update this dict): ``num_sm`` 1 for a ring exchange, else 16; ``set_sm_margin`` for all but a ring
    exchange; ``num_splits`` 4 (a ring exchange: tp, one per peer, left to the field's default here). The row
    GEMMs' own method, without an entry, is ``pipeline``. (TE 1.x read the same num_sm and num_splits defaults and
    set_sm_margin 0 for every method.)"""
    ring = method == "ring_exchange"
    return {"num_sm": 1 if ring else 16, "set_sm_margin": not ring, "num_splits": None if ring else 4}


def apply_userbuffers(draft: Draft, flat: dict[str, Any], prefix: str) -> set[str]:
    """A userbuffers config's row-GEMM settings (``flat``: the config flattened, its keys ``prefix`` +
    ``proj_fprop.num_sm`` and the like) -> ``parallel.tp_comm_overlap_sms`` and ``parallel.tp_comm_overlap_chunks``
    (sim.workload.tp_overlap.tp_overlap_sms, tp_overlap_chunks); nothing where no key starts with ``prefix`` (no config:
    the fields' defaults). Each row GEMM runs its entry over TE's defaults for its method
    (``te_userbuffers_default``), so a key the entry omits, or a row GEMM with no entry, prices TE's value,
    reported as a default. The SMs taken from the GEMM are ``num_sm`` with ``set_sm_margin``, else 0 (TE
    comm_gemm_overlap.cpp: the GEMM keeps every SM without the margin). The simulator prices both row GEMMs with
    one count of each, so two different counts give their mean (NeMo's H100 configs: num_sm 24 and 16 -> 20).
    ``num_splits`` counts only where the GEMM's method is ``pipeline`` (a ``ring_exchange`` runs one chunk per TP
    peer: the field's default, tp). Returns the keys read."""
    if not any(key.startswith(prefix) for key in flat):
        return set()
    read: set[str] = set()
    values: dict[str, list[tuple[str, int, bool]]] = {name: [] for name in USERBUFFERS_FIELDS}
    for gemm in USERBUFFERS_ROW_GEMMS:
        method = str(flat.get(f"{prefix}{gemm}.method", "pipeline"))
        settings = te_userbuffers_default(method)
        given: set[str] = set()
        for key in ("num_sm", "set_sm_margin", "num_splits"):
            value = flat.get(f"{prefix}{gemm}.{key}")
            if value is None:
                continue
            if not isinstance(value, int) or (isinstance(value, bool) and key != "set_sm_margin"):
                raise refuse(f"{prefix}{gemm}.{key}: expected a whole number (got {value!r})")
            settings[key], given = value, given | {key}
            read.add(f"{prefix}{gemm}.{key}")
        if f"{prefix}{gemm}.method" in flat:
            read.add(f"{prefix}{gemm}.method")
        # without the margin the GEMM keeps every SM: that row names set_sm_margin
        margin = bool(settings["set_sm_margin"])
        source = f"{prefix}{gemm}." + ("num_sm" if margin or "set_sm_margin" not in given else "set_sm_margin")
        values["num_sm"].append((source, settings["num_sm"] if margin else 0,
                                 "num_sm" in given or "set_sm_margin" in given))
        if method == "pipeline":
            values["num_splits"].append((f"{prefix}{gemm}.num_splits", settings["num_splits"], "num_splits" in given))
    for name, (target, what) in USERBUFFERS_FIELDS.items():
        found = values[name]
        if not found:
            continue
        value = round(sum(count for _, count, _ in found) / len(found))
        note = f"{what}: " + ("mean of " if len(found) > 1 else "") + ", ".join(
            f"{key.removeprefix(prefix).split('.')[0]} {count}" for key, count, _ in found)
        for key, count, mapped in found:  # one row per row GEMM, each naming the field it sets
            draft.put(target, value, key, count, note + ("" if mapped else " (TE's default for the method)"),
                      "mapped" if mapped else "default")
    return read


def _userbuffers_file(draft: Draft, args: Args, inputs: list[str]) -> None:
    """``--tp-comm-overlap-cfg FILE``: the YAML the script writes (or the file beside it) read by
    ``apply_userbuffers``, its keys reported as ``FILE: gemm.key``; a file not found is reported, not refused."""
    name = args.get("tp_comm_overlap_cfg")
    if name is None:
        return
    text = read_file_argument(inputs, str(name))
    if text is None:
        draft.row(args.source("tp_comm_overlap_cfg"), name, "ignored", "the file is not in the script nor beside "
                  "it: TE's userbuffers defaults assumed")
        return
    cfg = parse_yaml(text, f"{args.source('tp_comm_overlap_cfg')} {name}")
    if not isinstance(cfg, dict):
        raise refuse(f"{args.source('tp_comm_overlap_cfg')}: {name} is not a mapping of GEMM names to settings")
    flat = {f"{name}: {gemm}.{key}": value for gemm, settings in cfg.items() if isinstance(settings, dict)
            for key, value in settings.items()}
    read = apply_userbuffers(draft, flat, f"{name}: ")
    for key, value in flat.items():
        if key not in read:
            draft.row(key, value, "ignored", "a userbuffers setting the simulator does not price")


def leftovers(draft: Draft, args: Args, harmless: tuple[str, ...] = HARMLESS_PREFIXES,
              notes: dict[str, str] | None = None) -> None:
    """Every argument the mapping did not read: ignored (harmless) or unknown."""
    notes = {**HARMLESS_NOTE, **(notes or {})}
    for dest, (_, source, raw) in args.values.items():
        if dest in args.read:
            continue
        if dest in TORCHRUN:
            draft.row(source, raw, "ignored", "the launcher's rendezvous")
        elif dest.startswith(harmless):
            note = next((said for prefix, said in notes.items() if dest.startswith(prefix)),
                        "does not change one step's time or memory")
            draft.row(source, raw, "ignored", note)
        elif dest.isupper():
            draft.row(source, raw, "unknown", "an environment variable clustersim does not read")
        else:
            draft.row(source, raw, "unknown", "not read by clustersim")



def _loss(draft: Draft, args: Args) -> None:
    """training.cross_entropy from Megatron-LM's --cross-entropy-loss-fusion: the flag is opt-in (arguments.py,
    default False), and without it Megatron-Core's compute_language_model_loss runs the unfused
    VocabParallelCrossEntropy (language_module.py at 1e05700595), priced kernel by kernel as ``megatron``
    (docs/mechanisms/loss_head.md). Only for Megatron-LM scripts: NeMo's default is the fused loss
    (sim.interop.nemo reads its own key)."""
    dest = "cross_entropy_loss_fusion"
    fused = args.flag(dest)
    draft.put("training.cross_entropy", "fused" if fused else "megatron", args.source(dest),
              args.raw(dest) if args.has(dest) else None,
              "Megatron-Core's fused vocab-parallel loss" if fused else "no --cross-entropy-loss-fusion: Megatron-"
              "Core's unfused VocabParallelCrossEntropy, kernel by kernel",
              "mapped" if args.has(dest) else "default")


def import_megatron(inputs: list[str], options: Options) -> Draft:
    draft = Draft("megatron")
    draft.data["name"] = options.name or "megatron-import"
    args = Args()
    launch = read_launch(inputs)
    for dest, value, flag in parse_tokens(launch.tokens):
        if dest in NEGATED:
            args.add(NEGATED[dest], False, flag, True)
        else:
            args.add(dest.replace("nproc-per-node", "nproc_per_node"), value, flag)
    for name, value in launch.environment.items():  # read under their own names (upper case: no flag's dest)
        args.add(name, value, name)
    if CONNECTIONS in launch.variables and CONNECTIONS not in launch.environment:
        draft.row(CONNECTIONS, launch.variables[CONNECTIONS], "ignored", "set but not exported: the launched "
                  "process does not see it")
    world: dict[str, tuple[int, str]] = {}
    for dest, key in (("nnodes", "nodes"), ("nproc_per_node", "per_node")):
        if args.has(dest):
            value = args.int(dest)
            if value is not None:
                world[key] = (value, args.source(dest))
    apply(draft, args, options, world)
    _loss(draft, args)
    _userbuffers_file(draft, args, inputs)
    leftovers(draft, args)
    return draft
