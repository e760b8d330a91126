"""A DeepSpeed ``ds_config.json`` (with the Hugging Face Trainer's arguments) -> a scenario.

In: the JSON file, then the training script's arguments as the HF Trainer reads them (``--per_device_train_batch_size
4 --gradient_accumulation_steps 8 --bf16 --gradient_checkpointing``; the ``deepspeed``/``torchrun`` launcher's
``--num_gpus``/``--num_nodes``/``--nproc_per_node``/``--nnodes`` too), and the ``Options`` (``--model`` is
required: a ds_config has no model). Out: a ``Draft`` whose scenario carries DeepSpeed's own ``zero_optimization``
block (sim.spec.scenario reads it: stage, bucket sizes, offload, ``overlap_comm``).

``"auto"`` is resolved as the HF Trainer resolves it (transformers integrations/deepspeed.py,
``HfTrainerDeepSpeedConfig.trainer_config_process`` / ``trainer_config_finalize``): the micro-batch from
``per_device_train_batch_size`` (TrainingArguments default 8), accumulation from ``gradient_accumulation_steps``
(1), ``train_batch_size`` = world size x both, ``gradient_clipping`` from ``max_grad_norm`` (1.0),
``fp16/bf16.enabled`` from ``--fp16``/``--bf16``, and from the model's hidden size h: ``reduce_bucket_size`` =
h^2, ``stage3_prefetch_bucket_size`` = 0.9 h^2, ``stage3_param_persistence_threshold`` = 10 h. An ``"auto"`` the
Trainer does not fill is refused naming its key. DeepSpeed's batch rule (train_batch_size = micro-batch x
accumulation x world size, runtime/config.py ``_batch_assertion``) is checked, and the world size derived from it
when no GPU count is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.interop.draft import Draft, ModelDraft, Options, cluster, refuse, text
from sim.interop.megatron_args import Args, parse_tokens
from sim.model.presets import MODEL_PRESETS
from sim.spec.scenario import read_text

# TrainingArguments defaults (transformers training_args.py) for the values "auto" takes.
HF_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "max_grad_norm": 1.0}
# zero_optimization keys that do not change one step's time or memory here, with why.
ZERO_HARMLESS = {
    "contiguous_gradients": "gradient copies into a contiguous buffer (fragmentation, not time)",
    "sub_group_size": "the optimizer step's sub-groups (matters for NVMe offload)",
    "stage3_max_reuse_distance": "when a gathered parameter is kept for reuse (not modelled: refetched)",
    "stage3_gather_16bit_weights_on_model_save": "checkpoint saving",
    "round_robin_gradients": "gradient partition order across ranks (CPU offload)",
    "allgather_partitions": "true: all-gather (the modelled collective)",
    "reduce_scatter": "true: reduce-scatter (the modelled collective)",
    "elastic_checkpoint": "checkpoint format", "load_from_fp32_weights": "checkpoint loading",
    "ignore_unused_parameters": "error handling", "legacy_stage1": "an old code path",
    "memory_efficient_linear": "a memory-saving linear (same FLOPs)",
}
TOP_HARMLESS = ("optimizer", "scheduler", "steps_per_print", "wall_clock_breakdown", "tensorboard", "wandb",
                "csv_monitor", "comms_logger", "flops_profiler", "zero_allow_untested_optimizer",
                "zero_force_ds_cpu_optimizer", "prescale_gradients", "gradient_predivide_factor", "dump_state",
                "checkpoint", "data_types", "seed", "amp")
# HF Trainer / launcher arguments read here; the rest of the script's arguments are listed as ignored or unknown.
TRAINER_HARMLESS = ("output_dir", "model_name_or_path", "dataset", "train_file", "validation_file", "learning_rate",
                    "lr_scheduler_type", "warmup", "weight_decay", "adam_", "num_train_epochs", "max_steps",
                    "logging", "save", "eval", "report_to", "run_name", "seed", "do_train", "do_eval",
                    "overwrite_output_dir", "per_device_eval_batch_size", "dataloader", "push_to_hub", "hub_",
                    "deepspeed", "master_addr", "master_port", "node_rank", "local_rank", "include", "exclude",
                    "hostfile", "tokenizer_name", "cache_dir", "preprocessing_num_workers", "remove_unused_columns",
                    "load_best_model_at_end", "metric_for_best_model", "trust_remote_code", "torch_dtype",
                    "use_fast_tokenizer", "streaming", "config_name")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path, "deepspeed"))
    except json.JSONDecodeError as error:
        raise refuse(f"deepspeed: {path} is not valid JSON (line {error.lineno}: {error.msg})") from None
    if not isinstance(data, dict):
        raise refuse(f"deepspeed: {path} is not a JSON object")
    return data


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise refuse(f"{key}: expected a number (got {value!r})")
    try:
        return float(value)
    except ValueError:
        raise refuse(f"{key}: expected a number or \"auto\" (got {value!r})") from None


def _enabled(config: dict[str, Any], section: str, trainer: Args, flag: str) -> tuple[bool, str]:
    block = config.get(section)
    if block is None:  # accelerate adds the section for --bf16/--fp16 (DeepSpeedPlugin.set_mixed_precision)
        given = trainer.flag(flag)
        return given, f"no {section} section; --{flag} {'given: accelerate adds it' if given else 'not given'}"
    value = block.get("enabled", True) if isinstance(block, dict) else block
    if value == "auto":
        return trainer.flag(flag), f"\"auto\": --{flag} {'given' if trainer.flag(flag) else 'not given'}"
    if not isinstance(value, bool):
        raise refuse(f"{section}.enabled: expected true, false or \"auto\" (got {value!r})")
    return value, ""


def import_deepspeed(inputs: list[str], options: Options) -> Draft:
    path = Path(inputs[0])
    config = _read_json(path)
    trainer = Args()
    for dest, value, flag in parse_tokens(inputs[1:]):
        trainer.add(dest.replace("-", "_"), value, flag)
    draft = Draft("deepspeed")
    draft.data["name"] = options.name or "deepspeed-import"
    if trainer.has("fsdp") and str(trainer.get("fsdp")).strip() not in ("", "False", "false"):
        raise refuse(f"{trainer.source('fsdp')}: the HF Trainer runs DeepSpeed ({path.name}) or FSDP, not both")
    if "fsdp" in config:
        raise refuse("fsdp: a DeepSpeed config with an fsdp block; a run uses DeepSpeed ZeRO or FSDP, not both")
    if not options.model:
        raise refuse("--model: a DeepSpeed config has no model; give --model PRESET or --model config.json")
    ModelDraft(draft, options).finish()
    seen: set[str] = set()

    def hf(name: str) -> tuple[Any, str]:
        """A TrainingArguments value: given, or its default (and which)."""
        if trainer.has(name):
            return trainer.get(name), trainer.source(name)
        return HF_DEFAULTS[name], f"--{name} (HF default)"

    # Batch: micro-batch, accumulation, global batch (DeepSpeed's rule), world size.
    def resolve(key: str, hf_name: str) -> tuple[int | None, str]:
        seen.add(key)
        value = config.get(key)
        if value == "auto":
            given, source = hf(hf_name)
            number = int(_number(source, given))
            draft.row(key, "auto", "mapped", f"\"auto\" = {source} {number}", "")
            return number, f"{key} (\"auto\" = {source})"
        if value is None:
            return None, key
        return int(_number(key, value)), key

    micro, micro_source = resolve("train_micro_batch_size_per_gpu", "per_device_train_batch_size")
    accumulation, accumulation_source = resolve("gradient_accumulation_steps", "gradient_accumulation_steps")
    seen.add("train_batch_size")
    global_value = config.get("train_batch_size")
    world: tuple[int, str] | None = None
    per_node = nodes = None
    for dest, what in (("num_gpus", "per_node"), ("nproc_per_node", "per_node"), ("num_nodes", "nodes"),
                       ("nnodes", "nodes")):
        if trainer.has(dest):
            found = (trainer.int(dest) or 1, trainer.source(dest))
            per_node, nodes = (found, nodes) if what == "per_node" else (per_node, found)
    if global_value not in (None, "auto") and micro and accumulation and not (options.gpus or options.nodes or nodes):
        total = int(_number("train_batch_size", global_value))
        if total % (micro * accumulation):
            raise refuse(f"train_batch_size: {total} is not a multiple of train_micro_batch_size_per_gpu x "
                         f"gradient_accumulation_steps = {micro * accumulation}")
        world = (total // (micro * accumulation), "train_batch_size / (micro-batch x accumulation)")
    gpus = cluster(draft, options, nodes, per_node, world)
    if micro is None:
        if global_value in (None, "auto") or accumulation is None:
            raise refuse("train_micro_batch_size_per_gpu: give it (or \"auto\" with --per_device_train_batch_size)")
        micro = int(_number("train_batch_size", global_value)) // (accumulation * gpus)
    if accumulation is None:
        accumulation = 1 if global_value in (None, "auto") else \
            int(_number("train_batch_size", global_value)) // (micro * gpus)
    expected = micro * accumulation * gpus
    if global_value not in (None, "auto") and int(_number("train_batch_size", global_value)) != expected:
        raise refuse(f"train_batch_size: {global_value} != train_micro_batch_size_per_gpu {micro} x "
                     f"gradient_accumulation_steps {accumulation} x {gpus} GPUs = {expected} (DeepSpeed asserts it)")
    draft.put("training.micro_batch", micro, micro_source, micro)
    draft.put("training.global_batch", expected, "train_batch_size", global_value if global_value is not None
              else "", f"micro-batch {micro} x accumulation {accumulation} x {gpus} GPUs")
    # Precision.
    fp16, fp16_note = _enabled(config, "fp16", trainer, "fp16")
    bf16, bf16_note = _enabled(config, "bf16", trainer, "bf16")
    seen.update({"fp16", "bf16"})
    if fp16 and bf16:
        raise refuse("bf16.enabled: cannot be combined with fp16.enabled (DeepSpeed takes one)")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    note = bf16_note if bf16 else fp16_note if fp16 else f"neither enabled ({fp16_note}; {bf16_note}): fp32"
    draft.put("training.dtype", dtype, "bf16" if bf16 else "fp16", text(bf16 if bf16 else fp16), note)
    if "communication_data_type" in config:
        seen.add("communication_data_type")
        kind = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "float32": "fp32", "float16": "fp16",
                "bfloat16": "bf16"}.get(str(config["communication_data_type"]))
        if kind is None:
            raise refuse(f"communication_data_type: {config['communication_data_type']!r} is not fp32, fp16 or bf16")
        draft.put("training.grad_dtype", kind, "communication_data_type")
    # Clipping (DeepSpeed's default: none).
    seen.add("gradient_clipping")
    clip = config.get("gradient_clipping")
    if clip == "auto":
        value, source = hf("max_grad_norm")
        draft.put("training.clip_grad", float(_number(source, value)), "gradient_clipping", "auto",
                  f"\"auto\" = {source}")
    elif clip is not None:
        draft.put("training.clip_grad", _number("gradient_clipping", clip), "gradient_clipping")
    else:
        draft.put("training.clip_grad", 0.0, "gradient_clipping", "", "DeepSpeed's default: no clipping", "default")
    _zero(draft, config, seen, options)
    _trainer(draft, trainer)
    for key, value in config.items():
        if key in seen:
            continue
        if key in TOP_HARMLESS:
            draft.row(key, value, "ignored", "does not change one step's time or memory (Adam is assumed)")
        elif key == "activation_checkpointing":
            draft.row(key, value, "unmapped", "DeepSpeed's activation checkpointing API (partitioned / CPU "
                      "checkpoints) is not modelled; --gradient_checkpointing is read as full recompute")
        else:
            draft.row(key, value, "unknown", "not read by clustersim")
    return draft


def _hidden(options: Options) -> int:
    """The model's hidden size, which the HF Trainer's ZeRO "auto" values scale with."""
    if options.model and options.model.endswith(".json"):
        config = json.loads(read_text(Path(options.model), "--model"))
        return int(config.get("hidden_size") or config.get("n_embd") or 0)
    spec = {name.lower(): spec for name, spec in MODEL_PRESETS.items()}.get(str(options.model).lower())
    return spec.hidden_size if spec is not None else 0


def _zero(draft: Draft, config: dict[str, Any], seen: set[str], options: Options) -> None:
    """``zero_optimization`` -> the scenario's zero_optimization block (auto values resolved)."""
    seen.add("zero_optimization")
    block = config.get("zero_optimization")
    if block is None:
        draft.row("zero_optimization", "", "default", "none: ZeRO stage 0 (DeepSpeed's data parallelism)",
                  "parallel.zero = 0")
        return
    if not isinstance(block, dict):
        raise refuse("zero_optimization: expected an object like {\"stage\": 2}")
    stage = block.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise refuse(f"zero_optimization.stage: {stage!r} is not 0, 1, 2 or 3")
    out: dict[str, Any] = {"stage": stage}
    draft.row("zero_optimization.stage", stage, "mapped", "", f"parallel.zero = {stage}")
    hidden = _hidden(options)
    autos = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
             "stage3_param_persistence_threshold": 10 * hidden}
    passed = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_max_live_parameters")
    for key, value in block.items():
        where = f"zero_optimization.{key}"
        if key == "stage":
            continue
        if key in passed:
            if value == "auto":
                if key != "reduce_bucket_size" and stage != 3:
                    draft.row(where, value, "ignored", "a ZeRO-3 setting")
                    continue
                if not hidden:
                    raise refuse(f"{where}: \"auto\" needs the model's hidden size (give --model)")
                out[key] = autos[key]
                note = {"reduce_bucket_size": "h^2", "stage3_prefetch_bucket_size": "0.9 h^2",
                        "stage3_param_persistence_threshold": "10 h"}[key]
                draft.row(where, value, "mapped", f"\"auto\" = {note} (h = {hidden}), as the HF Trainer fills it",
                          f"deepspeed.{key} = {out[key]}")
            else:
                out[key] = _number(where, value)
                draft.row(where, value, "mapped", "elements", f"deepspeed.{key} = {text(out[key])}")
        elif key == "overlap_comm":
            if not isinstance(value, bool):
                raise refuse(f"{where}: expected true or false (got {value!r})")
            out[key] = value
            draft.row(where, value, "mapped", "false: each gradient reduction runs on the compute stream, so the "
                      "backward waits for it (DeepSpeed's stage_1_and_2.py / stage3.py)" if not value else "",
                      f"parallel.overlap_grad_reduce = {text(value)}")
        elif key in ("offload_optimizer", "offload_param"):
            device = value.get("device", "none") if isinstance(value, dict) else value
            if device not in ("cpu", "none", None):
                raise refuse(f"{where}.device: {device!r} offload is not modelled (cpu or none)")
            out[key] = {"device": device or "none"}
            draft.row(f"{where}.device", device, "mapped", "", f"offload.{'optimizer' if 'optim' in key else 'params'}"
                      f" = {text(device == 'cpu')}")
        elif key in ZERO_HARMLESS:
            if key in ("allgather_partitions", "reduce_scatter") and value is False:
                draft.row(where, value, "unmapped", "false: an all-reduce / broadcast instead; simulated as the "
                          "reduce-scatter / all-gather")
            else:
                draft.row(where, value, "ignored", ZERO_HARMLESS[key])
        elif key == "allgather_bucket_size":
            draft.row(where, value, "unmapped", "ZeRO-1/2's weight all-gather is simulated in one piece per bucket "
                      "of the gradient buckets")
        else:
            draft.row(where, value, "unknown", "not read by clustersim")
    if "overlap_comm" not in block:
        draft.row("zero_optimization.overlap_comm", "", "default", "DeepSpeed's default: true at stage 3, false "
                  "at stages 1-2 (zero/config.py overlap_comm_valid)", f"parallel.overlap_grad_reduce = "
                  f"{text(stage == 3)}")
    draft.data["zero_optimization"] = out


def _trainer(draft: Draft, trainer: Args) -> None:
    """The training script's own arguments: sequence length, recompute, attention kernel; the Trainer's eager
    kernels and its loss (Hugging Face's: ``training.cross_entropy: hf``)."""
    for name in ("max_seq_length", "block_size", "max_length", "model_max_length", "seq_length"):
        if trainer.has(name):
            draft.put("training.seq_len", trainer.int(name), trainer.source(name))
            break
    if trainer.flag("gradient_checkpointing"):
        draft.put("training.recompute", "full", trainer.source("gradient_checkpointing"), True,
                  "HF gradient checkpointing: every layer's forward rerun")
    attention = str(trainer.get("attn_implementation", "sdpa"))
    if attention not in ("sdpa", "flash_attention_2", "flash_attention_3", "eager"):
        raise refuse(f"{trainer.source('attn_implementation')}: {attention!r} is not sdpa, flash_attention_2/3 or "
                     "eager")
    draft.put("training.flash_attention", attention != "eager", "--attn_implementation", attention,
              "sdpa (transformers' default) runs PyTorch's flash kernel in bf16/fp16" if attention == "sdpa" else "",
              "mapped" if trainer.has("attn_implementation") else "default")
    if attention != "eager":  # the kernel flash attention runs: SDPA tries FlashAttention-2 before cuDNN
        # (pytorch#138907), flash_attention_2/3 are the flash-attn package's; none is cuDNN's fused attention
        draft.put("training.attention_backend", "flash", "--attn_implementation", attention, "FlashAttention "
                  "(priced on FlashAttention-2's curve)", "default")
    draft.put("training.fused_kernels", False, "(HF Trainer)", "eager", "PyTorch eager element-wise kernels (no "
              "torch.compile)", "default")
    # the loss transformers computes (loss/loss_utils.py ForCausalLMLoss: logits.float(), then log_softmax and
    # nll_loss in fp32): training.cross_entropy hf (docs/mechanisms/loss_head.md), not the fused default; unless
    # --use_liger_kernel patches the model with Liger's kernels (transformers integrations/liger.py at dd7a585c07:
    # liger_kernel_config, empty by default, passed to Liger's _apply_liger_kernel_to_instance; for Llama its fused
    # linear cross entropy, which never holds the logits, and its RMSNorm, RoPE and SwiGLU kernels)
    if trainer.flag("use_liger_kernel"):
        source = trainer.source("use_liger_kernel")
        draft.put("training.cross_entropy", "fused", source, True, "Liger's fused linear cross entropy: the logits "
                  "never held")
        draft.put("training.fused_norm_rope", True, source, True, "Liger's RMSNorm and RoPE kernels (its SwiGLU "
                  "kernel is not modelled: the activation priced eager)")
        if trainer.has("liger_kernel_config"):
            draft.row(trainer.source("liger_kernel_config"), trainer.get("liger_kernel_config"), "unmapped",
                      "Liger's per-kernel switches are not read: its defaults are simulated")
    else:
        draft.put("training.cross_entropy", "hf", "(HF Trainer) loss", "ForCausalLMLoss", "transformers' loss: the "
                  "logits upcast to fp32 for log_softmax and nll_loss", "default")
    for name in ("bf16", "fp16", "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm",
                 "num_gpus", "num_nodes", "nproc_per_node", "nnodes", "fsdp", "tf32", "use_liger_kernel",
                 "liger_kernel_config"):
        trainer.read.add(name)
    for dest, (_, source, raw) in trainer.values.items():
        if dest in trainer.read:
            continue
        if dest.startswith(TRAINER_HARMLESS):
            draft.row(source, raw, "ignored", "does not change one step's time or memory")
        else:
            draft.row(source, raw, "unknown", "not read by clustersim")
