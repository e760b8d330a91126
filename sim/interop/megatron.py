"""Megatron-LM's ``pretrain_gpt.py`` arguments -> a scenario (and the mapping NeMo shares).

In: a launch script (bash: variables, arrays, ``torchrun ... pretrain_gpt.py ...``) or an argument list, and the
command line's ``Options``. Out: a ``Draft`` whose report lists every flag. Flag names, defaults and the rules
refused are Megatron-LM's (megatron/training/arguments.py, core_r0.x): e.g. ``--fp16`` with ``--bf16``,
``--num-layers-per-virtual-pipeline-stage`` with ``--num-virtual-stages-per-pipeline-rank``,
``--overlap-param-gather`` without ``--use-distributed-optimizer`` and ``--overlap-grad-reduce``, and
``--recompute-method`` with selective recompute are each one line naming the flag.

The mapping itself (``apply``) reads argument *destinations* (``tensor_model_parallel_size``), so NeMo's
configuration, whose model keys are the same names, goes through it too (sim.interop.nemo).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.interop.draft import Draft, ModelDraft, Options, Status, cluster, refuse
from sim.spec.scenario import ParallelSpec, read_text

# Flags that take no value (store_true / store_false in arguments.py), so the next token is not theirs.
BOOL_FLAGS = frozenset({
    "sequence_parallel", "group_query_attention", "swiglu", "squared_relu", "use_distributed_optimizer",
    "overlap_grad_reduce", "overlap_param_gather", "bf16", "fp16", "untie_embeddings_and_output_weights",
    "disable_bias_linear", "use_flash_attn", "grad_reduce_in_bf16", "no_overlap_p2p_communication",
    "no_align_param_gather", "tp_comm_overlap", "enable_cuda_graph", "external_cuda_graph", "fp8_param_gather",
    "qk_layernorm", "add_qkv_bias", "moe_grouped_gemm", "use_mcore_models", "mock_data", "apply_layernorm_1p",
    "cross_entropy_loss_fusion", "manual_gc", "calculate_per_token_loss", "no_masked_softmax_fusion",
    "no_create_attention_mask_in_dataloader", "no_mmap_bin_files", "log_throughput", "profile", "no_load_optim",
    "no_load_rng", "no_position_embedding", "moe_pad_expert_input_to_capacity", "use_legacy_models",
    "overlap_param_gather_with_optimizer_step", "no_gradient_accumulation_fusion", "no_bias_swiglu_fusion",
    "no_bias_gelu_fusion", "no_bias_dropout_fusion", "no_rope_fusion", "fp8_dot_product_attention",
    "log_timers_to_tensorboard", "log_memory_to_tensorboard", "log_validation_ppl_to_tensorboard",
    "use_rotary_position_embeddings", "accumulate_allreduce_grads_in_fp32", "ckpt_fully_parallel_load",
    "use_dist_ckpt", "async_save", "moe_router_pre_softmax", "no_persist_layer_norm", "log_params_norm",
    "log_num_zeros_in_grad", "use_cpu_initialization", "distribute_saved_activations", "use_torch_fsdp2",
    "use_precision_aware_optimizer",
})
# store_false flags: the destination they clear.
NEGATED = {"no_overlap_p2p_communication": "overlap_p2p_comm", "no_align_param_gather": "align_param_gather",
           "disable_bias_linear": "add_bias_linear", "no_position_embedding": "add_position_embedding",
           "no_gradient_accumulation_fusion": "gradient_accumulation_fusion"}
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
    "moe_grouped_gemm", "cross_entropy_loss_fusion", "no_masked_softmax_fusion", "attention_softmax_in_fp32",
    "fp8_param_gather", "clip_grad", "add_position_embedding", "bias_swiglu", "no_bias_", "no_rope_fusion",
    "enable_one_logger",
)
HARMLESS_NOTE = {
    "rampup_batch_size": "a batch-size ramp: the steady-state --global-batch-size is simulated",
    "step_batch_size_schedule": "a batch-size schedule: the steady-state --global-batch-size is simulated",
    "fp8_param_gather": "FP8 weights gathered by the distributed optimizer: its all-gather bytes are not halved "
                        "in the simulation (bf16 bytes)",
    "cross_entropy_loss_fusion": "the loss kernel's fusion: not priced apart",
    "moe_grouped_gemm": "grouped GEMMs are what the simulator prices for experts",
}
SHELL_WORDS = frozenset({"(", ")", "[[", "]]", "[", "]", "then", "fi", "else", "do", "done", ";", "&&", "||",
                         "\\", "|"})


def script_tokens(source: str) -> list[str]:
    """A bash launch script's words, with its simple ``NAME=value`` variables (``${NAME:-default}`` too)
    substituted, and quoted array entries such as ``"--fp8-format hybrid"`` split into flag and value."""
    source = source.replace("\\\n", " ")
    env: dict[str, str] = {}

    def substitute(line: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(3)
            default = match.group(2)
            if name in env:
                return env[name]
            return default.strip("\"'") if default is not None else match.group(0)
        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, line)

    lines = []
    for line in source.splitlines():
        line = substitute(line)
        assign = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=([^(\s][^#]*|)\s*(?:#.*)?$", line)
        if assign:
            value = assign.group(2).strip()
            try:
                words = shlex.split(value)
            except ValueError:
                words = [value]
            env[assign.group(1)] = words[0] if len(words) == 1 else value
            continue
        lines.append(line)
    try:
        words = shlex.split("\n".join(lines), comments=True)
    except ValueError as error:
        raise refuse(f"script: cannot read it as bash words ({error})") from None
    tokens: list[str] = []
    for word in words:
        if word.startswith("--") and " " in word.strip():
            tokens.extend(word.split())
        else:
            tokens.append(word)
    return tokens


def parse_tokens(tokens: list[str]) -> list[tuple[str, Any, str]]:
    """``--flag value`` / ``--flag=value`` / ``--bool-flag`` -> (destination, value, flag as written), in order."""
    parsed: list[tuple[str, Any, str]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("--") or token == "--":
            continue
        flag, _, inline = token.partition("=")
        dest = flag[2:].replace("-", "_")
        if inline:
            parsed.append((dest, inline, flag))
            continue
        if dest in BOOL_FLAGS:
            parsed.append((dest, True, flag))
            continue
        following = tokens[index] if index < len(tokens) else None
        if following is None or following.startswith("--") or following in SHELL_WORDS:
            parsed.append((dest, True, flag))
        else:
            parsed.append((dest, following, flag))
            index += 1
    return parsed


@dataclass
class Args:
    """Argument destinations -> (value, how it was written); which were read."""

    values: dict[str, tuple[Any, str, Any]] = field(default_factory=dict)  # dest -> (value, source, raw)
    read: set[str] = field(default_factory=set)

    def add(self, dest: str, value: Any, source: str, raw: Any = None) -> None:
        self.values[dest] = (value, source, value if raw is None else raw)

    def has(self, dest: str) -> bool:
        return dest in self.values and self.values[dest][0] is not None

    def source(self, dest: str) -> str:
        return self.values[dest][1] if dest in self.values else f"--{dest.replace('_', '-')}"

    def raw(self, dest: str) -> Any:
        return self.values[dest][2] if dest in self.values else None

    def get(self, dest: str, default: Any = None) -> Any:
        self.read.add(dest)
        value = self.values.get(dest, (None, "", None))[0]
        return default if value is None else value

    def flag(self, dest: str, default: bool = False) -> bool:
        value = self.get(dest)
        if value is None:
            return default
        if isinstance(value, str):
            lowered = value.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise refuse(f"{self.source(dest)}: expected true or false (got {value!r})")
            return lowered in ("true", "1", "yes")
        return bool(value)

    def int(self, dest: str, default: int | None = None) -> int | None:
        value = self.get(dest)
        if value is None:
            return default
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise refuse(f"{self.source(dest)}: expected a whole number (got {value!r})") from None
        if number != int(number):
            raise refuse(f"{self.source(dest)}: expected a whole number (got {value!r})")
        return int(number)

    def float(self, dest: str) -> float | None:
        value = self.get(dest)
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise refuse(f"{self.source(dest)}: expected a number (got {value!r})") from None


def _padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM's _vocab_size_with_padding: up to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def apply(draft: Draft, args: Args, options: Options, world: dict[str, tuple[int, str]]) -> None:
    """Megatron's argument destinations -> scenario fields (the rules refused, the defaults written out)."""
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
    _model(draft, args, options, tp, gpus)


def _model(draft: Draft, args: Args, options: Options, tp: int, gpus: int) -> None:
    """The shape flags (with Megatron-LM's defaults where a flag is absent) over ``--model``."""
    model = ModelDraft(draft, options)
    describes = args.has("num_layers") or args.has("hidden_size")

    def shape(key: str, dest: str, value: Any, default: bool = False, note: str = "") -> None:
        model.set(key, value, args.source(dest), args.raw(dest) if args.has(dest) else None, note,
                  "default" if default else "mapped")

    for key, dest in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                      ("num_attention_heads", "num_attention_heads")):
        if args.has(dest):
            shape(key, dest, args.int(dest))
    hidden = model.fields.get("hidden_size")
    if args.flag("swiglu"):
        shape("mlp", "swiglu", "swiglu")
    elif args.flag("squared_relu"):
        shape("mlp", "squared_relu", "squared_relu")
    elif describes:
        shape("mlp", "swiglu", "gelu", True, "no --swiglu: Megatron-LM's GELU MLP")
    if args.has("ffn_hidden_size"):
        shape("ffn_hidden_size", "ffn_hidden_size", args.int("ffn_hidden_size"))
    elif describes and hidden:
        swiglu = model.fields.get("mlp") == "swiglu"
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden  # arguments.py's default
        shape("ffn_hidden_size", "ffn_hidden_size", ffn, True, "Megatron-LM's default for this MLP")
    if args.flag("group_query_attention"):
        groups = args.int("num_query_groups")
        if groups is None:
            raise refuse(f"{args.source('group_query_attention')}: needs --num-query-groups")
        shape("num_kv_heads", "num_query_groups", groups)
    elif args.has("num_query_groups"):
        groups = args.int("num_query_groups")
        heads = model.fields.get("num_attention_heads")
        if draft.framework == "nemo":  # NeMo reads num_query_groups by itself (None: one per head)
            shape("num_kv_heads", "num_query_groups", groups)
        elif groups != heads:
            draft.row(args.source("num_query_groups"), groups, "ignored",
                      "without --group-query-attention Megatron-LM uses one group per head")
    elif describes and args.has("num_attention_heads"):
        shape("num_kv_heads", "num_attention_heads", args.int("num_attention_heads"), True, "multi-head attention")
    if args.has("kv_channels") and hidden and model.fields.get("num_attention_heads"):
        channels = args.int("kv_channels")
        if channels * model.fields["num_attention_heads"] != hidden:
            shape("kv_channels", "kv_channels", channels)
        else:
            draft.row(args.source("kv_channels"), channels, "mapped", "= hidden_size / heads", "model.kv_channels")
    if args.has("normalization"):
        norm = str(args.get("normalization")).lower()
        if norm not in ("layernorm", "rmsnorm"):
            raise refuse(f"{args.source('normalization')}: {norm!r} is not LayerNorm or RMSNorm")
        shape("norm", "normalization", norm)
    elif describes:
        shape("norm", "normalization", "layernorm", True, "Megatron-LM's default LayerNorm")
    if args.has("position_embedding_type"):
        kind = str(args.get("position_embedding_type"))
        if kind not in ("rope", "learned_absolute", "none"):
            raise refuse(f"{args.source('position_embedding_type')}: {kind!r} is not modelled (rope or "
                         "learned_absolute)")
        shape("position_embedding", "position_embedding_type", "rope" if kind != "learned_absolute" else "learned")
    elif describes:
        shape("position_embedding", "position_embedding_type", "learned", True, "Megatron-LM's default "
              "learned_absolute")
    if args.has("untie_embeddings_and_output_weights"):
        shape("tied_embeddings", "untie_embeddings_and_output_weights",
              not args.flag("untie_embeddings_and_output_weights"))
    elif describes:
        shape("tied_embeddings", "untie_embeddings_and_output_weights", True, True, "Megatron-LM ties them")
    if args.has("add_bias_linear"):
        shape("bias", "add_bias_linear", args.flag("add_bias_linear"))
    elif describes:
        shape("bias", "add_bias_linear", True, True, "Megatron-LM's default add_bias_linear")
    if args.flag("qk_layernorm"):
        shape("qk_layernorm", "qk_layernorm", True)
    if args.flag("add_qkv_bias"):
        shape("add_qkv_bias", "add_qkv_bias", True)
    seq = args.int("seq_length")
    if args.has("max_position_embeddings"):
        shape("max_seq_len", "max_position_embeddings", args.int("max_position_embeddings"))
    elif seq is not None and model.fields.get("max_seq_len") is None:
        shape("max_seq_len", "seq_length", seq, note="no --max-position-embeddings: the sequence length")
    divisible = args.int("make_vocab_size_divisible_by", 128) or 128
    vocab = args.int("vocab_size") if args.has("vocab_size") else model.fields.get("vocab_size")
    if vocab is not None and describes:
        padded = _padded_vocab(vocab, divisible, tp)
        source = args.source("vocab_size") if args.has("vocab_size") else f"{model.base_label} (vocabulary)"
        note = (f"{vocab} padded to a multiple of {divisible} x tp {tp} (Megatron-LM's _vocab_size_with_padding)"
                if padded != vocab else f"a multiple of make_vocab_size_divisible_by {divisible} x tp {tp}")
        model.set("vocab_size", padded, source, vocab, note)
    _moe(draft, args, model)
    model.finish()


def _moe(draft: Draft, args: Args, model: ModelDraft) -> None:
    """Megatron-Core's MoE flags: the experts (model fields) and the token dispatcher (moe section)."""
    dest = "num_experts" if args.has("num_experts") else "num_moe_experts"
    for key, field_name in ((dest, "num_moe_experts"), ("moe_router_topk", "moe_router_topk"),
                           ("moe_ffn_hidden_size", "moe_ffn_hidden_size"),
                           ("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")):
        if args.has(key):
            model.set(field_name, args.int(key), args.source(key), args.raw(key))
    if args.has("moe_layer_freq"):
        freq = args.get("moe_layer_freq")
        if isinstance(freq, int) or (isinstance(freq, str) and freq.isdigit()):
            model.set("moe_layer_freq", int(freq), args.source("moe_layer_freq"))
        else:
            raise refuse(f"{args.source('moe_layer_freq')}: only an integer frequency is read (got {freq!r})")
    if args.has("moe_token_dispatcher_type"):
        kind = str(args.get("moe_token_dispatcher_type"))
        if kind not in ("alltoall", "allgather", "flex"):
            raise refuse(f"{args.source('moe_token_dispatcher_type')}: {kind!r} is not modelled (alltoall, "
                         "allgather or flex)")
        backend = str(args.get("moe_flex_dispatcher_backend")) if args.has("moe_flex_dispatcher_backend") else "deepep"
        if kind == "flex" and backend != "deepep":  # Megatron-Core's default backend is deepep
            raise refuse(f"{args.source('moe_flex_dispatcher_backend')}: {backend!r} is not modelled (deepep)")
        draft.put("moe.token_dispatcher", kind, args.source("moe_token_dispatcher_type"))
    if args.has("moe_expert_capacity_factor"):
        draft.put("moe.capacity_factor", args.float("moe_expert_capacity_factor"),
                  args.source("moe_expert_capacity_factor"))
    if args.flag("moe_pad_expert_input_to_capacity"):
        draft.put("moe.pad_to_capacity", True, args.source("moe_pad_expert_input_to_capacity"))
    # EP A2A overlap: the combined 1F1B, which Megatron-Core runs with --delay-wgrad-compute (its wgrad order
    # inside each layer is part of what moe.a2a_overlap models)
    if args.flag("overlap_moe_expert_parallel_comm"):
        draft.put("moe.a2a_overlap", True, args.source("overlap_moe_expert_parallel_comm"))
        args.flag("delay_wgrad_compute")


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
        else:
            draft.row(source, raw, "unknown", "not read by clustersim")


def read_arguments(inputs: list[str]) -> list[str]:
    """``inputs``: one launch script path, or the arguments themselves -> tokens."""
    if len(inputs) == 1 and not inputs[0].startswith("--"):
        return script_tokens(read_text(Path(inputs[0]), "megatron"))
    return [token for item in inputs for token in (item.split() if item.startswith("--") else [item])]


def import_megatron(inputs: list[str], options: Options) -> Draft:
    draft = Draft("megatron")
    draft.data["name"] = options.name or "megatron-import"
    args = Args()
    for dest, value, flag in parse_tokens(read_arguments(inputs)):
        if dest in NEGATED:
            args.add(NEGATED[dest], False, flag, True)
        else:
            args.add(dest.replace("nproc-per-node", "nproc_per_node"), value, flag)
    world: dict[str, tuple[int, str]] = {}
    for dest, key in (("nnodes", "nodes"), ("nproc_per_node", "per_node")):
        if args.has(dest):
            value = args.int(dest)
            if value is not None:
                world[key] = (value, args.source(dest))
    apply(draft, args, options, world)
    leftovers(draft, args)
    return draft


