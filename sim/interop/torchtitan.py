"""A TorchTitan job TOML -> a scenario.

In: a ``train_configs/*.toml`` as TorchTitan wrote them up to its move to Python configs (torchtitan/config/
job_config.py names and defaults: ``[model]`` name and flavor, ``[training]`` local_batch_size (or the older
batch_size), global_batch_size, seq_len, max_norm, mixed_precision_param/_reduce, enable_cpu_offload,
``[parallelism]`` the degrees, ``[activation_checkpoint]``, ``[compile]``), and the ``Options`` (the GPU count:
TorchTitan takes it from the launcher, NGPU in run_train.sh). Out: a ``Draft``.

The layout is TorchTitan's ``ParallelDims``: dp_shard = -1 takes the GPUs left by dp_replicate x cp x tp x pp;
dp_shard > 1 is FSDP2 (``fully_shard`` per transformer block), HSDP with dp_replicate > 1, and SHARD_GRAD_OP when
``fsdp_reshard_after_forward = "never"``; dp_shard = 1 with dp_replicate > 1 is DDP. Tensor parallelism shards the
norms' sequence dimension too (``SequenceParallel`` in parallelize.py), and async TP overlaps its collectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib

from sim.interop.draft import Draft, ModelDraft, Options, cluster, refuse
from sim.interop.emit import TORCHTITAN_CP_ROTATE
from sim.spec.scenario import ParallelSpec, read_text

# TorchTitan's llama3 flavors (torchtitan/models/llama3/__init__.py) are the Llama 3 shapes of the presets.
FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b"}
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved", "ZBVZeroBubble": "zb-v",
             "InterleavedZeroBubble": "zb-h1", "DualPipeV": "dualpipev"}
HARMLESS_SECTIONS = ("job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation", "comm",
                     "experimental", "fault_tolerance", "memory_estimation", "debug", "float8", "quantize", "mx")
HARMLESS_KEYS = ("model.tokenizer_path", "model.hf_assets_path", "model.print_after_conversion", "training.steps",
                 "training.dataset", "training.dataset_path", "training.gc_freq", "training.gc_debug",
                 "training.seed", "training.deterministic", "training.warmup_steps", "training.dataloader",
                 "compile.backend", "activation_checkpoint.preserve_rng_state", "activation_checkpoint.early_stop",
                 "activation_checkpoint.determinism_check", "activation_checkpoint.debug",
                 "parallelism.disable_loss_parallel", "parallelism.context_parallel_load_balancer",
                 "parallelism.pipeline_parallel_schedule_csv",
                 "parallelism.expert_parallel_comm_backend",
                 "parallelism.pipeline_parallel_expert_parallel_overlap")


def _pipeline_split(draft: Draft, flat: dict[str, Any], read: set[str], layers: int, stages: int,
                    weights: tuple[int, int]) -> None:
    """TorchTitan's generated pipeline split -> Megatron's account_for_embedding/loss_in_pipeline_split: ``layers``
    + the embedding's and the output's ``weights`` (pipeline_parallel_first/last_stage_less_layers) split evenly
    over ``stages``, the first stage's share less the first weight, the last's less the second. Exact where both
    weights are 0 or 1 and the sum divides; otherwise the nearest split the scenario can state, reported as
    unmapped. Explicit split points or module names per stage are reported as unmapped (the generated split is
    simulated)."""
    keys = tuple(f"parallelism.pipeline_parallel_{end}_stage_less_layers" for end in ("first", "last"))
    read.update(keys)
    exact = all(weight in (0, 1) for weight in weights) and (layers + sum(weights)) % stages == 0
    chosen = weights if exact else next(((first, last) for first, last in ((1, 1), (0, 0), (1, 0), (0, 1))
                                         if (layers + first + last) % stages == 0), None)
    note = (f"{layers} layers + {sum(weights)} over {stages} stages" if exact else
            f"TorchTitan splits {layers} layers + {weights[0]} + {weights[1]} unevenly over {stages} stages; "
            "simulated as the nearest even split")
    if chosen is not None:
        for key, field, weight, used in zip(keys, ("embedding", "loss"), weights, chosen, strict=True):
            draft.put(f"parallel.account_for_{field}_in_pipeline_split", bool(used), key, weight, note,
                      "unmapped" if not exact else "mapped" if key in flat else "default")
    for key in ("parallelism.pipeline_parallel_split_points", "parallelism.module_fqns_per_model_part"):
        if flat.get(key):
            read.add(key)
            draft.row(key, flat[key], "unmapped", "an explicit split: simulated with TorchTitan's generated one")


def _flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _int(flat: dict[str, Any], key: str, default: int) -> int:
    value = flat.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(f"{key}: expected a whole number (got {value!r})")
    return value


def import_torchtitan(inputs: list[str], options: Options) -> Draft:
    if len(inputs) != 1:
        raise refuse("torchtitan: give one TOML file (the job config)")
    try:
        config = tomllib.loads(read_text(Path(inputs[0]), "torchtitan"))
    except tomllib.TOMLDecodeError as error:
        raise refuse(f"torchtitan: {inputs[0]} is not valid TOML ({error})") from None
    flat = _flatten(config)
    read: set[str] = set()
    draft = Draft("torchtitan")
    draft.data["name"] = options.name or str(flat.get("job.description") or "torchtitan-import")[:200]
    read.add("job.description")

    def take(key: str, default: Any = None) -> Any:
        read.add(key)
        return flat.get(key, default)

    gpus = cluster(draft, options)
    # Model: --model, else the flavor.
    name, flavor = str(take("model.name", "llama3")), str(take("model.flavor", "debugmodel"))
    if not options.model:
        preset = FLAVORS.get((name, flavor))
        if preset is None:
            raise refuse(f"model.flavor: {name} {flavor} is not a preset here; give --model PRESET or config.json")
        options = Options(**{**options.__dict__, "model": preset})
    model = ModelDraft(draft, options)
    draft.row("model.flavor", f"{name} {flavor}", "mapped", "TorchTitan's flavor = the preset's shape",
              f"model = {options.model}")
    model.finish()
    # Layout (ParallelDims).
    tp = _int(flat, "parallelism.tensor_parallel_degree", 1)
    pp = _int(flat, "parallelism.pipeline_parallel_degree", 1)
    cp = _int(flat, "parallelism.context_parallel_degree", 1)
    ep = _int(flat, "parallelism.expert_parallel_degree", 1)
    replicate = _int(flat, "parallelism.data_parallel_replicate_degree", 1)
    shard = _int(flat, "parallelism.data_parallel_shard_degree", -1)
    read.update({f"parallelism.{key}" for key in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                                   "context_parallel_degree", "expert_parallel_degree",
                                                   "data_parallel_replicate_degree", "data_parallel_shard_degree")})
    if shard == -1:
        if gpus % (replicate * cp * tp * pp):
            raise refuse(f"parallelism.data_parallel_shard_degree: -1 needs the {gpus} GPUs to split into "
                         f"replicate {replicate} x cp {cp} x tp {tp} x pp {pp}")
        shard = gpus // (replicate * cp * tp * pp)
    if replicate * shard * cp * tp * pp != gpus:
        raise refuse(f"parallelism.data_parallel_shard_degree: dp_replicate {replicate} x dp_shard {shard} x cp {cp} "
                     f"x tp {tp} x pp {pp} != {gpus} GPUs (TorchTitan's ParallelDims asserts it)")
    draft.put("parallel.tp", tp, "parallelism.tensor_parallel_degree")
    draft.put("parallel.pp", pp, "parallelism.pipeline_parallel_degree")
    dp = replicate * shard
    if cp > 1:
        if "cp" in ParallelSpec.model_fields:
            draft.put("parallel.cp", cp, "parallelism.context_parallel_degree")
            # the KV exchange: PyTorch's ring rotater, "allgather" by default (emit.TORCHTITAN_CP_ROTATE)
            rotate = take("parallelism.context_parallel_rotate_method")
            kinds = {method: kind for kind, method in TORCHTITAN_CP_ROTATE.items()}
            if (rotate or "allgather") not in kinds:
                raise refuse(f"parallelism.context_parallel_rotate_method: {rotate!r} is not one of "
                             f"{', '.join(kinds)}")
            draft.put("parallel.cp_comm_type", kinds[rotate or "allgather"],
                      "parallelism.context_parallel_rotate_method", rotate or "allgather",
                      "PyTorch's ring rotater: allgather gathers the KV shards once, alltoall passes them per step",
                      "mapped" if rotate else "default")
        else:
            dp *= cp
            draft.row("parallelism.context_parallel_degree", cp, "unmapped", "context parallelism is not in the "
                      "scenario yet (parallel.cp): its ranks are simulated as data-parallel ranks")
    draft.put("parallel.dp", dp, "parallelism.data_parallel_shard_degree", flat.get(
        "parallelism.data_parallel_shard_degree", -1), f"dp_replicate {replicate} x dp_shard {shard}")
    if ep > 1:
        draft.put("parallel.ep", ep, "parallelism.expert_parallel_degree")
    if tp > 1:
        draft.put("parallel.sequence_parallel", True, "parallelism.tensor_parallel_degree", tp,
                  "TorchTitan's TP plan shards the norms' sequence dimension (SequenceParallel)", "default")
    if take("parallelism.enable_async_tensor_parallel"):
        draft.put("parallel.tp_comm_overlap", True, "parallelism.enable_async_tensor_parallel")
        # PyTorch's AsyncTP, not TE's userbuffers (the field's default): no SMs held beside the GEMM, one GEMM per
        # chunk, the reduce-scatter's partials summed after its chunks (sim.workload.tp_overlap.async_tp)
        draft.put("parallel.tp_comm_overlap_method", "async_tp", "parallelism.enable_async_tensor_parallel", True,
                  "PyTorch's symmetric-memory AsyncTP (fused_all_gather_matmul, fused_matmul_reduce_scatter)",
                  "default")
    reshard = str(take("parallelism.fsdp_reshard_after_forward", "default"))
    if shard > 1:
        sharding = "HYBRID_SHARD" if replicate > 1 else "SHARD_GRAD_OP" if reshard == "never" else "FULL_SHARD"
        draft.put("fsdp.sharding", sharding, "parallelism.data_parallel_shard_degree", shard,
                  f"FSDP2 fully_shard per block (replicate {replicate}, reshard_after_forward {reshard})")
        draft.put("fsdp.version", 2, "parallelism.data_parallel_shard_degree", shard,
                  "TorchTitan shards with fully_shard (FSDP2): no FSDP1 flat-parameter gradient kernels", "default")
        if reshard == "never" and replicate > 1:
            draft.row("parallelism.fsdp_reshard_after_forward", reshard, "unmapped", "HSDP without resharding: "
                      "simulated as HYBRID_SHARD")
    elif replicate > 1:
        draft.row("parallelism.data_parallel_replicate_degree", replicate, "mapped", "DDP (no sharding)",
                  "parallel.zero = 0")
    # Pipeline schedule and micro-batches.
    local = take("training.local_batch_size", take("training.batch_size", 8))
    source = "training.local_batch_size" if "training.local_batch_size" in flat else "training.batch_size"
    schedule_name = str(take("parallelism.pipeline_parallel_schedule", "1F1B"))
    micro = local
    if pp > 1:
        if schedule_name not in SCHEDULES:
            raise refuse(f"parallelism.pipeline_parallel_schedule: {schedule_name!r} is not modelled "
                         f"({', '.join(SCHEDULES)})")
        draft.put("schedule", SCHEDULES[schedule_name], "parallelism.pipeline_parallel_schedule", schedule_name)
        micro = _int(flat, "parallelism.pipeline_parallel_microbatch_size", 1)
        read.add("parallelism.pipeline_parallel_microbatch_size")
        per_stage = take("parallelism.pipeline_parallel_layers_per_stage")
        multi = SCHEDULES[schedule_name] in ("interleaved", "zb-h1", "zb-v", "dualpipev")
        # TorchTitan's split (torchtitan/distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part):
        # num_layers + the embedding's and the output's weights, 1 each by default, evenly over the stages
        weights = (_int(flat, "parallelism.pipeline_parallel_first_stage_less_layers", 1),
                   _int(flat, "parallelism.pipeline_parallel_last_stage_less_layers", 1))
        layers = int(model.fields["num_layers"])
        vpp = 1
        if per_stage and multi:  # ceil((num_layers + both weights) / layers per stage) stages over pp ranks
            vpp = -(-(layers + sum(weights)) // int(per_stage)) // pp
            draft.put("parallel.vpp", vpp, "parallelism.pipeline_parallel_layers_per_stage", per_stage,
                      f"ceil(({layers} + {sum(weights)}) / {per_stage}) stages over pp {pp}")
        elif SCHEDULES[schedule_name] in ("zb-v", "dualpipev", "interleaved"):  # two stages per rank
            vpp = 2
            draft.put("parallel.vpp", 2, "parallelism.pipeline_parallel_schedule", schedule_name,
                      "a multi-stage schedule without layers per stage runs two stages per rank", "default")
        _pipeline_split(draft, flat, read, layers, pp * vpp, weights)
    draft.put("training.micro_batch", micro, "parallelism.pipeline_parallel_microbatch_size" if pp > 1 else source)
    global_batch = take("training.global_batch_size", -1)
    batch = global_batch if global_batch and global_batch > 0 else local * dp
    draft.put("training.global_batch", batch, "training.global_batch_size", global_batch,
              "" if global_batch and global_batch > 0 else f"-1: local_batch_size {local} x dp {dp}")
    draft.put("training.seq_len", take("training.seq_len", 2048), "training.seq_len")
    draft.put("training.clip_grad", float(take("training.max_norm", 1.0)), "training.max_norm")
    # Precision.
    converters = take("model.converters", []) or []
    float8 = any("float8" in str(c) for c in converters)
    param = str(take("training.mixed_precision_param", "bfloat16"))
    if param not in ("bfloat16", "float32"):
        raise refuse(f"training.mixed_precision_param: {param!r} is not bfloat16 or float32")
    pure = str(take("training.dtype", "float32"))
    if pure not in ("bfloat16", "float32"):
        raise refuse(f"training.dtype: {pure!r} is not bfloat16 or float32")
    if pure == "bfloat16" and param == "float32":
        raise refuse("training.mixed_precision_param: float32 with training.dtype bfloat16 (bf16 weights computed "
                     "in fp32) is not modelled")
    # FSDP's float8 all-gather ([quantize.linear.float8] at e347b1e5e, [float8] before): torchao casts each weight's
    # shard before its all-gather (fsdp_pre_all_gather), once per gather, where Float8Linear alone casts the whole
    # weight in every forward: the cached cast (training.fp8_weight_cache); nothing is gathered without dp_shard > 1
    gather_key = next((key for key in ("quantize.linear.float8.enable_fsdp_float8_all_gather",
                                       "float8.enable_fsdp_float8_all_gather") if key in flat), None)
    if gather_key is not None:
        read.add(gather_key)
    gathered = gather_key is not None and flat[gather_key] is True
    if float8:
        draft.put("training.dtype", "fp8", "model.converters", converters, "torchao Float8Linear (dynamic scaling)")
        if gathered and shard > 1:
            draft.put("training.fp8_weight_cache", True, str(gather_key), True, "each weight's shard cast to FP8 "
                      "before its FSDP all-gather, once per gather (the gathers still priced at bf16 bytes)")
        elif gather_key is not None and shard > 1:  # written false
            draft.put("training.fp8_weight_cache", False, gather_key, flat[gather_key],
                      "Float8Linear casts each weight in every forward")
        else:
            draft.put("training.fp8_weight_cache", False, "model.converters", converters,
                      "Float8Linear casts each weight in every forward", "default")
        draft.put("training.fp8_recipe", "current", "model.converters", converters,
                  "torchao's tensorwise dynamic scaling: each tensor's amax scanned before its cast", "default")
    else:
        draft.put("training.dtype", "bf16" if param == "bfloat16" else "fp32", "training.mixed_precision_param",
                  param)
    if shard > 1:
        reduce = str(take("training.mixed_precision_reduce", "float32"))
        draft.put("training.grad_dtype", "fp32" if reduce == "float32" else "bf16",
                  "training.mixed_precision_reduce", reduce, "FSDP2's reduce_dtype")
    # [training] dtype = "bfloat16": the model built under set_default_dtype(bf16), "all parameters, gradients, and
    # optimizer states in bfloat16, without an extra copy of fp32 weights" (job_config.py, pytorch/torchtitan#1646).
    if pure == "bfloat16":
        draft.put("training.master_weights", False, "training.dtype", pure, "no fp32 copy of the weights")
        draft.put("training.optimizer_dtype", "bf16", "training.dtype", pure,
                  "AdamW's moments allocated like the bf16 parameters: 2 + 2 + 4 bytes per parameter")
    if gather_key is not None and not (float8 and shard > 1):
        draft.row(gather_key, flat[gather_key], "ignored", "no FP8 weights gathered by FSDP (no float8 converter "
                  "or no dp_shard)")
    if take("training.enable_cpu_offload"):
        draft.put("offload.optimizer", True, "training.enable_cpu_offload")
        draft.put("offload.params", True, "training.enable_cpu_offload")
    # Recompute.
    mode = str(take("activation_checkpoint.mode", "selective"))
    option = str(take("activation_checkpoint.selective_ac_option", "2"))
    if mode == "full":
        draft.put("training.recompute", "full", "activation_checkpoint.mode")
    elif mode == "selective" and option == "op":
        draft.put("training.recompute", "selective", "activation_checkpoint.mode", "selective (op)",
                  "op-level SAC: matmul outputs saved, the rest rerun; simulated as Megatron's selective recompute")
    elif mode == "selective" and option.isdigit():
        every = int(option)
        layers = int(model.fields["num_layers"]) // (pp or 1)
        draft.put("training.recompute", "full", "activation_checkpoint.selective_ac_option", option,
                  f"every {every}th block checkpointed")
        draft.put("training.recompute_num_layers", layers // every, "activation_checkpoint.selective_ac_option",
                  option, "as many layers recomputed (the first ones of each stage)")
    elif mode != "none":
        raise refuse(f"activation_checkpoint.mode: {mode!r} is not modelled (none, selective, full)")
    components = take("compile.components", ["model", "loss"]) or []
    compiled = bool(take("compile.enable")) and "model" in components
    draft.put("training.fused_kernels", compiled, "compile.enable", bool(flat.get("compile.enable")),
              "torch.compile fuses the element-wise kernels" if compiled else "eager PyTorch element-wise kernels",
              "mapped" if "compile.enable" in flat else "default")
    # The loss (torchtitan/components/loss.py at e347b1e5e: cross_entropy_loss = F.cross_entropy(pred.float(), ...),
    # torch.compile'd when "loss" is in compile.components): eager, the upcast logits and log_softmax's fp32 output
    # are held as under transformers' loss (training.cross_entropy hf); compiled, Inductor fuses the upcast into the
    # reductions and holds no fp32 logits (fused). Under TP, loss_parallel's DTensor all-reduces are not priced.
    loss_compiled = bool(flat.get("compile.enable")) and "loss" in components
    draft.put("training.cross_entropy", "fused" if loss_compiled else "hf", "compile.components", components,
              "the loss compiled: the upcast fused into the reductions" if loss_compiled else
              "eager cross_entropy on the logits upcast to fp32", "mapped" if "compile.enable" in flat else "default")
    draft.put("training.flash_attention", True, "(TorchTitan llama3)", "sdpa", "F.scaled_dot_product_attention "
              "(is_causal): PyTorch's flash kernel", "default")
    draft.put("training.attention_backend", "flash", "(TorchTitan llama3)", "sdpa", "SDPA tries FlashAttention-2 "
              "before cuDNN (pytorch#138907), compiled or not", "default")
    for key, value in flat.items():
        if key in read:
            continue
        if key.startswith(HARMLESS_KEYS) or key.split(".")[0] in HARMLESS_SECTIONS:
            draft.row(key, value, "ignored", "does not change one step's time or memory")
        else:
            draft.row(key, value, "unknown", "not read by clustersim")
    return draft
