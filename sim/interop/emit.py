"""A scenario's layout as a framework's launch configuration (``sim search --emit``): the other way from import.

In: a validated ``Scenario`` (a layout ``sim search`` found) and a framework name. Out: ``Emitted``: the
configuration file's text (a Megatron-LM launch script, a TorchTitan TOML, a DeepSpeed JSON), its file suffix, and
the launch command; or a ``ConfigError`` naming the knob the framework has no setting for (Megatron-LM here has no
ZeRO-2/3, TorchTitan no ZeRO-1, a DeepSpeed/HF Trainer run no tensor or pipeline parallelism, none of them the
zero-bubble or DualPipe orders). Importing what this writes (sim.interop) gives back the same layout: the degrees,
micro-batch, global batch, ZeRO stage, recompute, sequence parallelism, schedule and overlaps (tests/test_import.py),
and the kernels priced: the loss, the attention kernel and FP8's weight cast cache, each written as the framework's
setting or refused naming the field, never dropped (tests/test_emit_kernels.py; docs/ecosystem.md's table).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sim.costs.models import resolve_attention_backend
from sim.errors import ConfigError
from sim.hardware.dtypes import bytes_per_element
from sim.spec.degrees import degrees
from sim.spec.parallel import cuda_device_max_connections
from sim.spec.scenario import MoeSpec, Scenario

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")
TORCHTITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                      "llama3-405b": ("llama3", "405B")}
TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zb-v": "ZBVZeroBubble"}
# parallel.cp_comm_type -> TorchTitan's context_parallel_rotate_method, the ring rotater of PyTorch's context
# parallel attention (torch/distributed/tensor/experimental/_attention.py): "alltoall" (_AllToAllRotater) passes
# each KV shard to the next rank per ring step (permute_tensor), Megatron's p2p ring; "allgather" (_AllGatherRotater,
# TorchTitan's default) gathers every shard once, Megatron's all_gather. Ulysses (a2a) is no rotater.
TORCHTITAN_CP_ROTATE = {"p2p": "alltoall", "all_gather": "allgather"}


@dataclass(frozen=True)
class Emitted:
    text: str  # the configuration file
    suffix: str  # .sh, .toml, .json
    launch: str  # the command that runs it (a placeholder training script where the framework needs the user's)


def emit(scenario: Scenario, framework: str) -> Emitted:
    if framework not in FRAMEWORKS:
        raise ConfigError(f"--emit: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if scenario.training.method != "full":  # none of the three configurations has adapters or frozen layers: the
        # run would train every parameter (another memory and step than the scenario's)
        raise _refuse(framework, "training.method", f"{scenario.training.method} fine-tuning (the configuration "
                      "trains every parameter)")
    return {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed}[framework](scenario)


def _refuse(framework: str, knob: str, why: str) -> ConfigError:
    return ConfigError(f"{knob}: {why} ({framework} has no setting for it)")


def _optimizer_states(s: Scenario, framework: str, full_bf16: bool = False) -> list[str]:
    """The optimizer's states (training.master_weights, optimizer_dtype) as ``framework``'s flags: Megatron-LM's
    precision-aware optimizer (--exp-avg-dtype / --exp-avg-sq-dtype, distributed optimizer only) for moments
    other than fp32. ``full_bf16``: the framework trains in pure bf16 (no master, bf16 moments: TorchTitan's
    [training] dtype = "bfloat16", written by its emitter); elsewhere no master is refused."""
    t = s.training
    if not t.master_weights:
        if full_bf16 and t.dtype == "bf16" and t.optimizer_dtype == "bf16":
            return []
        raise _refuse(framework, "training.master_weights", "pure 16-bit training without an fp32 master copy"
                      + (" other than bf16 weights and moments" if full_bf16 else ""))
    if t.optimizer_dtype == "fp32":
        return []
    if framework != "Megatron-LM":
        raise _refuse(framework, "training.optimizer_dtype", f"Adam moments in {t.optimizer_dtype}")
    if degrees(s).zero_stage < 1:
        raise _refuse(framework, "training.optimizer_dtype", f"Adam moments in {t.optimizer_dtype} without the "
                      "distributed optimizer (parallel.zero 1; --use-precision-aware-optimizer needs it)")
    return ["--use-precision-aware-optimizer", "--exp-avg-dtype", t.optimizer_dtype, "--exp-avg-sq-dtype",
            t.optimizer_dtype]


def _precision(s: Scenario) -> list[str]:
    dtype = s.training.dtype
    if dtype == "fp8":
        return ["--bf16", "--fp8-format", "hybrid"]
    return {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [], "tf32": []}[dtype]


def _megatron(s: Scenario) -> Emitted:
    d, p, t, m = degrees(s), s.parallel, s.training, s.model
    if d.zero_stage >= 2 or s.fsdp is not None:
        raise _refuse("Megatron-LM", "parallel.zero", f"ZeRO-{d.zero_stage}/FSDP is not Megatron's distributed "
                      "optimizer (ZeRO-1)")
    if s.schedule not in ("1f1b", "interleaved"):
        raise _refuse("Megatron-LM", "schedule", f"{s.schedule} is not Megatron-LM's 1F1B or interleaved 1F1B")
    flags: list[str] = [
        "--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    if p.vpp > 1:
        flags += ["--num-virtual-stages-per-pipeline-rank", str(p.vpp)]
        if not p.overlap_p2p_comm:
            flags += ["--no-overlap-p2p-communication"]
    # an uneven split (Megatron-Core's arguments.py; the importer reads each back)
    if p.first_stage_layers is not None:
        flags += ["--decoder-first-pipeline-num-layers", str(p.first_stage_layers)]
    if p.last_stage_layers is not None:
        flags += ["--decoder-last-pipeline-num-layers", str(p.last_stage_layers)]
    if p.account_for_embedding_in_pipeline_split:
        flags.append("--account-for-embedding-in-pipeline-split")
    if p.account_for_loss_in_pipeline_split:
        flags.append("--account-for-loss-in-pipeline-split")
    if p.sequence_parallel:
        flags.append("--sequence-parallel")
    if p.cp > 1:  # without it Megatron-LM takes the CP ranks as data-parallel ones (arguments.py)
        flags += ["--context-parallel-size", str(p.cp)]
        if p.cp_comm_type != "p2p":
            flags += ["--cp-comm-type", MEGATRON_CP_COMM_TYPES[p.cp_comm_type]]
    if p.ep > 1:
        flags += ["--expert-model-parallel-size", str(p.ep)]
    if m.num_moe_experts and p.etp is not None and p.etp != p.tp:
        flags += ["--expert-tensor-parallel-size", str(p.etp)]
    if d.zero_stage == 1:
        flags.append("--use-distributed-optimizer")
    if p.overlap_grad_reduce:
        flags.append("--overlap-grad-reduce")
        # the bucket the scenario priced, in gradients (DistributedDataParallelConfig.bucket_size; its default,
        # sim.interop.megatron.ddp_bucket_elements): fp32 main gradients unless grad_dtype says otherwise, fp16's own
        element = bytes_per_element(t.grad_dtype) if t.grad_dtype != "auto" else 2 if t.dtype == "fp16" else 4
        flags += ["--ddp-bucket-size", str(round(p.dp_bucket_size / element))]
    if p.overlap_param_gather:
        if not p.overlap_grad_reduce:  # arguments.py asserts it (as `sim import megatron` refuses)
            raise ConfigError("parallel.overlap_param_gather: Megatron-LM's --overlap-param-gather needs "
                              "--overlap-grad-reduce (its arguments refuse it otherwise); set "
                              "parallel.overlap_grad_reduce: true or parallel.overlap_param_gather: false")
        flags.append("--overlap-param-gather")
        if not p.align_param_gather:
            flags.append("--no-align-param-gather")
    ub_cfg = ""  # the userbuffers YAML the script writes for --tp-comm-overlap-cfg
    if p.tp_comm_overlap and p.tp > 1:  # (at tp 1 there is no TP collective to overlap, and Megatron-LM
        # switches SP off there, then refuses the flag: left out)
        if not p.sequence_parallel:  # Megatron-LM arguments.py asserts SP under --tp-comm-overlap
            raise ConfigError("parallel.tp_comm_overlap: Megatron-LM's --tp-comm-overlap needs sequence "
                              "parallelism (its arguments refuse it otherwise); set "
                              "parallel.sequence_parallel: true or parallel.tp_comm_overlap: false")
        if p.tp_comm_overlap_method == "async_tp":  # --tp-comm-overlap is TE's userbuffers, priced otherwise
            raise _refuse("Megatron-LM", "parallel.tp_comm_overlap_method", "async_tp is PyTorch's AsyncTP "
                          "(symmetric memory); --tp-comm-overlap runs TE's userbuffers: set userbuffers")
        flags.append("--tp-comm-overlap")
        ub_cfg = _userbuffers_cfg(s)
        if ub_cfg:
            flags += ["--tp-comm-overlap-cfg", UB_CFG_FILE]
    flags += ["--micro-batch-size", str(t.micro_batch), "--global-batch-size", str(d.global_batch),
              "--seq-length", str(d.seq_len)]
    if t.recompute == "selective":
        flags += ["--recompute-granularity", "selective"]
        if t.recompute_modules is not None:  # Megatron-Core's names; its default is [core_attn], as the model's
            flags += ["--recompute-modules", " ".join(t.recompute_modules)]  # one line, its values after it
    elif t.recompute == "full":
        flags += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                  str(t.recompute_num_layers if t.recompute_num_layers is not None else d.layers_per_chunk)]
    if t.cpu_offloading_num_layers:  # Megatron-Core's activation offload: Megatron-LM has no --cpu-offloading
        # (arguments.py at d98e8a64dd excludes TransformerConfig.cpu_offloading from the command line and switches
        # it on for --cpu-offloading-num-layers above 0)
        flags += ["--cpu-offloading-num-layers", str(t.cpu_offloading_num_layers)]
    flags += _precision(s) + _optimizer_states(s, "Megatron-LM")
    if t.dtype in ("bf16", "fp8") and t.grad_dtype == "bf16":  # fp8 runs on --bf16 (``_precision``)
        flags.append("--grad-reduce-in-bf16")
    flags += ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size), "--ffn-hidden-size",
              str(m.ffn), "--num-attention-heads", str(m.num_attention_heads)]
    if m.kv_heads != m.num_attention_heads:
        flags += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.kv_channels is not None:
        flags += ["--kv-channels", str(m.kv_channels)]
    if m.qk_layernorm:  # Qwen3's q/k norms (arguments.py --qk-layernorm; without it Megatron builds none)
        flags.append("--qk-layernorm")
    if m.multi_latent_attention:  # DeepSeek's MLA (arguments.py at 1e05700595 --multi-latent-attention and the
        # MLA group: --q-lora-rank default None, --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim 64,
        # --v-head-dim 128), each written, so the script builds the attention the scenario priced, not GQA/MHA;
        # with --no-rope-fusion, which TransformerConfig.__post_init__ requires ("multi_latent_attention does not
        # support apply_rope_fusion"; fused RoPE is arguments.py's default)
        flags += ["--multi-latent-attention", "--no-rope-fusion"]
        if m.q_lora_rank is not None:
            flags += ["--q-lora-rank", str(m.q_lora_rank)]
        flags += ["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_head_dim),
                  "--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim), "--v-head-dim", str(m.v_head_dim)]
    if m.mlp in ("swiglu", "squared_relu"):
        flags.append("--swiglu" if m.mlp == "swiglu" else "--squared-relu")
    if m.norm == "rmsnorm":
        flags += ["--normalization", "RMSNorm"]
    if m.position_embedding == "rope":
        flags += ["--position-embedding-type", "rope"]
    if not m.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        flags.append("--disable-bias-linear")
        if m.add_qkv_bias:
            flags.append("--add-qkv-bias")  # Megatron-LM arguments.py: a bias on QKV alone (Qwen2)
    flags += ["--max-position-embeddings", str(m.max_seq_len), "--vocab-size", str(m.vocab_size)]
    if m.num_moe_experts:
        flags += ["--num-experts", str(m.num_moe_experts), "--moe-router-topk", str(m.moe_router_topk),
                  "--moe-token-dispatcher-type", s.moe.token_dispatcher]
        # the experts' shape: without --moe-ffn-hidden-size Megatron-Core's experts take --ffn-hidden-size
        if m.moe_ffn_hidden_size is not None:
            flags += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
        if m.moe_shared_expert_intermediate_size is not None:
            flags += ["--moe-shared-expert-intermediate-size", str(m.moe_shared_expert_intermediate_size)]
        if m.moe_router_enable_expert_bias:  # DeepSeek-V3's aux-loss-free balancing bias, which Megatron-Core
            # allows only with the sigmoid router score (transformer_config.py __post_init__ at 1e05700595)
            flags += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
        if isinstance(m.moe_layer_freq, tuple):  # one 0/1 per layer, as Megatron's moe_freq_type reads a list
            flags += ["--moe-layer-freq", "'[" + ",".join(str(flag) for flag in m.moe_layer_freq) + "]'"]
        elif m.moe_layer_freq != 1:
            flags += ["--moe-layer-freq", str(m.moe_layer_freq)]
        if s.moe.capacity_factor is not None:  # token dropping; without it Megatron-Core runs dropless
            flags += ["--moe-expert-capacity-factor", str(s.moe.capacity_factor)]
        if s.moe.pad_to_capacity:
            flags.append("--moe-pad-expert-input-to-capacity")
        if s.moe.force_load_balancing:
            flags.append("--moe-router-force-load-balancing")
        if s.moe.token_dispatcher == "flex":
            flags += ["--moe-flex-dispatcher-backend", "deepep"] + _deepep_sms(s)
        if s.moe.a2a_overlap:
            flags += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if not t.flash_attention:
        flags += ["--attention-backend", "unfused"]
    elif t.attention_backend != "auto":  # the kernel the scenario was priced on (TE picks fused under auto)
        flags += ["--attention-backend", t.attention_backend]
    if t.clip_grad != 1.0:
        flags += ["--clip-grad", f"{t.clip_grad:g}"]
    # The loss the scenario priced (training.cross_entropy; sim.model.vocab_ops): Megatron-Core runs its unfused
    # VocabParallelCrossEntropy unless --cross-entropy-loss-fusion is given (language_module.py
    # compute_language_model_loss at 1e05700595; the fused kernel's impl 'native' by default), so fused needs the flag
    if t.cross_entropy == "fused":
        flags.append("--cross-entropy-loss-fusion")
    elif t.cross_entropy == "hf":
        raise _refuse("Megatron-LM", "training.cross_entropy", "hf is Hugging Face's loss (fp32 logits, then "
                      "log_softmax); Megatron runs fused (--cross-entropy-loss-fusion) or megatron (without it)")
    lines = [f"    {flag}" + (f" {value}" if not value.startswith("--") else "")
             for flag, value in _pairs(flags)]
    launch = (f"torchrun --nproc_per_node {s.cluster.gpus_per_node} --nnodes {s.cluster.nodes} pretrain_gpt.py")
    files = f"cat > {UB_CFG_FILE} <<'EOF'\n{ub_cfg}EOF\n" if ub_cfg else ""
    text = "#!/bin/bash\n# " + f"{s.name}: written by `sim search --emit megatron`\n" + _environment(s) + files + \
        launch + " \\\n" + " \\\n".join(line for line in lines) + "\n"
    return Emitted(text, ".sh", launch + " ...")


def _environment(s: Scenario) -> str:
    """The environment the script exports: CUDA_DEVICE_MAX_CONNECTIONS at the value the scenario was priced at
    (sim.spec.parallel.cuda_device_max_connections: the field, else 32 under the EP A2A overlap and 1 otherwise).
    Megatron-LM reads it from the environment, never from a flag: arguments.py asserts 1 under tensor or context
    parallelism before Blackwell, and Megatron-Core's EP A2A overlap wants more (its MoE README), so the script
    sets it, as Megatron-LM's own examples do (examples/gpt3/train_gpt3_175b_distributed.sh)."""
    connections = cuda_device_max_connections(s)
    return "# hardware queues the simulation priced (parallel.cuda_device_max_connections)\n" \
        f"export CUDA_DEVICE_MAX_CONNECTIONS={connections}\n"


UB_CFG_FILE = "ub_cfg.yaml"
# parallel.cp_comm_type -> Megatron-LM's --cp-comm-type, the names Transformer Engine's attention checks (p2p,
# all_gather, a2a, a2a+p2p; arguments.py's help spells the second 'allgather', which TE would refuse)
MEGATRON_CP_COMM_TYPES = {"p2p": "p2p", "all_gather": "all_gather", "a2a": "a2a"}


def _userbuffers_cfg(s: Scenario) -> str:
    """``parallel.tp_comm_overlap_sms`` / ``tp_comm_overlap_chunks``, where the scenario sets them, as the
    userbuffers YAML Megatron-LM's ``--tp-comm-overlap-cfg`` hands to TE's initialize_ub
    (megatron/training/initialize.py _initialize_tp_communicators), in NeMo-Framework-Launcher 24.07's ub_cfg_h100
    form: the two row GEMMs' pipelined reduce-scatters (proj_fprop, fc2_fprop), ``num_sm`` with
    ``set_sm_margin``, ``num_splits`` (the chunks the scenario prices, tp unless set); the other GEMMs keep TE's
    defaults. Empty where neither field is set. An SM count of 0 is the GEMM launched without the margin
    (``set_sm_margin: 0``: TE comm_gemm_overlap.cpp, the GEMM keeps every SM; TE 1.x's default, the NeMo 24.07
    rows'), as ``sim.interop.megatron.apply_userbuffers`` reads it back."""
    p = s.parallel
    if p.tp_comm_overlap_sms is None and p.tp_comm_overlap_chunks is None:
        return ""
    settings = ["method: pipeline"]
    if p.tp_comm_overlap_sms == 0:
        settings.append("set_sm_margin: 0")
    elif p.tp_comm_overlap_sms is not None:
        settings += [f"num_sm: {p.tp_comm_overlap_sms}", "set_sm_margin: 1"]
    # always written: a pipeline entry without it runs TE's 4 splits (initialize_ub: ub_cfg.get("num_splits", 4 if
    # method == "pipeline" else 0)), where the scenario priced its chunks (default tp: tp_overlap.tp_overlap_chunks)
    settings.append(f"num_splits: {p.tp_comm_overlap_chunks or p.tp}")
    return "".join(f"{gemm}:\n" + "".join(f"  {line}\n" for line in settings) for gemm in ("proj_fprop", "fc2_fprop"))


def _deepep_sms(s: Scenario) -> list[str]:
    """moe.deepep_sms as Megatron-LM's --moe-deepep-num-sms (read by every Megatron-Core with DeepEP; the newest
    routes it to moe_flex_dispatcher_num_sms), nothing at its default (DeepEP V1's 20, Megatron-Core's own); 0,
    the model's switch for no SM contention, is no DeepEP setting."""
    sms = s.moe.deepep_sms
    if sms == 0:
        raise _refuse("Megatron-LM", "moe.deepep_sms", "0 (DeepEP's kernels on no SMs: the model's switch for no SM "
                      "contention)")
    return [] if sms == MoeSpec.model_fields["deepep_sms"].default else ["--moe-deepep-num-sms", str(sms)]


def _moe_refusals(s: Scenario, framework: str, expert_parallel: bool) -> None:
    """The MoE knobs ``framework``'s configuration has no setting for, refused in one line rather than dropped:
    the flex (DeepEP) dispatcher, Megatron-Core's EP A2A overlap, its forced load balancing and, where
    ``expert_parallel`` is False, ep > 1."""
    if not s.model.num_moe_experts:
        return
    if s.moe.token_dispatcher == "flex":
        raise _refuse(framework, "moe.token_dispatcher", "the flex (DeepEP) dispatcher")
    if s.moe.a2a_overlap:
        raise _refuse(framework, "moe.a2a_overlap", "Megatron-Core's EP A2A overlap (combined 1F1B)")
    if s.moe.force_load_balancing:
        raise _refuse(framework, "moe.force_load_balancing", "Megatron-Core's random-logit router")
    if not expert_parallel and s.parallel.ep > 1:
        raise _refuse(framework, "parallel.ep", f"expert parallelism (ep {s.parallel.ep})")


def _pairs(flags: list[str]) -> list[tuple[str, str]]:
    """Flags with their values: ('--tp', '8'), ('--sequence-parallel', '--')."""
    pairs, index = [], 0
    while index < len(flags):
        flag = flags[index]
        value = flags[index + 1] if index + 1 < len(flags) and not flags[index + 1].startswith("--") else "--"
        pairs.append((flag, value))
        index += 1 if value == "--" else 2
    return pairs


def _torchtitan(s: Scenario) -> Emitted:
    d, p, t = degrees(s), s.parallel, s.training
    zero = d.zero_stage
    hybrid = s.fsdp is not None and s.fsdp.sharding == "HYBRID_SHARD"
    if zero == 1:
        raise _refuse("TorchTitan", "parallel.zero", "ZeRO-1 (sharded optimizer states only) is not FSDP2")
    if s.schedule not in TORCHTITAN_SCHEDULES and p.pp > 1:
        raise _refuse("TorchTitan", "schedule", f"{s.schedule} is not one of TorchTitan's pipeline schedules here")
    _optimizer_states(s, "TorchTitan", full_bf16=True)
    _moe_refusals(s, "TorchTitan", expert_parallel=True)
    if p.tp > 1 and not p.sequence_parallel:
        raise _refuse("TorchTitan", "parallel.sequence_parallel", "tensor parallelism without sequence-parallel "
                      "norms (TorchTitan's TP plan always uses SequenceParallel)")
    if p.cp > 1 and p.cp_comm_type not in TORCHTITAN_CP_ROTATE:
        raise _refuse("TorchTitan", "parallel.cp_comm_type", f"{p.cp_comm_type} (Ulysses' all-to-all of heads) is "
                      "not one of PyTorch's context-parallel rotaters (alltoall: p2p, allgather: all_gather)")
    if zero >= 2 and hybrid:  # FSDP2 shards over dp_shard x cp (TorchTitan's dp_shard_cp mesh), one node's
        per_node = s.cluster.gpus_per_node // p.tp
        if per_node % p.cp:
            raise _refuse("TorchTitan", "parallel.cp", f"HYBRID_SHARD with cp {p.cp} across a node's {per_node} "
                          "data-parallel ranks")
        replicate, shard = d.dp * p.cp // per_node, per_node // p.cp
    elif zero >= 2:
        replicate, shard = 1, d.dp
    else:
        replicate, shard = d.dp, 1
    name, flavor = TORCHTITAN_FLAVORS.get(s.model.name, ("llama3", s.model.name))
    lines = [f"# {s.name}: written by `sim search --emit torchtitan`",
             "[model]", f'name = "{name}"', f'flavor = "{flavor}"']
    if s.model.name not in TORCHTITAN_FLAVORS:
        lines.append("# not a TorchTitan llama3 flavor: `sim import torchtitan` needs --model")
    lines += _torchtitan_attention(s)
    float8 = _torchtitan_float8(s, shard)
    if t.dtype == "fp8":
        lines.append('converters = ["float8"]')
        if t.fp8_recipe == "delayed":  # the field's default, so written as a comment, not refused
            lines.append("# fp8: torchao's tensorwise current scaling (recipe_name tensorwise / rowwise at e347b1e5e: "
                         "no delayed scaling); the scenario priced training.fp8_recipe delayed")
    lines += ["", "[training]", f"local_batch_size = {t.micro_batch * (d.microbatches if p.pp > 1 else 1)}",
              f"global_batch_size = {d.global_batch}", f"seq_len = {d.seq_len}", f"max_norm = {t.clip_grad:g}",
              f'mixed_precision_param = "{"float32" if t.dtype in ("fp32", "tf32") else "bfloat16"}"']
    if shard > 1:  # FSDP2's reduce_dtype, float32 by default: the gradient dtype the scenario reduces in (sharded
        # gradients stay in the parameters' dtype unless training.grad_dtype says fp32: Plan.grad_dtype)
        wide = t.grad_dtype == "fp32" or t.dtype in ("fp32", "tf32")
        lines.append(f'mixed_precision_reduce = "{"float32" if wide else "bfloat16"}"')
    if not t.master_weights:  # pure bf16 (pytorch/torchtitan#1646): parameters, gradients and Adam's states in bf16
        lines.append('dtype = "bfloat16"')
    lines += ["",
              "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
              f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {p.tp}",
              f"pipeline_parallel_degree = {p.pp}", f"expert_parallel_degree = {p.ep}"]
    if p.cp > 1:  # else ParallelDims' product misses the cp ranks and TorchTitan stops at start-up
        lines += [f"context_parallel_degree = {p.cp}",
                  f'context_parallel_rotate_method = "{TORCHTITAN_CP_ROTATE[p.cp_comm_type]}"']
    if zero == 2:
        lines.append('fsdp_reshard_after_forward = "never"')
    if p.tp_comm_overlap:
        if p.tp > 1 and p.tp_comm_overlap_method != "async_tp":  # what the flag runs is PyTorch's AsyncTP
            raise _refuse("TorchTitan", "parallel.tp_comm_overlap_method", f"{p.tp_comm_overlap_method} is TE's "
                          "userbuffers; enable_async_tensor_parallel runs PyTorch's AsyncTP: set async_tp")
        lines.append("enable_async_tensor_parallel = true")
    if p.pp > 1:
        # TorchTitan splits num_layers + the embedding's and the output's weights (first/last_stage_less_layers,
        # 1 and 1 by default) evenly over the stages (torchtitan/distributed/pipeline_parallel.py
        # _generate_llm_fqn_per_model_part): Megatron's account_for_*_in_pipeline_split, written either way
        if p.first_stage_layers is not None or p.last_stage_layers is not None:
            raise _refuse("TorchTitan", "parallel.first_stage_layers" if p.first_stage_layers is not None else
                          "parallel.last_stage_layers", "a first or last stage of its own size (TorchTitan's "
                          "generated split weighs only the embedding and the output)")
        lines += [f'pipeline_parallel_schedule = "{TORCHTITAN_SCHEDULES[s.schedule]}"',
                  f"pipeline_parallel_microbatch_size = {t.micro_batch}",
                  f"pipeline_parallel_first_stage_less_layers = {int(p.account_for_embedding_in_pipeline_split)}",
                  f"pipeline_parallel_last_stage_less_layers = {int(p.account_for_loss_in_pipeline_split)}"]
        if p.vpp > 1:  # TorchTitan: ceil((num_layers + both weights) / this) stages, the scenario's pp x vpp
            lines.append(f"pipeline_parallel_layers_per_stage = {d.layers_per_chunk}")
    recompute, option = t.recompute, "op"
    stage_layers = s.model.num_layers // p.pp
    if recompute == "full" and t.recompute_num_layers is not None and t.recompute_num_layers < stage_layers:
        # some of a stage's blocks: TorchTitan checkpoints every N-th block (selective_ac_option = N, which `sim
        # import torchtitan` reads as stage layers // N recomputed); mode "full" would recompute every block
        if stage_layers % t.recompute_num_layers:
            raise _refuse("TorchTitan", "training.recompute_num_layers", f"{t.recompute_num_layers} of a stage's "
                          f"{stage_layers} blocks (selective_ac_option checkpoints every N-th block: "
                          f"{stage_layers} / N)")
        recompute, option = "selective", str(stage_layers // t.recompute_num_layers)
    lines += ["", "[activation_checkpoint]", f'mode = "{recompute}"']
    if recompute == "selective":
        lines.append(f'selective_ac_option = "{option}"')
    components = _torchtitan_compiled(s)
    if components:
        lines += ["", "[compile]", "enable = true", f"components = {json.dumps(components)}"]
    lines += float8
    launch = (f"torchrun --nproc_per_node {s.cluster.gpus_per_node} --nnodes {s.cluster.nodes} -m torchtitan.train "
              "--job.config_file JOB.toml")
    return Emitted("\n".join(lines) + "\n", ".toml", launch)


# What the TorchTitan TOML can say about the kernels, at pytorch/torchtitan e347b1e5e (2026-02-15, the last commit
# with TOML job configs; torchtitan/config/job_config.py), each read back by sim.interop.torchtitan.


def _torchtitan_attention(s: Scenario) -> list[str]:
    """The attention kernel: the TOML has no setting for it. The llama3 flavors run ``attn_type`` sdpa
    (torchtitan/models/llama3/__init__.py), ``F.scaled_dot_product_attention`` under the backend order in
    torchtitan/models/attention.py's ScaledDotProductAttentionWrapper (code, not configuration), which `sim import
    torchtitan` reads as FlashAttention-2. cuDNN's fused attention asked for explicitly is refused; unfused attention
    (``flash_attention: false``) is every scenario's default, and so is ``attention_backend: auto``, which with fused
    kernels prices cuDNN's (``resolve_attention_backend``) where the import back prices FlashAttention-2: each is
    written as a comment naming its field, not refused."""
    t = s.training
    if t.flash_attention and t.attention_backend == "fused":
        raise _refuse("TorchTitan", "training.attention_backend", "fused (cuDNN's fused attention): the job config "
                      "has no attention kernel setting (SDPA's backend order is code, torchtitan/models/attention.py)")
    if not t.flash_attention:
        return ["# attention: TorchTitan runs F.scaled_dot_product_attention (flash); the scenario priced unfused "
                "attention (training.flash_attention false), which TorchTitan has no setting for"]
    if resolve_attention_backend(t.attention_backend, t.fused_kernels) == "fused":
        # SDPA's order is TorchTitan's code: cuDNN first at e347b1e5e (from 6a3a9da95), FlashAttention-2 first in the
        # December 2024 version `sim import torchtitan` reads (docs/ecosystem.md), so the import prices flash
        return ["# attention: the flavor's SDPA picks the kernel (cuDNN first at e347b1e5e, FlashAttention-2 before "
                "6a3a9da95, which `sim import torchtitan` prices); the scenario priced cuDNN's fused attention "
                "(training.attention_backend auto with fused kernels), which TorchTitan has no setting for"]
    return []


def _torchtitan_compiled(s: Scenario) -> list[str]:
    """``[compile] components``: "model" for fused element-wise kernels (training.fused_kernels), "loss" for the
    fused loss. TorchTitan's loss upcasts the logits (torchtitan/components/loss.py cross_entropy_loss:
    ``F.cross_entropy(pred.float(), ...)``) and is compiled when "loss" is in components (build_cross_entropy_loss):
    eager it holds the fp32 copy and log_softmax's output (training.cross_entropy hf, as transformers' loss);
    compiled, Inductor fuses the upcast into the reductions (fused). Megatron-Core's vocab-parallel loss is refused."""
    t = s.training
    if t.cross_entropy == "megatron":
        raise _refuse("TorchTitan", "training.cross_entropy", "megatron (Megatron-Core's unfused vocab-parallel loss): "
                      "TorchTitan's loss is F.cross_entropy on upcast logits, eager (hf) or compiled (fused)")
    return (["model"] if t.fused_kernels else []) + (["loss"] if t.cross_entropy == "fused" else [])


def _torchtitan_float8(s: Scenario, shard: int) -> list[str]:
    """FP8's weight cast (training.fp8_weight_cache): torchao's Float8Linear casts each weight in every forward;
    with ``[quantize.linear.float8] enable_fsdp_float8_all_gather`` (and precomputed scales, as TorchTitan's 405B
    config sets them) FSDP casts each weight's shard before its all-gather instead (torchao fsdp_pre_all_gather),
    once per gather: the cached cast. Without FSDP sharding there is no gather to cast before: refused."""
    t = s.training
    if t.dtype != "fp8" or not t.fp8_weight_cache:
        return []
    if shard <= 1:
        raise _refuse("TorchTitan", "training.fp8_weight_cache", "FP8 weights cast once and reused without FSDP "
                      "sharding (Float8Linear casts each weight in every forward; only FSDP's float8 all-gather casts "
                      "once per gather): set training.fp8_weight_cache false")
    return ["", "[quantize.linear.float8]", "enable_fsdp_float8_all_gather = true",
            "precompute_float8_dynamic_scale_for_fsdp = true"]


def _deepspeed(s: Scenario) -> Emitted:
    d, p, t = degrees(s), s.parallel, s.training
    if p.tp > 1 or p.pp > 1 or p.cp > 1:
        knob = "parallel.tp" if p.tp > 1 else "parallel.pp" if p.pp > 1 else "parallel.cp"
        raise _refuse("a DeepSpeed ZeRO run under the HF Trainer", knob,
                      f"tp {p.tp} x pp {p.pp} x cp {p.cp}: ZeRO data parallelism only")
    if t.recompute == "selective":
        raise _refuse("the HF Trainer", "training.recompute", "selective recompute")
    if s.fsdp is not None:
        raise _refuse("DeepSpeed", "fsdp", "PyTorch FSDP")
    if t.dtype == "fp8":  # its config has bf16 and fp16 sections only (FP8 needs Transformer Engine's modules)
        raise _refuse("DeepSpeed", "training.dtype", "fp8 GEMMs (bf16 would run instead)")
    _optimizer_states(s, "DeepSpeed")
    _moe_refusals(s, "a DeepSpeed ZeRO run under the HF Trainer", expert_parallel=False)
    accumulation = d.microbatches
    config: dict[str, object] = {
        "train_batch_size": d.global_batch, "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": accumulation, "gradient_clipping": t.clip_grad,
        "bf16": {"enabled": t.dtype == "bf16"}, "fp16": {"enabled": t.dtype == "fp16"},
        "zero_optimization": {"stage": d.zero_stage, "overlap_comm": p.overlap_grad_reduce,
                              "offload_optimizer": {"device": "cpu" if s.offload.optimizer else "none"},
                              "offload_param": {"device": "cpu" if s.offload.params else "none"}}}
    zero_block = config["zero_optimization"]
    assert isinstance(zero_block, dict)
    if s.deepspeed is not None:
        zero_block.update(s.deepspeed.model_dump())
    else:
        zero_block["reduce_bucket_size"] = p.dp_bucket_size / 2  # elements of 2 bytes (the scenario's reading)
    trainer = [f"--per_device_train_batch_size {t.micro_batch}", f"--gradient_accumulation_steps {accumulation}",
               f"--max_seq_length {d.seq_len}"]
    if t.recompute == "full":
        trainer.append("--gradient_checkpointing")
    if t.dtype == "bf16":
        trainer.append("--bf16")
    elif t.dtype == "fp16":
        trainer.append("--fp16")
    trainer += _hf_kernels(s)
    launch = (f"deepspeed --num_gpus {s.cluster.gpus_per_node} --num_nodes {s.cluster.nodes} train.py "
              f"--deepspeed ds_config.json --model_name_or_path {s.model.name} " + " ".join(trainer))
    return Emitted(json.dumps(config, indent=2) + "\n", ".json", launch)


def _hf_kernels(s: Scenario) -> list[str]:
    """The attention and loss the scenario priced as the HF Trainer's arguments. Attention: the training script's
    ``--attn_implementation`` (transformers: eager, or sdpa, its default, which `sim import deepspeed` reads as
    FlashAttention-2); transformers has no cuDNN attention to ask for, so ``attention_backend: fused`` is refused.
    Loss: transformers' ForCausalLMLoss upcasts the logits (training.cross_entropy hf) unless ``--use_liger_kernel``
    patches the model with Liger's kernels (transformers integrations/liger.py at dd7a585c07 passes
    liger_kernel_config, empty by default, to Liger's _apply_liger_kernel_to_instance: for Llama its fused linear
    cross entropy, which never holds the logits (fused), with its RMSNorm, RoPE and SwiGLU kernels). Megatron-Core's
    loss, and the fused loss with unfused norms and RoPE (``fused_norm_rope: false``), are refused."""
    t = s.training
    trainer = "the HF Trainer"
    if t.flash_attention and t.attention_backend == "fused":
        raise _refuse(trainer, "training.attention_backend", "fused (cuDNN's fused attention): transformers' "
                      "attn_implementation is eager, sdpa (FlashAttention-2 first) or flash_attention_2/3")
    flags = [f"--attn_implementation {'sdpa' if t.flash_attention else 'eager'}"]
    if t.cross_entropy == "megatron":
        raise _refuse(trainer, "training.cross_entropy", "megatron (Megatron-Core's unfused vocab-parallel loss): "
                      "transformers' loss (hf) or Liger's fused linear cross entropy (fused)")
    if t.cross_entropy == "fused":
        if t.fused_norm_rope is False:
            raise _refuse(trainer, "training.fused_norm_rope", "false with the fused loss: --use_liger_kernel "
                          "patches Liger's RMSNorm and RoPE kernels in with its fused linear cross entropy")
        flags.append("--use_liger_kernel")
    return flags
