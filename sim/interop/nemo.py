"""NeMo's training YAML -> a scenario, through Megatron-LM's mapping (NeMo's model keys are Megatron's names).

In: a NeMo 1.x config as the NeMo-Framework-Launcher recipes write it (``trainer:`` devices, num_nodes, precision;
``model:`` the Megatron-Core arguments, ``model.optim`` the distributed optimizer and its overlaps), or a NeMo 2.0
config as NeMo-Run serialises a recipe (``trainer.strategy`` the parallel sizes, ``trainer.strategy.ddp`` the
overlaps, ``trainer.plugins.precision``, ``model.config`` the shape, ``data`` the batch and sequence). OmegaConf's
``${.key}``, ``${a.b}`` and the launcher's ``${multiply:x, y}`` are resolved. Out: a ``Draft``
(sim.interop.megatron.apply does the mapping; this module renames keys and reports the rest).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sim.interop.draft import Draft, Options, refuse
from sim.interop.megatron import CONNECTIONS, apply, apply_userbuffers
from sim.interop.megatron_args import Args
from sim.interop.megatron_model import MlaDefaults
from sim.spec.scenario import parse_yaml, read_text

# NeMo key (NeMo 1.x under model:, NeMo 2.0 under model.config: / trainer.strategy:) -> Megatron destination.
RENAMED = {
    "encoder_seq_length": "seq_length", "seq_length": "seq_length",
    "virtual_pipeline_model_parallel_size": "virtual_pipeline_model_parallel_size",
    "num_moe_experts": "num_experts", "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method", "activations_checkpoint_num_layers": "recompute_num_layers",
    "ub_tp_comm_overlap": "tp_comm_overlap", "overlap_grad_sync": "overlap_grad_reduce",
    "overlap_param_sync": "overlap_param_gather", "gradient_clip_val": "clip_grad",
    "ffn_hidden_size": "ffn_hidden_size", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
    "recompute_granularity": "recompute_granularity", "recompute_method": "recompute_method",
    "recompute_num_layers": "recompute_num_layers", "clip_grad": "clip_grad",
    # Megatron-Core DistributedDataParallelConfig.bucket_size (elements): NeMo 1.x model.optim.ddp_bucket_size
    # (megatron_gpt_model.py setup_mcore_distributed_parallel), NeMo 2.0 trainer.strategy.ddp.bucket_size
    "ddp_bucket_size": "ddp_bucket_size",
}
SAME = frozenset({
    "micro_batch_size", "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "context_parallel_size", "cp_comm_type", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "sequence_parallel",
    "max_position_embeddings", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "make_vocab_size_divisible_by", "moe_router_topk", "moe_token_dispatcher_type",
    "moe_shared_expert_intermediate_size", "overlap_p2p_comm", "overlap_grad_reduce", "overlap_param_gather",
    "align_param_gather", "use_distributed_optimizer", "qk_layernorm", "vocab_size", "bf16", "fp16",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_layer_freq", "attention_backend",
    "moe_router_force_load_balancing",
    # Megatron-Core TransformerConfig names NeMo 2.0 / Megatron-Bridge configs share: the flex dispatcher's backend
    # and SMs, the EP A2A overlap, the pipeline split and the recomputed modules
    "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms", "moe_deepep_num_sms",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "recompute_modules",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "cpu_offloading", "cpu_offloading_num_layers",  # activation offload (TransformerConfig)
    # multi-head latent attention (Megatron-Core MLATransformerConfig; NeMo 2.0's DeepSeekConfig): mla_defaults
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
})
# The MLA widths NeMo builds where its YAML gives none: NeMo 1.x's model.multi_latent_attention builds Megatron-Core's
# MLATransformerConfig from model.* else that class's defaults (nemo/collections/nlp/models/language_modeling/
# megatron_base_model.py build_transformer_config at NVIDIA/NeMo 8cfedd7203; megatron/core/transformer/
# transformer_config.py at Megatron-LM 1e05700595: q/kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64,
# v_head_dim 128); NeMo 2.0's model.config._target_ names the config class, DeepSeekConfig and its V2 / V2-Lite /
# V3 subclasses (nemo/collections/llm/gpt/model/deepseek.py at 8cfedd7203: q_lora_rank 1536, V2-Lite None).
MCORE_MLA: dict[str, int | None] = {"q_lora_rank": 512, "kv_lora_rank": 512, "qk_head_dim": 128,
                                    "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
DEEPSEEK_MLA: dict[str, int | None] = {**MCORE_MLA, "q_lora_rank": 1536}
MLA_CONFIG_CLASSES: dict[str, dict[str, int | None]] = {
    "MLATransformerConfig": MCORE_MLA, "DeepSeekConfig": DEEPSEEK_MLA, "DeepSeekV2Config": DEEPSEEK_MLA,
    "DeepSeekV3Config": DEEPSEEK_MLA, "DeepSeekV2LiteConfig": {**DEEPSEEK_MLA, "q_lora_rank": None}}
# Sections and keys that do not change one step (paths, logging, checkpoints, data, schedules, init, seeds).
HARMLESS = ("run.", "hydra.", "defaults", "exp_manager.", "model.data.", "data.", "model.nsys_profile.",
            "model.optim.sched.", "optim.lr_scheduler.", "model.optim.lr", "model.optim.weight_decay",
            "model.optim.betas", "model.optim.contiguous_", "model.init_method_std", "model.hidden_dropout",
            "model.attention_dropout", "model.ffn_dropout", "model.seed", "model.resume_from_checkpoint",
            "model.layernorm_epsilon", "model.native_amp_", "model.hysteresis", "model.apex_transformer_log_level",
            "model.gc_interval", "model.onnx_safe", "model.use_cpu_initialization", "model.rotary_",
            "model.fp8_margin", "model.fp8_interval", "model.fp8_amax_", "model.fp8_wgrad", "model.pre_process",
            "model.post_process", "model.persist_layer_norm", "model.tokenizer.", "model.mcore_gpt",
            "model.transformer_engine", "model.megatron_amp_O2", "model.rampup_batch_size", "model.apply_query_key",
            "model.grad_div_ar_fusion", "model.gradient_accumulation_fusion", "model.bias_activation_fusion",
            "model.bias_dropout_add_fusion", "model.masked_softmax_fusion", "model.apply_rope_fusion",
            "model.do_layer_norm_weight_decay", "model.use_scaled_init_method", "model.headscale",
            "model.transformer_block_type", "model.openai_gelu", "model.normalize_attention_scores",
            "model.attention_type", "model.sync_batch_comm", "model.batch_p2p_comm", "model.fp32_residual",
            "model.fp16_lm_cross_entropy", "model.grad_allreduce_chunk_size_mb", "model.sharp",
            "model.fsdp_grad_reduce_dtype", "model.fsdp_sharded_checkpoint", "model.num_micro_batches_with_partial",
            "model.activations_checkpoint_layers_per_pipeline", "model.rotary_percentage",
            "model.ub_tp_comm_overlap_cfg", "model.moe_aux_loss_coeff",
            "model.use_emha", "model.moe_router_load_balancing_type", "model.deterministic_mode",
            "trainer.accelerator", "trainer.logger", "trainer.enable_checkpointing", "trainer.use_distributed_sampler",
            "trainer.max_", "trainer.log_every_n_steps", "trainer.val_check_interval", "trainer.limit_",
            "trainer.accumulate_grad_batches", "trainer.num_sanity_val_steps", "trainer.callbacks",
            "trainer._target_", "trainer.strategy._target_", "model._target_", "model.config._target_",
            "optim._target_", "optim.config._target_", "optim.config.lr", "optim.config.weight_decay",
            "optim.config.adam_", "optim.config.min_lr", "optim.config.optimizer", "log.", "resume.", "tokenizer.",
            "trainer.plugins._target_", "model.config.init_method_std", "model.config.hidden_dropout",
            "model.config.attention_dropout", "model.config.layernorm_epsilon", "model.config.rotary_",
            "model.config.seq_length", "trainer.strategy.ckpt_", "trainer.strategy.gradient_as_bucket_view",
            "trainer.strategy.ddp._target_", "trainer.strategy.ddp.check_for_nan_in_grad",
            "trainer.strategy.ddp.grad_reduce_in_fp32", "trainer.strategy.ddp.average_in_collective",
            "trainer.strategy.ddp.data_parallel_sharding_strategy", "trainer.plugins.grad_reduce_in_fp32",
            "trainer.plugins.params_dtype", "trainer.plugins.pipeline_dtype", "trainer.plugins.autocast_enabled",
            # MLA's YaRN RoPE (MLATransformerConfig: rope_type, mscale, beta_fast/slow): the same RoPE kernels
            "model.rope_type", "model.mscale", "model.beta_", "model.config.rope_type", "model.config.mscale",
            "model.config.beta_", "model.mtp_loss_scaling_factor", "model.config.mtp_loss_scaling_factor")
ACTIVATIONS = {"gelu": None, "fast-gelu": None, "openai-gelu": None, "swiglu": "swiglu", "fast-swiglu": "swiglu",
               "squared-relu": "squared_relu"}
PRECISIONS = {"bf16": "bf16", "bf16-mixed": "bf16", "16": "fp16", "16-mixed": "fp16", "fp16": "fp16",
              "fp16-mixed": "fp16", "32": None, "32-true": None}


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict):
                flat.update(_flatten(value, path + "."))
            else:
                flat[path] = value
    return flat


def _resolve(flat: dict[str, Any], key: str, value: Any, depth: int = 0) -> Any:
    """OmegaConf interpolation: ``${.sibling}``, ``${a.b}``, the launcher's ``${multiply:x, y}``; a value that is
    nothing but one interpolation takes the referenced value's type."""
    if not isinstance(value, str) or "${" not in value or depth > 8:
        return value
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""

    def lookup(ref: str) -> Any:
        path = parent + ref[1:] if ref.startswith(".") else ref
        if path not in flat and not ref.startswith("."):
            path = parent + ref  # a NeMo launcher file is the `training` node: ${training.model.x} -> model.x
        path = path.removeprefix("training.")
        return _resolve(flat, path, flat.get(path), depth + 1)

    whole = re.fullmatch(r"\$\{([^${}]+)\}", value.strip())
    if whole and not whole.group(1).startswith("multiply:"):
        return lookup(whole.group(1))
    product = re.fullmatch(r"\$\{multiply:\s*(.+?),\s*(.+)\}", value.strip())
    if product:
        factors = []
        for term in product.groups():
            inner = re.fullmatch(r"\$\{([^${}]+)\}", term.strip())
            factors.append(lookup(inner.group(1)) if inner else term.strip())
        try:
            return int(factors[0]) * int(factors[1])
        except (TypeError, ValueError):
            return value
    return value


def mla_defaults(flat: dict[str, Any], args: Args, read: set[str], model: str) -> MlaDefaults:
    """NeMo's multi-head latent attention: on where ``model.config._target_`` names an MLA config class (NeMo
    2.0's DeepSeek configs; an explicit multi_latent_attention key wins) or ``model.multi_latent_attention`` is
    set (NeMo 1.x), with that class's widths where a key is absent (``MLA_CONFIG_CLASSES``). An explicit
    ``q_lora_rank: null`` is a width here (a full query projection), not NeMo's default. The widths themselves are
    read into ``args`` with the other Megatron names (``SAME``) and mapped by sim.interop.megatron_model."""
    target = str(flat.get("model.config._target_") or "")
    name = target.rsplit(".", 1)[-1]
    widths = MLA_CONFIG_CLASSES.get(name)
    if widths is not None and model + "multi_latent_attention" not in flat:
        args.add("multi_latent_attention", True, "model.config._target_", name)
        read.add("model.config._target_")
    if model + "q_lora_rank" in flat and flat[model + "q_lora_rank"] is None:
        args.add("q_lora_rank", "none", model + "q_lora_rank", "null")
        read.add(model + "q_lora_rank")
    if flat.get(model + "multi_latent_attention", widths is not None):  # a default is reported under NeMo's key
        for dest in MCORE_MLA:
            if model + dest not in flat:
                args.add(dest, None, model + dest)
                args.read.add(dest)
    return MlaDefaults(widths or MCORE_MLA, f"NeMo's default ({name or 'MLATransformerConfig'})")


def import_nemo(inputs: list[str], options: Options) -> Draft:
    if len(inputs) != 1:
        raise refuse("nemo: give one YAML file (the training config)")
    data = parse_yaml(read_text(Path(inputs[0]), "nemo"), f"nemo {inputs[0]}")
    if not isinstance(data, dict):
        raise refuse(f"nemo: {inputs[0]} is not a mapping (trainer:, model:, ...)")
    if isinstance(data.get("training"), dict) and "model" not in data:
        data = data["training"]  # a launcher config with the training node on top
    flat = _flatten(data)
    flat = {key: _resolve(flat, key, value) for key, value in flat.items()}
    draft = Draft("nemo")
    draft.data["name"] = options.name or str((data.get("run") or {}).get("name") or "nemo-import")
    args = Args()
    read: set[str] = set()
    nemo2 = isinstance((data.get("trainer") or {}).get("strategy"), dict)
    # Where each kind of key lives (NeMo 1.x first, then NeMo 2.0).
    sections = ("model.", "model.optim.", "trainer.", "model.config.", "trainer.strategy.",
                "trainer.strategy.ddp.", "data.", "optim.config.", "trainer.plugins.")
    for key, value in flat.items():
        section, _, name = key.rpartition(".")
        if section + "." not in sections or value is None:
            continue
        dest = RENAMED.get(name) or (name if name in SAME else None)
        if name == "bucket_size" and section == "trainer.strategy.ddp":
            dest = "ddp_bucket_size"
        if dest is not None:
            if dest == "clip_grad" and section == "optim.config" and "trainer.gradient_clip_val" in flat:
                continue
            args.add(dest, value, key)
            read.add(key)
    world: dict[str, tuple[int, str]] = {}
    for key, what in (("trainer.num_nodes", "nodes"), ("trainer.devices", "per_node")):
        if isinstance(flat.get(key), int):
            world[what] = (flat[key], key)
            read.add(key)
    precision_key = next((k for k in ("trainer.precision", "trainer.plugins.precision") if flat.get(k) is not None),
                         None)
    if precision_key is not None:
        precision = str(flat[precision_key])
        if precision not in PRECISIONS:
            raise refuse(f"{precision_key}: {precision!r} is not modelled ({', '.join(PRECISIONS)})")
        if PRECISIONS[precision]:
            args.add(str(PRECISIONS[precision]), True, precision_key, precision)
        read.add(precision_key)
    model = "model.config." if nemo2 else "model."
    activation = flat.get(model + "activation")
    if activation is not None:
        if str(activation) not in ACTIVATIONS:
            raise refuse(f"{model}activation: {activation!r} is not modelled ({', '.join(ACTIVATIONS)})")
        kind = ACTIVATIONS[str(activation)]
        if kind:
            args.add(kind, True, model + "activation", activation)
        read.add(model + "activation")
    if flat.get(model + "gated_linear_unit"):  # NeMo 2.0 (Megatron-Core TransformerConfig): SwiGLU
        args.add("swiglu", True, model + "gated_linear_unit")
        read.add(model + "gated_linear_unit")
    norm = flat.get(model + "normalization")
    if norm is not None:
        lowered = str(norm).lower()
        args.add("normalization", "layernorm" if lowered in ("layernorm", "layernorm1p") else lowered,
                 model + "normalization", norm)
        read.add(model + "normalization")
    for key in (model + "bias", model + "add_bias_linear"):
        if flat.get(key) is not None:
            args.add("add_bias_linear", bool(flat[key]), key)
            read.add(key)
    if flat.get(model + "position_embedding_type") is not None:
        args.add("position_embedding_type", flat[model + "position_embedding_type"], model + "position_embedding_type")
        read.add(model + "position_embedding_type")
    share = flat.get(model + "share_embeddings_and_output_weights")
    if share is not None:
        args.add("untie_embeddings_and_output_weights", not share, model + "share_embeddings_and_output_weights", share)
        read.add(model + "share_embeddings_and_output_weights")
    if flat.get(model + "fp8"):
        fmt = "e4m3" if flat.get(model + "fp8_e4m3") and not flat.get(model + "fp8_hybrid") else "hybrid"
        args.add("fp8_format", fmt, model + "fp8", True)
    for key in (model + "fp8", model + "fp8_hybrid", model + "fp8_e4m3"):
        read.add(key)
    optimizer = flat.get("model.optim.name")
    # Who buckets the gradients: Megatron-Core's DDP in NeMo 2.0 and under NeMo 1.x's mcore_distributed_optim (its
    # ddp_bucket_size, else Megatron-Core's default; bucket_cap_mb is not passed on), Apex's DistributedFusedAdam
    # under distributed_fused_adam (bucket_cap_mb MiB of gradients, Apex's default 100).
    mcore_ddp = nemo2 or optimizer == "mcore_distributed_optim"
    if mcore_ddp and "ddp_bucket_size" not in args.values:  # a default is reported under the key NeMo reads
        args.add("ddp_bucket_size", None, "trainer.strategy.ddp.bucket_size" if nemo2 else
                 "model.optim.ddp_bucket_size")
    sync_dtype = flat.get("model.optim.grad_sync_dtype")  # NeMo 1.x: grad_reduce_in_fp32 = (grad_sync_dtype
    if sync_dtype is not None:  # == 'fp32') for Megatron-Core's DDP; Apex's grad_sync_dtype alike
        if str(sync_dtype) in ("bf16", "bfloat16"):
            args.add("grad_reduce_in_bf16", True, "model.optim.grad_sync_dtype", sync_dtype)
        elif str(sync_dtype) not in ("fp32", "float32"):
            raise refuse(f"model.optim.grad_sync_dtype: {sync_dtype!r} is not modelled (fp32, bf16)")
        read.add("model.optim.grad_sync_dtype")
    if optimizer is not None:
        read.add("model.optim.name")
        if optimizer in ("distributed_fused_adam", "mcore_distributed_optim"):
            args.add("use_distributed_optimizer", True, "model.optim.name", optimizer)
            if optimizer == "distributed_fused_adam":  # Apex: each bucket's gather issued as the forward reaches it
                args.add("align_param_gather", False, "model.optim.name", optimizer)
        elif optimizer not in ("fused_adam", "adam", "adamw"):
            raise refuse(f"model.optim.name: {optimizer!r} is not modelled (fused_adam, distributed_fused_adam, "
                         "mcore_distributed_optim)")
    if flat.get("model.use_flash_attention") is False:
        args.add("attention_backend", "unfused", "model.use_flash_attention", False)
    elif flat.get("model.use_flash_attention"):
        args.add("use_flash_attn", True, "model.use_flash_attention")
    read.add("model.use_flash_attention")
    # NeMo-Framework-Launcher exports a config's env_vars into the job (nemo_launcher/core/stages.py get_env_vars);
    # CUDA_DEVICE_MAX_CONNECTIONS among them is mapped with Megatron's (sim.interop.megatron). Where they leave it
    # out, the launcher prefixes CUDA_DEVICE_MAX_CONNECTIONS=1 under tp or cp > 1 without FSDP and CUDA's default
    # (8) runs otherwise (_cuda_device_max_connections): the field stays unset, the simulator's 1 (32 under the EP
    # A2A overlap), the launcher's own under tp > 1; at tp 1 there is no TP collective for the queues to order, so
    # CUDA's 8 prices the same.
    connections = f"env_vars.{CONNECTIONS}"
    if flat.get(connections) is not None:
        args.add(CONNECTIONS, flat[connections], connections)
        read.add(connections)
    tokenizer = flat.get("model.tokenizer.type")
    if tokenizer == "GPT2BPETokenizer" and "vocab_size" not in args.values:
        args.add("vocab_size", 50257, "model.tokenizer.type", tokenizer)  # GPT-2's BPE vocabulary
    apply(draft, args, options, world, mcore_ddp, mla_defaults(flat, args, read, model))
    if flat.get("model.fsdp"):
        strategy = str(flat.get("model.fsdp_sharding_strategy", "full"))
        sharding = {"full": "FULL_SHARD", "hybrid": "HYBRID_SHARD", "grad": "SHARD_GRAD_OP"}.get(strategy)
        if sharding is None:
            raise refuse(f"model.fsdp_sharding_strategy: {strategy!r} is not full, hybrid or grad")
        draft.put("fsdp.sharding", sharding, "model.fsdp", True, f"fsdp_sharding_strategy {strategy}")
        draft.put("parallel.overlap_grad_reduce", True, "model.fsdp", True, "FSDP reduces each unit under the "
                  "backward", "default")
    read.update({"model.fsdp", "model.fsdp_sharding_strategy"})
    if flat.get("model.gradient_as_bucket_view") is not None:
        draft.put("parallel.grad_bucket_view", bool(flat["model.gradient_as_bucket_view"]),
                  "model.gradient_as_bucket_view")
        read.add("model.gradient_as_bucket_view")
    cap = flat.get("model.optim.bucket_cap_mb")
    if cap is not None and mcore_ddp:
        draft.row("model.optim.bucket_cap_mb", cap, "ignored", "Megatron-Core's DDP buckets ddp_bucket_size "
                  "elements; NeMo does not pass bucket_cap_mb to it (megatron_gpt_model.py)")
    elif cap is not None:
        draft.put("parallel.dp_bucket_size", float(cap) * 2**20, "model.optim.bucket_cap_mb", cap, "MiB")
    elif optimizer == "distributed_fused_adam" and draft.get("parallel.overlap_grad_reduce"):
        draft.put("parallel.dp_bucket_size", 100.0 * 2**20, "model.optim.bucket_cap_mb", None,
                  "Apex DistributedFusedAdam's default 100 MiB", "default")
    if draft.get("parallel.dp_bucket_size") is not None or cap is not None:
        read.add("model.optim.bucket_cap_mb")
    read.update(apply_userbuffers(draft, flat, "model.ub_tp_comm_overlap_cfg."))
    # The loss (training.cross_entropy): NeMo hands cross_entropy_loss_fusion to Megatron-Core's TransformerConfig
    # (NeMo 2.0 GPTConfig's field, default True; NeMo 1.x's model key), whose compute_language_model_loss runs the
    # unfused VocabParallelCrossEntropy when it is false (NeMo 2.0's fine-tuning recipes set it so): megatron.
    for key in ("model.cross_entropy_loss_fusion", "model.config.cross_entropy_loss_fusion"):
        fusion = flat.get(key)
        if fusion is None:
            continue
        if not isinstance(fusion, bool):
            raise refuse(f"{key}: expected true or false (got {fusion!r})")
        draft.put("training.cross_entropy", "fused" if fusion else "megatron", key, fusion,
                  "Megatron-Core's fused vocab-parallel loss" if fusion else "Megatron-Core's unfused "
                  "VocabParallelCrossEntropy, kernel by kernel (docs/mechanisms/loss_head.md)")
        read.add(key)
    # DeepSeek-V3's multi-token prediction (Megatron-Core TransformerConfig.mtp_num_layers; NeMo's DeepSeek-V3
    # pretraining recipe sets 1): its extra layer and output head are not simulated, as the HF config's
    # num_nextn_predict_layers is not (sim.model.hf_config)
    for key in ("model.config.mtp_num_layers", "model.mtp_num_layers"):
        if flat.get(key):
            draft.row(key, flat[key], "unmapped", "multi-token prediction: its extra layer and head per step are "
                      "not simulated")
            read.add(key)
    for dest, (_, source, raw) in args.values.items():
        if dest not in args.read:
            draft.row(source, raw, "ignored", "not used with this configuration's other settings")
    for key, value in flat.items():
        if key in read or key in {source for _, source, _ in args.values.values()}:
            continue
        if value is None:
            draft.row(key, value, "ignored", "null: the framework's default")
        elif key.startswith(HARMLESS) or key == "model.tokenizer.type":
            draft.row(key, value, "ignored", "does not change one step's time or memory")
        else:
            draft.row(key, value, "unknown", "not read by clustersim")
    return draft

