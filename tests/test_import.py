"""``sim import``: launch configurations from the frameworks' own public examples -> scenarios (issue 26).

Each input is copied unchanged into tests/data/ecosystem/ (sources in tests/data/README.md). The tests assert every
mapped field of the imported scenario, that ``sim check``'s validation accepts it, the report's statuses, and the
refusals (one line naming the flag).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.cli.commands import main
from sim.errors import ConfigError
from sim.interop.draft import Draft, Options
from sim.interop.megatron import import_megatron
from sim.interop.megatron_args import script_tokens

from conftest import ROOT

DATA = ROOT / "tests" / "data" / "ecosystem"


def _status(draft: Draft, source: str) -> str:
    return next(row.status for row in draft.rows if row.source == source)


def test_megatron_llama3_8b_fp8_script() -> None:
    """examples/llama/train_llama3_8b_h100_fp8.sh: 8 GPUs (torchrun), FP8 hybrid, distributed optimizer with both
    overlaps, GQA 8 groups, SwiGLU 14336, RMSNorm, RoPE, untied, no biases, vocabulary 128256."""
    draft = import_megatron([str(DATA / "megatron_train_llama3_8b_h100_fp8.sh")], Options(gpu="H100-SXM"))
    s = draft.scenario()
    assert (s.cluster.gpu.name, s.cluster.nodes, s.cluster.gpus_per_node) == ("H100-SXM", 1, 8)
    assert (s.parallel.tp, s.parallel.pp, s.parallel.vpp, s.parallel.zero) == (1, 1, 1, 1)
    assert s.parallel.overlap_grad_reduce and s.parallel.overlap_param_gather and s.parallel.align_param_gather
    assert not s.parallel.sequence_parallel  # --sequence-parallel with tp 1: Megatron-LM turns it off
    assert (s.training.dtype, s.training.grad_dtype) == ("fp8", "bf16")
    assert (s.training.micro_batch, s.training.global_batch, s.training.seq_len) == (1, 128, 8192)
    assert s.training.flash_attention and s.training.clip_grad == 1.0 and s.training.recompute == "none"
    m = s.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size) == \
        (32, 4096, 32, 8, 14336)
    assert (m.mlp, m.norm, m.position_embedding, m.tied_embeddings, m.bias) == ("swiglu", "rmsnorm", "rope", False,
                                                                               False)
    assert (m.vocab_size, m.max_seq_len) == (128256, 8192)
    assert _status(draft, "--sequence-parallel") == "ignored"
    assert _status(draft, "--lr") == "ignored"
    assert _status(draft, "--fp8-param-gather") == "ignored"
    assert _status(draft, "--align-param-gather") == "default"


def test_megatron_gpt3_175b_script_pads_nothing_and_takes_nodes() -> None:
    """examples/gpt3/train_gpt3_175b_distributed.sh on 128 nodes: tp 8 x pp 16, fp16, the 1536 batch; the script's
    NUM_NODES=1 is overridden by --nodes; Megatron's defaults (GELU, LayerNorm, learned positions, tied, biases,
    overlap_grad_reduce off) are written out; the vocabulary comes from the preset (51200, a multiple of 128 x 8)."""
    draft = import_megatron([str(DATA / "megatron_train_gpt3_175b_distributed.sh")],
                            Options(gpu="A100-80GB-SXM", nodes=128, model="gpt3-175b"))
    s = draft.scenario()
    assert s.cluster.num_gpus == 1024
    assert (s.parallel.tp, s.parallel.pp, s.parallel.zero, s.parallel.overlap_grad_reduce) == (8, 16, 0, False)
    assert (s.training.dtype, s.training.micro_batch, s.training.global_batch, s.training.seq_len) == \
        ("fp16", 1, 1536, 2048)
    m = s.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.vocab_size) == \
        (96, 12288, 96, 4 * 12288, 51200)
    assert (m.mlp, m.norm, m.position_embedding, m.tied_embeddings, m.bias) == ("gelu", "layernorm", "learned", True,
                                                                               True)
    assert draft.data["model"] == "gpt3-175b"  # the flags describe the preset exactly
    assert _status(draft, "--step-batch-size-schedule") == "ignored"
    assert _status(draft, "--overlap-grad-reduce") == "default"


def test_megatron_mixtral_script() -> None:
    """examples/mixtral/train_mixtral_8x7b_distributed.sh on 8 nodes: pp 4, ep 8, 8 experts top-2, alltoall."""
    draft = import_megatron([str(DATA / "megatron_train_mixtral_8x7b_distributed.sh")],
                            Options(gpu="H100-SXM", nodes=8, model="mixtral-8x7b"))
    s = draft.scenario()
    assert (s.parallel.tp, s.parallel.pp, s.parallel.ep, s.parallel.zero) == (1, 4, 8, 1)
    assert (s.model.num_moe_experts, s.model.moe_router_topk, s.moe.token_dispatcher) == (8, 2, "alltoall")
    assert (s.training.dtype, s.training.global_batch, s.training.seq_len) == ("bf16", 256, 4096)
    assert draft.data["model"] == "mixtral-8x7b"


def test_megatron_arguments_and_vocabulary_padding() -> None:
    """Arguments given directly: interleaving from layers per virtual stage, selective recompute, GQA, and the
    vocabulary padded as Megatron-LM pads it (50257 -> a multiple of 128 x tp 4 = 50688)."""
    args = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
            "--sequence-parallel --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --group-query-attention "
            "--num-query-groups 4 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 2 "
            "--global-batch-size 64 --vocab-size 50257 --bf16 --recompute-granularity selective "
            "--use-distributed-optimizer --some-new-flag 3").split()
    draft = import_megatron(args, Options(gpu="H100-SXM", gpus=16))
    s = draft.scenario()
    assert (s.parallel.tp, s.parallel.pp, s.parallel.vpp, s.schedule) == (4, 2, 6, "interleaved")
    assert s.parallel.sequence_parallel and s.parallel.overlap_p2p_comm
    assert (s.training.recompute, s.training.micro_batch, s.training.global_batch) == ("selective", 2, 64)
    assert (s.model.num_kv_heads, s.model.vocab_size, s.model.ffn_hidden_size, s.model.mlp) == (4, 50688, 8192,
                                                                                              "gelu")
    assert _status(draft, "--some-new-flag") == "unknown"



@pytest.mark.parametrize("flags, flash, backend", [
    ("", True, "auto"),
    ("--attention-backend auto", True, "auto"),
    ("--attention-backend flash", True, "flash"),
    ("--attention-backend fused", True, "fused"),
    ("--attention-backend unfused", False, "auto"),
    ("--use-flash-attn", True, "auto"),
])
def test_megatron_attention_backend_picks_the_priced_kernel(flags: str, flash: bool, backend: str) -> None:
    """--attention-backend flash runs FlashAttention-2 and fused cuDNN's fused attention (Megatron-Core
    AttnBackend; TE's DotProductAttention with NVTE_FLASH_ATTN / NVTE_FUSED_ATTN): the scenario's
    training.attention_backend, which picks the measured curve the kernel is priced on (an H100's cuDNN forward
    runs ~2x FlashAttention-2's rate). auto stays auto (TE picks fused on Hopper: resolve_attention_backend)."""
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
    s = import_megatron((base + flags).split(), Options(gpu="H100-SXM", gpus=8)).scenario()
    assert (s.training.flash_attention, s.training.attention_backend) == (flash, backend)


@pytest.mark.parametrize("backend", ["flash", "fused", "auto"])
def test_megatron_emit_keeps_the_attention_backend(backend: str, tmp_path: Path) -> None:
    """`sim search --emit megatron` writes the scenario's attention backend, so the script runs (and imports
    back to) the kernel the layout was priced on."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "tiny.yaml", ["training.flash_attention=true",
                                                                f"training.attention_backend={backend}"])
    path = tmp_path / "emitted.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert (back.training.flash_attention, back.training.attention_backend) == (True, backend)

@pytest.mark.parametrize("args, message", [
    ("--fp16 --bf16", "--fp16: cannot be combined with --bf16"),
    ("--num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
     "--num-layers-per-virtual-pipeline-stage: cannot be combined with --num-virtual-stages-per-pipeline-rank"),
    ("--overlap-param-gather --overlap-grad-reduce", "--overlap-param-gather: needs --use-distributed-optimizer"),
    ("--use-distributed-optimizer --overlap-param-gather", "--overlap-param-gather: needs --overlap-grad-reduce"),
    ("--recompute-granularity selective --recompute-method block", "--recompute-method: not with"),
    ("--tensor-model-parallel-size 3",
     "tp*pp = 3 does not divide the cluster's 8 GPUs (set by --tensor-model-parallel-size)"),
    ("--global-batch-size 7", "(set by --global-batch-size)"),
])
def test_megatron_contradictions_are_one_line(args: str, message: str) -> None:
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
    flags = (base.replace("--bf16 ", "") if "--bf16" in args else base) + args
    with pytest.raises(ConfigError) as error:
        import_megatron(flags.split(), Options(gpu="H100-SXM", gpus=8)).scenario()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_script_variables_and_quoted_array_entries() -> None:
    """The launch scripts' bash: ${NAME:-default}, $NAME, and "--flag value" quoted in an array."""
    tokens = script_tokens('TP=${TP:-4}\nA=(\n "--fp8-format hybrid"\n --tensor-model-parallel-size $TP # c\n)\n')
    assert tokens == ["A=(", "--fp8-format", "hybrid", "--tensor-model-parallel-size", "4", ")"]


def test_cli_import_writes_a_scenario_sim_check_accepts(tmp_path: Path) -> None:
    out = tmp_path / "llama.yaml"
    code = main(["import", "megatron", str(DATA / "megatron_train_llama3_8b_h100_fp8.sh"), "--gpu", "H100-SXM",
                 "-o", str(out)])
    assert code == 0
    assert yaml.safe_load(out.read_text())["parallel"]["zero"] == 1
    assert main(["check", str(out)]) == 0
    # A framework's flags straight on the command line, and a refusal's exit code.
    assert main(["import", "megatron", "--gpu", "H100-SXM", "--gpus", "8", "--model", "llama3-8b", "-o", str(out),
                 "--tensor-model-parallel-size", "2", "--bf16"]) == 0
    assert yaml.safe_load(out.read_text())["parallel"]["tp"] == 2
    assert main(["import", "megatron", "--gpu", "H100-SXM", "--gpus", "8", "--model", "llama3-8b", "-o", str(out),
                 "--fp16", "--bf16"]) == 2


def test_only_the_cli_imports_interop() -> None:
    """The importers are the command line's: no other layer of sim imports sim.interop (issue 26's rule)."""
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "sim").rglob("*.py")
                 if "sim.interop" in path.read_text() and path.parts[-2] not in ("cli", "interop")]
    assert offenders == []


def test_nemo_gpt3_175b_recipe() -> None:
    """NeMo-Framework-Launcher conf/training/gpt3/175b.yaml (NeMo 1.x): 128 nodes x 8, tp 4 x pp 8 x 6 virtual
    stages, sequence parallel, the mcore distributed optimizer with both overlaps, bf16; ffn_hidden_size is the
    interpolation ${multiply:4, ${.hidden_size}}; GPT-2's BPE vocabulary padded. The recipe's bucket_cap_mb 220 is
    not what runs: NeMo hands Megatron-Core's DDP ``model.optim.ddp_bucket_size`` (None here), so its default
    max(40e6, 1e6 x dp 32) = 40e6 fp32 gradients buckets them (megatron_gpt_model.py
    setup_mcore_distributed_parallel: "mcore bucket_size is based on num of parameters, therefore not using
    bucket_cap_mb")."""
    from sim.interop.nemo import import_nemo

    draft = import_nemo([str(DATA / "nemo_gpt3_175b.yaml")], Options(gpu="H100-SXM"))
    s = draft.scenario()
    assert (s.cluster.nodes, s.cluster.gpus_per_node) == (128, 8)
    assert (s.parallel.tp, s.parallel.pp, s.parallel.vpp, s.schedule) == (4, 8, 6, "interleaved")
    assert s.parallel.sequence_parallel and s.parallel.overlap_p2p_comm and s.parallel.zero == 1
    assert s.parallel.overlap_grad_reduce and s.parallel.overlap_param_gather and s.parallel.align_param_gather
    assert s.parallel.dp_bucket_size == 160_000_000 and s.parallel.grad_bucket_view
    assert _status(draft, "model.optim.bucket_cap_mb") == "ignored"
    assert (s.training.dtype, s.training.micro_batch, s.training.global_batch, s.training.seq_len) == \
        ("bf16", 1, 2048, 2048)
    m = s.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.vocab_size) == \
        (96, 12288, 96, 49152, 50688)
    assert (m.mlp, m.norm, m.position_embedding, m.tied_embeddings, m.bias) == ("gelu", "layernorm", "learned", True,
                                                                               True)


def test_nemo_llama2_recipes() -> None:
    """conf/training/llama/llama2_7b.yaml (16 nodes, tp 1, mcore_distributed_optim) and llama2_70b.yaml (tp 4 x pp 4
    x 5 virtual stages, TP communication overlap): the Llama shape from the keys, the vocabulary from --model,
    padded by NeMo's make_vocab_size_divisible_by x tp (32000 -> 32256 at tp 4)."""
    from sim.interop.nemo import import_nemo

    draft = import_nemo([str(DATA / "nemo_llama2_7b.yaml")], Options(gpu="H100-SXM", model="llama2-7b"))
    s = draft.scenario()
    assert s.cluster.num_gpus == 128 and (s.parallel.tp, s.parallel.pp, s.parallel.zero) == (1, 1, 1)
    assert s.parallel.align_param_gather  # Megatron-Core's optimizer: every bucket's gather at the step start
    assert (s.training.global_batch, s.training.seq_len, s.training.flash_attention) == (2048, 4096, True)
    assert draft.data["model"] == "llama2-7b"
    draft = import_nemo([str(DATA / "nemo_llama2_70b.yaml")], Options(gpu="H100-SXM", model="llama2-70b"))
    s = draft.scenario()
    assert (s.parallel.tp, s.parallel.pp, s.parallel.vpp, s.parallel.tp_comm_overlap) == (4, 4, 5, True)
    assert (s.model.num_kv_heads, s.model.ffn_hidden_size, s.model.vocab_size) == (8, 28672, 32256)
    assert _status(draft, "model.optim.lr") == "ignored"


def test_nemo2_layout_and_contradiction(tmp_path: Path) -> None:
    """A NeMo 2.0 config as NeMo-Run writes it: trainer.strategy, its ddp block, plugins.precision, model.config,
    data; and a precision the simulator does not model named by its key."""
    from sim.interop.nemo import import_nemo

    config = {"trainer": {"num_nodes": 2, "devices": 8, "strategy": {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "sequence_parallel": True,
        "ddp": {"overlap_grad_reduce": True, "overlap_param_gather": True, "use_distributed_optimizer": True}},
        "plugins": {"precision": "bf16-mixed"}},
        "model": {"config": {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
                             "num_attention_heads": 32, "num_query_groups": 8, "gated_linear_unit": True,
                             "normalization": "RMSNorm", "position_embedding_type": "rope",
                             "share_embeddings_and_output_weights": False, "add_bias_linear": False}},
        "data": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 128}}
    path = tmp_path / "nemo2.yaml"
    path.write_text(yaml.safe_dump(config))
    s = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama3-8b")).scenario()
    assert (s.cluster.num_gpus, s.parallel.tp, s.parallel.pp, s.parallel.zero) == (16, 2, 2, 1)
    assert s.parallel.overlap_param_gather and s.parallel.sequence_parallel
    assert (s.training.dtype, s.training.seq_len, s.training.global_batch) == ("bf16", 8192, 128)
    assert (s.model.mlp, s.model.num_kv_heads, s.model.vocab_size) == ("swiglu", 8, 128256)
    assert s.training.attention_backend == "auto"
    for written, backend in (("flash", "flash"), ("AttnBackend.fused", "fused"), ("unfused", "auto")):
        config["model"]["config"]["attention_backend"] = written  # Megatron-Core TransformerConfig's field
        path.write_text(yaml.safe_dump(config))
        s = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama3-8b")).scenario()
        assert (s.training.attention_backend, s.training.flash_attention) == (backend, written != "unfused")
    del config["model"]["config"]["attention_backend"]
    config["trainer"]["plugins"]["precision"] = "fp8-mixed"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"^trainer.plugins.precision: 'fp8-mixed' is not modelled"):
        import_nemo([str(path)], Options(gpu="H100-SXM", model="llama3-8b"))


def test_deepspeed_hf_zero3_with_auto_values() -> None:
    """The HF DeepSpeed guide's ZeRO-3 config (CPU offload, every size "auto") with the Trainer's arguments: the
    micro-batch, accumulation and global batch from them (4 x 2 x 8 GPUs = 64), bf16 from --bf16 (the file has only
    an fp16 section, "auto" -> off), clipping from max_grad_norm's default 1.0, and the hidden-size values of
    transformers' trainer_config_finalize for Llama-2 7B (h = 4096): 4096^2, 0.9 x 4096^2, 10 x 4096."""
    from sim.interop.deepspeed import import_deepspeed

    trainer = "--per_device_train_batch_size 4 --gradient_accumulation_steps 2 --bf16 --gradient_checkpointing " \
              "--max_seq_length 4096 --learning_rate 2e-5"
    draft = import_deepspeed([str(DATA / "deepspeed_hf_zero3.json"), *trainer.split()],
                             Options(gpu="H100-SXM", gpus=8, model="llama2-7b"))
    s = draft.scenario()
    assert (s.training.micro_batch, s.training.global_batch, s.training.seq_len) == (4, 64, 4096)
    assert (s.training.dtype, s.training.clip_grad, s.training.recompute) == ("bf16", 1.0, "full")
    assert s.parallel.zero == 3 and s.parallel.overlap_grad_reduce and s.offload.optimizer and s.offload.params
    assert s.deepspeed is not None
    assert s.deepspeed.reduce_bucket_size == 4096**2
    assert s.deepspeed.stage3_prefetch_bucket_size == int(0.9 * 4096**2)
    assert s.deepspeed.stage3_param_persistence_threshold == 40960
    assert s.deepspeed.stage3_max_live_parameters == 1e9
    assert s.parallel.dp_bucket_size == 2 * 4096**2  # elements x 2 bytes
    assert (s.training.flash_attention, s.training.fused_kernels) == (True, False)
    assert _status(draft, "zero_optimization.stage3_gather_16bit_weights_on_model_save") == "ignored"
    assert _status(draft, "--learning_rate") == "ignored"


def test_deepspeed_import_prices_hugging_faces_loss() -> None:
    """A DeepSpeed run under the HF Trainer computes transformers' loss (ForCausalLMLoss: ``logits.float()``, then
    log_softmax and nll_loss in fp32), which ``training.cross_entropy: hf`` prices (docs/mechanisms/loss_head.md:
    4 bytes per logit held, 12 at the backward's peak, and the upcast kernel); the import left the field at its
    ``fused`` default (no logits held), as the Megatron and NeMo imports no longer do for their own losses. Llama-2
    7B at 4,096 tokens, micro-batch 4: 16,384 x 32,000 logits x 12 bytes = 6.3 GB at the head's backward."""
    from sim.interop.deepspeed import import_deepspeed
    from sim.plan import resolve

    trainer = "--per_device_train_batch_size 4 --gradient_accumulation_steps 2 --bf16 --max_seq_length 4096"
    draft = import_deepspeed([str(DATA / "deepspeed_hf_zero3.json"), *trainer.split()],
                             Options(gpu="H100-SXM", gpus=8, model="llama2-7b"))
    s = draft.scenario()
    assert s.training.cross_entropy == "hf"
    assert _status(draft, "(HF Trainer) loss") == "default"
    assert resolve(s).transient_bytes(0) == pytest.approx(4 * 4096 * 32_000 * 12)


def test_deepspeed_numbers_the_batch_rule_and_refusals(tmp_path: Path) -> None:
    """DeepSpeed's batch rule (train_batch_size = micro x accumulation x world size) gives the world size when
    no GPU count is given, and a config that breaks it is refused naming train_batch_size; NVMe offload, FSDP
    beside DeepSpeed and an "auto" without the model are each one line."""
    from sim.interop.deepspeed import import_deepspeed

    path = tmp_path / "ds_config.json"
    config = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
              "bf16": {"enabled": True}, "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}
    path.write_text(json.dumps(config))
    s = import_deepspeed([str(path)], Options(gpu="A100-80GB-SXM", model="llama2-7b")).scenario()
    assert (s.cluster.num_gpus, s.training.global_batch, s.training.microbatches or 8) == (16, 256, 8)
    assert s.parallel.zero == 2 and not s.parallel.overlap_grad_reduce  # overlap_comm's default at stage 2
    with pytest.raises(ConfigError, match=r"^train_batch_size: 256 != .* x 32 GPUs = 512"):
        import_deepspeed([str(path)], Options(gpu="A100-80GB-SXM", gpus=32, model="llama2-7b"))
    with pytest.raises(ConfigError, match=r"^--fsdp: the HF Trainer runs DeepSpeed"):
        import_deepspeed([str(path), "--fsdp", "full_shard auto_wrap"], Options(gpu="H100-SXM", model="llama2-7b"))
    with pytest.raises(ConfigError, match=r"^--model: a DeepSpeed config has no model"):
        import_deepspeed([str(path)], Options(gpu="H100-SXM"))
    with pytest.raises(ConfigError, match=r"^zero_optimization.offload_optimizer.device: 'nvme' offload is not"):
        import_deepspeed([str(DATA / "deepspeed_hf_zero3_nvme.json")], Options(gpu="H100-SXM", gpus=8,
                                                                              model="llama2-7b"))


def test_torchtitan_llama3_tomls() -> None:
    """TorchTitan's llama3 train_configs on 64 H100: 8B is FSDP over all 64 (dp_shard -1), local batch 1,
    selective op-level SAC; 70B is TP 8 (with sequence-parallel norms) x FSDP 8, local batch 8, full AC; 405B adds
    async TP, Float8 linears and torch.compile."""
    from sim.interop.torchtitan import import_torchtitan

    s = import_torchtitan([str(DATA / "torchtitan_llama3_8b.toml")], Options(gpu="H100-SXM", gpus=64)).scenario()
    assert (s.model.name, s.parallel.tp, s.parallel.pp, s.parallel.dp) == ("llama3-8b", 1, 1, 64)
    assert s.fsdp is not None and s.fsdp.sharding == "FULL_SHARD" and s.fsdp.version == 2  # fully_shard (FSDP2)
    assert (s.training.micro_batch, s.training.global_batch, s.training.seq_len) == (1, 64, 8192)
    assert (s.training.dtype, s.training.grad_dtype, s.training.recompute, s.training.clip_grad) == \
        ("bf16", "fp32", "selective", 1.0)
    assert (s.training.fused_kernels, s.training.flash_attention) == (False, True)
    s = import_torchtitan([str(DATA / "torchtitan_llama3_70b.toml")], Options(gpu="H100-SXM", gpus=64)).scenario()
    assert (s.model.name, s.parallel.tp, s.parallel.dp, s.parallel.sequence_parallel) == ("llama3-70b", 8, 8, True)
    assert (s.training.micro_batch, s.training.global_batch, s.training.recompute) == (8, 64, "full")
    draft = import_torchtitan([str(DATA / "torchtitan_llama3_405b.toml")], Options(gpu="H100-SXM", gpus=64))
    s = draft.scenario()
    assert (s.model.name, s.parallel.tp, s.parallel.tp_comm_overlap, s.training.dtype) == ("llama3-405b", 8, True,
                                                                                            "fp8")
    assert s.parallel.tp_comm_overlap_method == "async_tp"  # PyTorch's AsyncTP, not TE's userbuffers
    assert (s.training.micro_batch, s.training.global_batch, s.training.fused_kernels) == (2, 16, True)
    # FSDP's float8 all-gather with precomputed scales: each weight's shard cast once per gather, the cached cast
    # (tests/test_emit_kernels.py); it was read as a cast per forward with the key unmapped
    assert s.training.fp8_weight_cache and s.training.fp8_recipe == "current"
    assert _status(draft, "quantize.linear.float8.enable_fsdp_float8_all_gather") == "mapped"


@pytest.mark.parametrize(("base", "overrides"), [
    # TorchTitan's own Llama 3.1 405B rows: 126 layers, pp 8 (1 stage per rank) and pp 8 x 2 (interleaved)
    ("validation/fsdp_pp/torchtitan-llama3.1-405b-h100-512-1f1b.yaml", []),
    ("validation/fsdp_pp/torchtitan-llama3.1-405b-h100-512-interleaved.yaml", []),
    # an even split of 32 layers over 4 stages (no account_for_*): 8 each, which TorchTitan runs only with the
    # embedding's and output's weights set to 0 (by default 34 over 4: 8, 9, 8, 7 layers)
    ("llama2-7b_h100-32_spine.yaml", ["parallel.pp=4", "parallel.dp=null", "parallel.tp=8", "schedule=1f1b"]),
])
def test_torchtitan_round_trips_the_pipeline_split(base: str, overrides: list[str], tmp_path: Path) -> None:
    """TorchTitan splits num_layers + pipeline_parallel_first_stage_less_layers + ..._last_stage_less_layers (1 and 1
    by default: the embedding and the output count as a layer each) evenly over pp x stages per rank
    (torchtitan/distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part; 9dec370's generate_split_points
    gave the 405B rows' 15, 16 x 6, 15), and a multi-stage schedule's stages from ceil((num_layers + both weights) /
    pipeline_parallel_layers_per_stage): Megatron-Core's account_for_embedding/loss_in_pipeline_split. The import
    read neither (both weights listed as harmless), so TorchTitan's own 405B configurations were refused ('pp 8 does
    not divide 126') and vpp read as 126 // (8 x 8) = 1; the emitter wrote no weights, so an even split ran
    TorchTitan's default one. Emitted and imported back: the same stages, each with the same layers."""
    from sim.interop.emit import emit
    from sim.interop.torchtitan import import_torchtitan
    from sim.plan import resolve
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / base, overrides)
    text = emit(scenario, "torchtitan").text
    weight = int(scenario.parallel.account_for_embedding_in_pipeline_split)
    assert f"pipeline_parallel_first_stage_less_layers = {weight}" in text.splitlines()
    path = tmp_path / "job.toml"
    path.write_text(text)
    back = import_torchtitan([str(path)], Options(gpu=scenario.cluster.gpu.name, gpus=scenario.cluster.num_gpus,
                                                   model=resolve(scenario).model.name)).scenario()
    plan, plan_back = resolve(scenario), resolve(back)
    assert (plan_back.pp, plan_back.vpp) == (plan.pp, plan.vpp)
    assert [[plan_back.chunk_layers(c) for c in chunks] for chunks in plan_back.stage_chunks] == \
        [[plan.chunk_layers(c) for c in chunks] for chunks in plan.stage_chunks]


def test_torchtitan_hsdp_ddp_and_refusals(tmp_path: Path) -> None:
    from sim.interop.torchtitan import import_torchtitan

    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\n'
                    'global_batch_size = 64\n[parallelism]\ndata_parallel_replicate_degree = 2\n'
                    'data_parallel_shard_degree = 8\n')
    s = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=16)).scenario()
    assert s.fsdp is not None and s.fsdp.sharding == "HYBRID_SHARD" and s.parallel.dp == 16
    assert (s.training.global_batch, s.training.micro_batch) == (64, 2)  # 2 accumulation steps
    path.write_text('[model]\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = 8\n'
                    'data_parallel_shard_degree = 1\n')
    s = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=8)).scenario()
    assert s.fsdp is None and s.parallel.zero == 0 and s.parallel.dp == 8
    with pytest.raises(ConfigError, match=r"^parallelism.data_parallel_shard_degree: dp_replicate 8 x dp_shard 1"):
        import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=16))
    path.write_text('[model]\nflavor = "debugmodel"\n')
    with pytest.raises(ConfigError, match=r"^model.flavor: llama3 debugmodel is not a preset"):
        import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=8))


def _layout(s: Any) -> tuple[Any, ...]:
    from sim.spec.degrees import degrees

    d = degrees(s)
    return (d.num_gpus, d.tp, d.pp, d.dp, d.vpp, d.micro_batch, d.global_batch, d.seq_len, d.zero_stage, d.ep,
            s.parallel.cp, s.parallel.cp_comm_type if s.parallel.cp > 1 else None,
            s.training.recompute, s.parallel.sequence_parallel, s.schedule, s.training.dtype)


@pytest.mark.parametrize("framework, base, model", [
    ("megatron", "tiny.yaml", None),
    ("megatron", "llama2-7b_h100-8_dp.yaml", None),
    ("torchtitan", "llama2-7b_h100-8_dp.yaml", "llama2-7b"),
    ("deepspeed", "llama2-7b_h100-8_dp.yaml", "llama2-7b"),
])
def test_emitted_configurations_import_to_the_same_layout(framework: str, base: str, model: str | None,
                                                          tmp_path: Path) -> None:
    """Round trip: every layout `sim search --emit` may write for the framework (its EMIT_LIMITS), emitted and
    imported again, gives the same degrees, micro-batch, global batch, ZeRO stage, recompute, sequence
    parallelism, schedule and dtype (the Megatron shape flags carry the model, so none is passed there)."""
    from sim.cli.ecosystem import EMIT_LIMITS
    from sim.explore import search
    from sim.interop.deepspeed import import_deepspeed
    from sim.interop.emit import emit
    from sim.interop.megatron import import_megatron
    from sim.interop.torchtitan import import_torchtitan
    from sim.spec.scenario import load_scenario

    overrides = ["cluster.nodes=2", "parallel.dp=16"] if "llama2" in base else []
    scenario = load_scenario(ROOT / "scenarios" / base, overrides)
    only = search.parse_only([f"{knob}={values}" for knob, values in EMIT_LIMITS[framework].items()])
    checked = 0
    for layout in search.layouts(scenario, only, max_micro_batch=2):
        try:
            candidate = search.candidate(scenario, layout)
        except ValueError:
            continue
        try:
            emitted = emit(candidate, framework)
        except ConfigError:  # a layout the framework cannot run (sim search lists it as not expressible)
            continue
        path = tmp_path / f"config{emitted.suffix}"
        path.write_text(emitted.text)
        options = Options(gpu=candidate.cluster.gpu.name, model=model,
                          gpus=candidate.cluster.num_gpus if framework != "megatron" else None)
        if framework == "megatron":
            back = import_megatron([str(path)], options)
        elif framework == "torchtitan":
            back = import_torchtitan([str(path)], options)
        else:
            back = import_deepspeed([str(path), *emitted.launch.split()[6:]], options)
        assert _layout(back.scenario()) == _layout(candidate), (layout, emitted.text)
        checked += 1
    assert checked >= 4


def test_cli_search_emit_writes_importable_flags(tmp_path: Path) -> None:
    """`sim search --emit megatron` on tiny: only Megatron-runnable layouts are searched (ZeRO 0/1, 1F1B or
    interleaved), each shown layout's script is written, and importing the best one gives its layout back."""
    out = tmp_path / "search"
    assert main(["search", str(ROOT / "scenarios" / "tiny.yaml"), "--top", "6", "--show", "2", "--no-plot",
                 "--emit", "megatron", "-o", str(out)]) == 0
    scripts = sorted((out / "emit").glob("*.sh"))
    assert len(scripts) == 2
    s = import_megatron([str(scripts[0])], Options(gpu="A100-80GB-SXM")).scenario()
    assert s.parallel.zero in (0, 1) and s.schedule in ("1f1b", "interleaved") and s.cluster.num_gpus == 4
    assert s.model.num_layers == 4 and s.model.hidden_size == 1024


@pytest.mark.parametrize("framework, inputs, options", [
    ("megatron", ["megatron_train_gpt3_175b_distributed.sh"], ["--gpu", "A100-80GB-SXM", "--nodes", "128",
                                                               "--model", "gpt3-175b"]),
    ("nemo", ["nemo_llama2_70b.yaml"], ["--gpu", "H100-SXM", "--model", "llama2-70b"]),
    ("deepspeed", ["deepspeed_hf_zero3.json"], ["--gpu", "H100-SXM", "--gpus", "8", "--model", "llama3-8b",
                                                "--per_device_train_batch_size", "2", "--bf16"]),
    ("torchtitan", ["torchtitan_llama3_70b.toml"], ["--gpu", "H100-SXM", "--gpus", "64"]),
])
def test_each_framework_imports_to_a_scenario_sim_check_accepts(framework: str, inputs: list[str],
                                                                options: list[str], tmp_path: Path) -> None:
    """Issue 26's must-show 1: each framework's public example, through the command line, to a file `sim check`
    accepts (exit 0)."""
    out = tmp_path / f"{framework}.yaml"
    assert main(["import", framework, *[str(DATA / name) for name in inputs], *options, "-o", str(out)]) == 0
    assert main(["check", str(out)]) == 0


def test_gpu_name_prefix_and_context_parallel_listed() -> None:
    """--gpu takes a preset or an unambiguous start of one; --context-parallel-size above 1 is listed as unmapped
    while the scenario has no parallel.cp (its ranks then count as data-parallel ranks)."""
    from sim.spec.scenario import ParallelSpec

    args = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1024 --bf16 " \
           "--context-parallel-size 2 --global-batch-size 16".split()
    draft = import_megatron(args, Options(gpu="h100", gpus=8))
    s = draft.scenario()
    assert s.cluster.gpu.name == "H100-SXM"
    if "cp" not in ParallelSpec.model_fields:
        assert _status(draft, "--context-parallel-size") == "unmapped" and s.parallel.dp is None
    with pytest.raises(ConfigError, match=r"^--gpu: unknown GPU preset 'a100'"):
        import_megatron(args, Options(gpu="a100", gpus=8))


def test_model_from_a_hugging_face_config(tmp_path: Path) -> None:
    """--model config.json: the shape from the HF importer (Mistral-NeMo-12B: head_dim 128 with hidden 5120), and
    the DeepSpeed "auto" buckets from its hidden size (5120^2)."""
    from sim.interop.deepspeed import import_deepspeed

    config = str(ROOT / "tests" / "data" / "hf_configs" / "Mistral-Nemo-Base-2407" / "config.json")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                                "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}))
    s = import_deepspeed([str(path), "--bf16"], Options(gpu="H100-SXM", gpus=8, model=config)).scenario()
    assert (s.model.hidden_size, s.model.kv_channels, s.model.num_layers) == (5120, 128, 40)
    assert s.deepspeed is not None and s.deepspeed.reduce_bucket_size == 5120**2
    assert (s.training.micro_batch, s.training.global_batch) == (8, 64)  # TrainingArguments' default 8 per GPU


def test_a_qkv_only_bias_round_trips_through_megatron_flags(tmp_path: Path) -> None:
    """Qwen2's bias on QKV alone (HF import: add_qkv_bias) is emitted as --disable-bias-linear --add-qkv-bias, and
    those flags import back to the same parameter count (28 x (3584 + 2 x 512) more than without)."""
    from sim.interop.emit import emit
    from sim.interop.megatron import import_megatron
    from sim.model.params import total_params
    from sim.spec.scenario import load_scenario

    config = ROOT / "tests" / "data" / "hf_configs" / "Qwen2.5-7B" / "config.json"
    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml", [f"model={config}"])
    emitted = emit(scenario, "megatron")
    assert "--disable-bias-linear" in emitted.text and "--add-qkv-bias" in emitted.text
    path = tmp_path / f"config{emitted.suffix}"
    path.write_text(emitted.text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert (back.model.bias, back.model.add_qkv_bias) == (False, True)
    assert total_params(back.model) == total_params(scenario.model) == 7_615_616_512


@pytest.mark.parametrize("flags, optimizer_dtype, grad_dtype", [
    ("", "fp32", "auto"),
    ("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "fp32", "auto"),  # read only with the precision-aware optimizer
    ("--use-precision-aware-optimizer", "fp32", "auto"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "bf16", "auto"),
    ("--use-precision-aware-optimizer --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16 --main-grads-dtype bf16", "fp16",
     "bf16"),
])
def test_megatron_precision_aware_optimizer(flags: str, optimizer_dtype: str, grad_dtype: str) -> None:
    """Megatron-Core's --use-precision-aware-optimizer keeps the fp32 master and Adam's moments in --exp-avg-dtype /
    --exp-avg-sq-dtype (arguments.py at d98e8a64ddf3): training.optimizer_dtype, 4 + 2 + 2 bytes per parameter."""
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--use-distributed-optimizer ")
    draft = import_megatron((base + flags).split(), Options(gpu="H100-SXM", gpus=8))
    s = draft.scenario()
    assert (s.training.optimizer_dtype, s.training.grad_dtype, s.training.master_weights) == (
        optimizer_dtype, grad_dtype, True)
    if flags.startswith("--exp-avg-dtype"):
        assert _status(draft, "--exp-avg-dtype") == "ignored"


@pytest.mark.parametrize("flags, message", [
    ("--use-distributed-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8",
     "--exp-avg-dtype: 'fp8' optimizer states are not modelled"),
    ("--use-distributed-optimizer --exp-avg-dtype bf16",
     "--exp-avg-sq-dtype: 'fp32' differs from --exp-avg-dtype 'bf16'"),
    ("--use-distributed-optimizer --main-params-dtype fp16",
     "--main-params-dtype: fp16 master weights are not modelled"),
    ("--exp-avg-dtype bf16", "--use-precision-aware-optimizer: needs --use-distributed-optimizer"),
])
def test_megatron_precision_aware_optimizer_refusals(flags: str, message: str) -> None:
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--use-precision-aware-optimizer ")
    with pytest.raises(ConfigError) as error:
        import_megatron((base + flags).split(), Options(gpu="H100-SXM", gpus=8)).scenario()
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_megatron_emit_keeps_the_optimizer_states(tmp_path: Path) -> None:
    """`sim search --emit megatron` writes bf16 Adam moments as the precision-aware optimizer's flags and imports
    back to them; a framework with no setting for a state the scenario asks for refuses it in one line."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "tiny.yaml", ["training.optimizer_dtype=bf16", "parallel.zero=1"])
    path = tmp_path / "emitted.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert (back.training.optimizer_dtype, back.training.master_weights, back.parallel.zero) == ("bf16", True, 1)
    for overrides, framework, message in (
            (["training.optimizer_dtype=bf16"], "megatron", "training.optimizer_dtype: Adam moments in bf16 without"),
            (["training.master_weights=false"], "megatron", "training.master_weights: pure 16-bit training"),
            (["training.optimizer_dtype=bf16", "parallel.zero=1", "parallel.tp=1", "parallel.pp=1",
              "parallel.dp=4"], "deepspeed",
             "training.optimizer_dtype: Adam moments in bf16 (DeepSpeed has no setting for it)")):
        with pytest.raises(ConfigError) as error:
            emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", overrides), framework)
        assert str(error.value).startswith(message)


def test_torchtitan_full_bf16_training(tmp_path: Path) -> None:
    """TorchTitan's [training] dtype = "bfloat16" (pytorch/torchtitan#1646: "all parameters, gradients, and optimizer
    states in bfloat16, without an extra copy of fp32 weights") is pure bf16: no master, bf16 Adam moments, so the
    FSDP2 shards hold 2 + 2 + 4 bytes per parameter: the gradients are reduce-scattered in its fp32 reduce_dtype
    but stored in the sharded parameter's dtype (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    foreach_reduce: ``_to_dtype_if_needed(reduce_output, orig_dtype)`` before ``sharded_param.grad``), and Adam reads
    them there (14 bytes per parameter, not 16)."""
    from sim.interop.torchtitan import import_torchtitan
    from sim.plan import resolve
    from sim.workload.footprint import stage_memory

    path = tmp_path / "job.toml"
    head = '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = 8\n[training]\n'
    path.write_text(head + 'local_batch_size = 1\ndtype = "bfloat16"\n')
    draft = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=8))
    s = draft.scenario()
    assert (s.training.dtype, s.training.master_weights, s.training.optimizer_dtype) == ("bf16", False, "bf16")
    assert _status(draft, "training.dtype") == "mapped"
    plan = resolve(s)
    assert plan.optimizer_bytes_per_param == 4
    # FSDP2's reduce_dtype (mixed_precision_reduce, float32 by default) prices the reduce-scatter; the stored
    # gradient is the bf16 parameter's.
    assert (plan.grad_dtype, plan.grad_storage_dtype) == ("fp32", "bf16")
    shard = plan.stage_trainable_params(0) / 8
    memory = stage_memory(plan, 0)
    assert (memory["weights"], memory["gradients"], memory["optimizer"]) == pytest.approx(
        (2 * shard, 2 * shard, 4 * shard))
    assert plan.optimizer_step_bytes_per_param == 2 + 6 + 6
    path.write_text(head + 'local_batch_size = 1\ndtype = "bfloat16"\nmixed_precision_param = "float32"\n')
    with pytest.raises(ConfigError, match=r"^training.mixed_precision_param: float32 with training.dtype bfloat16"):
        import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=8))


def test_torchtitan_emit_writes_full_bf16_training(tmp_path: Path) -> None:
    """`sim search --emit torchtitan` of a pure-bf16 layout (master_weights: false, optimizer_dtype: bf16) writes
    TorchTitan's [training] dtype = "bfloat16" (pytorch/torchtitan#1646), which `sim import torchtitan` reads
    back as those states; it was refused, though TorchTitan has the setting the importer maps. Other settings
    TorchTitan has no knob for stay refused in one line: bf16 moments with an fp32 master, fp16 moments."""
    from sim.interop.emit import emit
    from sim.interop.torchtitan import import_torchtitan
    from sim.spec.scenario import load_scenario

    pure = ["cluster.nodes=2", "parallel.dp=16", "parallel.zero=3", "training.master_weights=false",
            "training.optimizer_dtype=bf16"]
    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml", pure)
    emitted = emit(scenario, "torchtitan")
    assert 'dtype = "bfloat16"' in emitted.text.splitlines()
    path = tmp_path / "job.toml"
    path.write_text(emitted.text)
    back = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=16, model="llama2-7b")).scenario()
    assert (back.training.master_weights, back.training.optimizer_dtype) == (False, "bf16")
    assert _layout(back) == _layout(scenario)
    for overrides, message in ((["training.optimizer_dtype=bf16"], "training.optimizer_dtype: Adam moments in bf16"),
                               (["training.master_weights=false", "training.optimizer_dtype=fp16"],
                                "training.master_weights: pure 16-bit training")):
        with pytest.raises(ConfigError) as error:
            emit(load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml", pure[:3] + overrides), "torchtitan")
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_nemo_userbuffers_cfg_sets_the_reduce_scatters_sms(tmp_path: Path) -> None:
    """An inline ``model.ub_tp_comm_overlap_cfg`` (as a resolved NeMo 1.x config holds it; NeMo's
    ub_cfg_h100_h8192_tp4_mbs1_seqlen4096.yaml: proj_fprop num_sm 24, fc2_fprop num_sm 16, both pipelined
    reduce-scatters) sets ``parallel.tp_comm_overlap_sms``, the SMs the row GEMMs' reduce-scatter takes, to their
    mean: the simulator prices both row GEMMs with one value. Not dropped as "does not change one step"."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_llama2_70b.yaml").read_text())
    config["model"]["ub_tp_comm_overlap_cfg"] = {
        "qkv_dgrad": {"method": "bulk", "num_sm": 4, "set_sm_margin": 0},
        "proj_fprop": {"method": "pipeline", "num_sm": 24, "num_splits": 4, "set_sm_margin": 1},
        "fc2_fprop": {"method": "pipeline", "num_sm": 16, "num_splits": 4, "set_sm_margin": 1}}
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama2-70b"))
    assert draft.scenario().parallel.tp_comm_overlap_sms == 20
    assert _status(draft, "model.ub_tp_comm_overlap_cfg.proj_fprop.num_sm") == "mapped"
    assert _status(draft, "model.ub_tp_comm_overlap_cfg.qkv_dgrad.num_sm") == "ignored"


# NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_h8192_tp4_mbs1_seqlen4096.yaml
# (the Llama 2 70B config at tp 4): the two pipelined reduce-scatters after the row-parallel GEMMs.
UB_CFG_70B_TP4 = {
    "qkv_dgrad": {"method": "bulk", "num_sm": 8, "cga_size": 2, "set_sm_margin": 0},
    "qkv_fprop": {"method": "ring_exchange", "aggregate": 0},
    "proj_fprop": {"method": "pipeline", "num_sm": 24, "cga_size": 2, "num_splits": 4, "set_sm_margin": 1},
    "fc2_fprop": {"method": "pipeline", "num_sm": 16, "cga_size": 2, "num_splits": 4, "set_sm_margin": 1}}


@pytest.mark.parametrize(("splits", "chunks"), [((4, 4), 4), ((2, 2), 2), ((2, 4), 3)])
def test_nemo_userbuffers_cfg_sets_the_reduce_scatters_chunks(tmp_path: Path, splits: tuple[int, int],
                                                              chunks: int) -> None:
    """The pipelined reduce-scatters' ``num_splits`` in an inline ``model.ub_tp_comm_overlap_cfg`` set
    ``parallel.tp_comm_overlap_chunks`` (the launcher's H100 configs: 4, whatever tp); two different counts, their
    mean (the simulator prices both row GEMMs with one), as num_sm. Each key read is reported mapped."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_llama2_70b.yaml").read_text())
    cfg = json.loads(json.dumps(UB_CFG_70B_TP4))
    cfg["proj_fprop"]["num_splits"], cfg["fc2_fprop"]["num_splits"] = splits
    config["model"]["ub_tp_comm_overlap_cfg"] = cfg
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama2-70b"))
    assert draft.scenario().parallel.tp_comm_overlap_chunks == chunks
    assert _status(draft, "model.ub_tp_comm_overlap_cfg.proj_fprop.num_splits") == "mapped"
    assert _status(draft, "model.ub_tp_comm_overlap_cfg.fc2_fprop.num_splits") == "mapped"


def test_megatron_emit_writes_the_userbuffers_cfg(tmp_path: Path) -> None:
    """A scenario that sets the chunked reduce-scatters' SMs or chunks emits them as Megatron-LM's
    ``--tp-comm-overlap-cfg`` file (megatron/training/initialize.py _initialize_tp_communicators: the YAML handed to
    TE's initialize_ub, NeMo's ub_tp_comm_overlap_cfg format), written by the script before torchrun; `sim import
    megatron` reads it back. Without either field the flag stays out (TE's own defaults)."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    overlap = ["parallel.tp_comm_overlap=true", "parallel.sequence_parallel=true"]
    scenario = load_scenario(ROOT / "scenarios" / "tiny.yaml", [*overlap, "parallel.tp_comm_overlap_chunks=2",
                                                                "parallel.tp_comm_overlap_sms=24"])
    emitted = emit(scenario, "megatron")
    assert "--tp-comm-overlap-cfg ub_cfg.yaml" in emitted.text
    path = tmp_path / "run.sh"
    path.write_text(emitted.text)
    draft = import_megatron([str(path)], Options(gpu="A100-80GB-SXM"))
    back = draft.scenario()
    assert (back.parallel.tp_comm_overlap_chunks, back.parallel.tp_comm_overlap_sms) == (2, 24)
    assert _status(draft, "ub_cfg.yaml: proj_fprop.num_splits") == "mapped"
    plain = emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", overlap), "megatron")
    assert "--tp-comm-overlap-cfg" not in plain.text
    # SMs alone: the file still states the chunks the scenario prices (tp = 2), since a pipeline entry without
    # num_splits runs TE's 4 (initialize_ub: ub_cfg.get("num_splits", 4 if method == "pipeline" else 0))
    sms_only = load_scenario(ROOT / "scenarios" / "tiny.yaml", [*overlap, "parallel.tp_comm_overlap_sms=24"])
    path.write_text(emit(sms_only, "megatron").text)
    back = import_megatron([str(path)], Options(gpu="A100-80GB-SXM")).scenario()
    assert (back.parallel.tp_comm_overlap_chunks, back.parallel.tp_comm_overlap_sms) == (sms_only.parallel.tp, 24)


def test_megatron_emit_writes_the_reduce_scatter_without_the_sm_margin(tmp_path: Path) -> None:
    """``parallel.tp_comm_overlap_sms: 0`` under TE's userbuffers is a row GEMM launched without ``set_sm_margin``
    (TE comm_gemm_overlap.cpp: the GEMM keeps every SM), what `sim import` reads a ``set_sm_margin: 0`` entry as and
    what the bundled NeMo 24.07 Nemotron rows set (TE 1.x's default). The emitter refused it as PyTorch AsyncTP's,
    so none of the three rows could be emitted; it writes ``set_sm_margin: 0`` for both row GEMMs, and the import of
    the script gives 0 back."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "validation" / "nemo2407-nemotron-8b-64.yaml")
    assert (scenario.parallel.tp_comm_overlap_sms, scenario.parallel.tp_comm_overlap_method) == (0, "userbuffers")
    text = emit(scenario, "megatron").text
    path = tmp_path / "run.sh"
    path.write_text(text)
    draft = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name, gpus=scenario.cluster.num_gpus))
    assert draft.scenario().parallel.tp_comm_overlap_sms == 0
    assert _status(draft, "ub_cfg.yaml: proj_fprop.set_sm_margin") == "mapped"


def test_megatron_emit_round_trips_activation_offload(tmp_path: Path) -> None:
    """``training.cpu_offloading_num_layers`` is Megatron-Core's TransformerConfig cpu_offloading /
    cpu_offloading_num_layers (Megatron-LM's --cpu-offloading-num-layers N, a count above 0 switching cpu_offloading
    on; arguments.py has no --cpu-offloading, excluded from the TransformerConfig-generated flags): the emitter wrote
    nothing, so the script ran without the offload the scenario priced, and the importer listed the flag as
    unknown. Emitted and read back, the count is
    the scenario's; a script with the flags at pp 2 is refused in one line naming the field, as Megatron-Core
    refuses it."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.pp=1", "parallel.dp=2",
                                                                "training.cpu_offloading_num_layers=2"])
    text = emit(scenario, "megatron").text
    assert "--cpu-offloading-num-layers 2" in text and "--cpu-offloading \\" not in text
    path = tmp_path / "run.sh"
    path.write_text(text)
    draft = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name))
    assert draft.scenario().training.cpu_offloading_num_layers == 2
    assert _status(draft, "--cpu-offloading-num-layers") == "mapped"
    path.write_text(text.replace("--pipeline-model-parallel-size 1", "--pipeline-model-parallel-size 2"))
    with pytest.raises(ConfigError) as error:
        import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert str(error.value).startswith("training.cpu_offloading_num_layers") and "\n" not in str(error.value)


def test_megatron_emit_refuses_the_param_gather_overlap_without_the_grad_reduce_overlap() -> None:
    """Megatron-LM asserts --overlap-grad-reduce under --overlap-param-gather (arguments.py at 1e05700595:
    '--overlap-grad-reduce should be turned on when using --overlap-param-gather'), which `sim import megatron`
    refuses too; the emitter wrote the script Megatron stops at start-up (a Qwen3 ModelZoo row with
    parallel.overlap_grad_reduce false). Refused in one line naming the field."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    base = ROOT / "scenarios" / "validation" / "moe" / "mz-qwen3-235b-h100-256-a2a-pp32.yaml"
    with pytest.raises(ConfigError) as error:
        emit(load_scenario(base, ["parallel.overlap_grad_reduce=false"]), "megatron")
    assert str(error.value).startswith("parallel.overlap_param_gather") and "\n" not in str(error.value)
    assert "--overlap-param-gather" in emit(load_scenario(base), "megatron").text


def test_nemo_import_reads_the_offload_count_only_with_offload_on(tmp_path: Path) -> None:
    """NeMo's megatron_gpt_config.yaml writes ``cpu_offloading: False`` beside ``cpu_offloading_num_layers:
    ${sum:${.num_layers},-1}`` (an OmegaConf interpolation NeMo leaves unevaluated when offload is off): the import
    reads no count then (no offload, the row ignored), and with ``cpu_offloading: True`` and a count, offloads that
    many layers."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_gpt3_175b.yaml").read_text())
    model = config["model"]
    model.update(cpu_offloading=False, cpu_offloading_num_layers="${sum:${.num_layers},-1}",
                 pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                 activations_checkpoint_granularity=None, activations_checkpoint_method=None)
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM"))
    assert draft.scenario().training.cpu_offloading_num_layers == 0
    assert _status(draft, "model.cpu_offloading_num_layers") == "ignored"
    model.update(cpu_offloading=True, cpu_offloading_num_layers=2)
    path.write_text(yaml.safe_dump(config))
    assert import_nemo([str(path)], Options(gpu="H100-SXM")).scenario().training.cpu_offloading_num_layers == 2


def test_megatron_emit_refuses_tp_comm_overlap_without_sequence_parallelism() -> None:
    """Megatron-LM's arguments.py asserts sequence parallelism under --tp-comm-overlap ("Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is enabled"; SP is switched off at tp 1
    first): the emitter names the field instead of writing a script Megatron refuses at start-up; at tp 1, where
    there is no TP collective to overlap, it leaves the flag out."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    with pytest.raises(ConfigError) as error:
        emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true",
                                                              "parallel.sequence_parallel=false"]), "megatron")
    assert str(error.value).startswith("parallel.tp_comm_overlap: Megatron-LM's --tp-comm-overlap needs")
    tp1 = emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true", "parallel.tp=1",
                                                                "parallel.dp=2"]), "megatron")
    assert "--tp-comm-overlap" not in tp1.text
    with pytest.raises(ConfigError) as error:  # PyTorch's AsyncTP has no Megatron-LM flag: TE's is priced otherwise
        emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true",
                                                              "parallel.sequence_parallel=true",
                                                              "parallel.tp_comm_overlap_method=async_tp"]), "megatron")
    assert str(error.value).startswith("parallel.tp_comm_overlap_method: async_tp is PyTorch's AsyncTP")
    with pytest.raises(ConfigError) as error:  # and TorchTitan's flag is AsyncTP, not TE's userbuffers
        emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true",
                                                              "parallel.sequence_parallel=true"]), "torchtitan")
    assert str(error.value).startswith("parallel.tp_comm_overlap_method: userbuffers is TE's userbuffers")
    titan = emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true",
                                                                  "parallel.sequence_parallel=true",
                                                                  "parallel.tp_comm_overlap_method=async_tp"]),
                 "torchtitan")
    assert "enable_async_tensor_parallel = true" in titan.text
    emitted = emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["parallel.tp_comm_overlap=true",
                                                                  "parallel.sequence_parallel=true"]), "megatron")
    assert "--tp-comm-overlap" in emitted.text


@pytest.mark.parametrize(("base", "overrides", "fields"), [
    # context parallelism (and its exchange): without --context-parallel-size Megatron runs cp 1 and takes the CP
    # ranks as data-parallel ones, another layout
    ("llama3.1-405b_h100-16384_cp16-128k.yaml", [], ("parallel.cp", "parallel.cp_comm_type")),
    ("llama3.1-405b_h100-16384_cp16-128k.yaml", ["parallel.cp_comm_type=p2p"],
     ("parallel.cp", "parallel.cp_comm_type")),
    # token dropping: without --moe-expert-capacity-factor Megatron-Core runs dropless
    ("mixtral-8x7b_h100-64.yaml", [], ("moe.capacity_factor", "moe.pad_to_capacity")),
    # FP8 with gradients reduced in bf16 (NeMo's grad_sync_dtype bf16): Megatron-LM's --grad-reduce-in-bf16
    ("validation/nemo2407-gpt3-175b-128.yaml", [], ("training.dtype", "training.grad_dtype")),
])
def test_megatron_emit_round_trips_cp_capacity_and_bf16_reduction(base: str, overrides: list[str],
                                                                  fields: tuple[str, ...], tmp_path: Path) -> None:
    """`sim search --emit megatron` of bundled scenarios writes what the scenario sets and `sim import megatron`
    reads back each of ``fields`` equal (Megatron-LM arguments.py: --context-parallel-size, --cp-comm-type
    p2p / a2a / all_gather, --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity, --grad-reduce-in-bf16,
    which works with --fp8-format as with --bf16 alone)."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / base, overrides)
    path = tmp_path / "run.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    for field in fields:
        section, name = field.split(".")
        assert getattr(getattr(back, section), name) == getattr(getattr(scenario, section), name), field
    assert _layout(back)[:10] == _layout(scenario)[:10]  # degrees and batch (SP: Megatron drops it at tp 1)


@pytest.mark.parametrize(("base", "framework", "message"), [
    ("llama3-8b_h100-1_lora.yaml", "megatron", "training.method: lora"),
    ("llama3-8b_h100-1_lora.yaml", "torchtitan", "training.method: lora"),
    ("llama3-8b_h100-1_lora.yaml", "deepspeed", "training.method: lora"),
    ("llama3-70b_h100-1_qlora.yaml", "deepspeed", "training.method: qlora"),
    ("validation/nemo2407-llama2-7b-8.yaml", "deepspeed", "training.dtype: fp8"),
])
def test_emit_refuses_what_the_framework_config_cannot_say(base: str, framework: str, message: str) -> None:
    """A LoRA / QLoRA scenario emitted as a Megatron-LM script, a TorchTitan TOML or a DeepSpeed JSON with HF Trainer
    flags (none of which has an adapter setting) was written as full fine-tuning, and an FP8 scenario's DeepSpeed
    config as plain bf16: runs of another method or precision than the one priced. Each is refused in one line
    naming the field (docs/ecosystem.md: the emitter refuses a knob the framework has no setting for)."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    with pytest.raises(ConfigError) as error:
        emit(load_scenario(ROOT / "scenarios" / base), framework)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_megatron_cp_comm_type(tmp_path: Path) -> None:
    """--cp-comm-type (Megatron-LM arguments.py: one value or one per layer, the names Transformer Engine's attention
    checks: p2p, all_gather, a2a, a2a+p2p) sets
    parallel.cp_comm_type under context parallelism; without it the flag is ignored, and the hierarchical a2a+p2p
    is refused in one line naming the flag."""
    script = ("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 1 "
              "--pipeline-model-parallel-size 1 {cp} --micro-batch-size 1 --global-batch-size 8 --seq-length 2048 "
              "--bf16 --num-layers 2 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16 "
              "--max-position-embeddings 2048 --vocab-size 32000\n")
    path = tmp_path / "run.sh"
    path.write_text(script.format(cp="--context-parallel-size 2 --cp-comm-type all_gather"))
    assert import_megatron([str(path)], Options(gpu="H100-SXM")).scenario().parallel.cp_comm_type == "all_gather"
    path.write_text(script.format(cp="--cp-comm-type a2a"))
    draft = import_megatron([str(path)], Options(gpu="H100-SXM"))
    assert _status(draft, "--cp-comm-type") == "ignored" and draft.scenario().parallel.cp == 1
    path.write_text(script.format(cp="--context-parallel-size 2 --cp-comm-type a2a+p2p"))
    with pytest.raises(ConfigError) as error:
        import_megatron([str(path)], Options(gpu="H100-SXM"))
    assert str(error.value).startswith("--cp-comm-type: a2a+p2p is not modelled") and "\n" not in str(error.value)


def test_torchtitan_emit_writes_partial_recompute_as_every_nth_block(tmp_path: Path) -> None:
    """Full recomputation of some of a stage's blocks (recompute_num_layers) is TorchTitan's selective_ac_option = N
    (every N-th block checkpointed), which `sim import torchtitan` reads as that many layers; the emitter wrote
    mode = "full" (every block). The bundled IBM FSDP Llama 2 13B row: 20 of 40 layers -> every 2nd; a count that
    is no such fraction (15 of 40) is refused in one line."""
    from sim.interop.emit import emit
    from sim.interop.torchtitan import import_torchtitan
    from sim.spec.scenario import load_scenario

    base = ROOT / "scenarios" / "validation" / "ibm-fsdp-llama2-13b-a100-128.yaml"
    scenario = load_scenario(base)
    assert (scenario.training.recompute, scenario.training.recompute_num_layers) == ("full", 20)
    emitted = emit(scenario, "torchtitan")
    assert 'selective_ac_option = "2"' in emitted.text.splitlines()
    path = tmp_path / "job.toml"
    path.write_text(emitted.text)
    back = import_torchtitan([str(path)], Options(gpu=scenario.cluster.gpu.name, gpus=scenario.cluster.num_gpus,
                                                   model="llama2-13b")).scenario()
    assert (back.training.recompute, back.training.recompute_num_layers) == ("full", 20)
    with pytest.raises(ConfigError) as error:
        emit(load_scenario(base, ["training.recompute_num_layers=15"]), "torchtitan")
    assert str(error.value).startswith("training.recompute_num_layers: 15") and "\n" not in str(error.value)


@pytest.mark.parametrize(("base", "overrides", "bucket_bytes"), [
    # the bundled MoE rows set Megatron-Core's default, max(40e6, 1e6 x dp) fp32 gradients: 160,000,000 bytes
    ("validation/moe/mz-qwen3-235b-h100-256-deepep-ep32.yaml", [], 160_000_000),
    # PyTorch's 25 MiB (the field's default) in bf16 gradients: 13,107,200 elements
    ("tiny.yaml", ["parallel.overlap_grad_reduce=true", "training.grad_dtype=bf16"], 25 * 2**20),
])
def test_megatron_emit_round_trips_the_gradient_bucket_size(base: str, overrides: list[str], bucket_bytes: int,
                                                           tmp_path: Path) -> None:
    """parallel.dp_bucket_size (bytes of gradients per bucket) under --overlap-grad-reduce is Megatron-LM's
    --ddp-bucket-size (elements: DistributedDataParallelConfig.bucket_size), written by the emitter and read back by
    the importer at the gradients' element size (fp32 main gradients, 2 bytes with --grad-reduce-in-bf16); without
    it Megatron buckets max(40e6, 1e6 x dp) elements whatever the scenario priced."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / base, overrides)
    assert scenario.parallel.dp_bucket_size == bucket_bytes
    path = tmp_path / "run.sh"
    path.write_text(emit(scenario, "megatron").text)
    draft = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name))
    assert draft.scenario().parallel.dp_bucket_size == bucket_bytes
    assert _status(draft, "--ddp-bucket-size") == "mapped"


@pytest.mark.parametrize(("overrides", "reduce"), [([], "bfloat16"), (["training.grad_dtype=fp32"], "float32")])
def test_torchtitan_emit_writes_the_fsdp_reduce_dtype(overrides: list[str], reduce: str, tmp_path: Path) -> None:
    """FSDP's reduce dtype (the scenario's gradient dtype: bf16 for sharded gradients unless grad_dtype says fp32,
    Plan.grad_dtype) is TorchTitan's mixed_precision_reduce, whose default is float32: the emitter left it out, so
    the bundled FSDP scenario's bf16 reduce-scatters ran in fp32 (twice the bytes) and came back as fp32."""
    from sim.interop.emit import emit
    from sim.interop.torchtitan import import_torchtitan
    from sim.plan import resolve
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-16_fsdp.yaml", overrides)
    emitted = emit(scenario, "torchtitan")
    assert f'mixed_precision_reduce = "{reduce}"' in emitted.text.splitlines()
    path = tmp_path / "job.toml"
    path.write_text(emitted.text)
    back = import_torchtitan([str(path)], Options(gpu=scenario.cluster.gpu.name, gpus=scenario.cluster.num_gpus,
                                                   model="llama2-7b")).scenario()
    assert resolve(back).grad_dtype == resolve(scenario).grad_dtype == {"bfloat16": "bf16", "float32": "fp32"}[reduce]


def test_nemo_cp_comm_type(tmp_path: Path) -> None:
    """NeMo's model.cp_comm_type (Megatron-Core TransformerConfig, passed to Transformer Engine's attention) reads
    as Megatron's --cp-comm-type: the GPT-3 175B recipe at cp 2 with all_gather gives parallel.cp_comm_type
    all_gather (it was not read: the ring's p2p default stayed)."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_gpt3_175b.yaml").read_text())
    config["model"]["context_parallel_size"], config["model"]["cp_comm_type"] = 2, "all_gather"
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM"))
    assert (draft.scenario().parallel.cp, draft.scenario().parallel.cp_comm_type) == (2, "all_gather")
    assert _status(draft, "model.cp_comm_type") == "mapped"


@pytest.mark.parametrize(("flags", "gpus", "bucket_bytes"), [
    # dp 8 (8 GPUs, tp 1): max(40e6, 8e6) = 40e6 fp32 main gradients (bf16 training: Megatron-LM's arguments.py
    # sets accumulate_allreduce_grads_in_fp32) -> 160,000,000 bytes
    ("--bf16", 8, 160_000_000),
    # dp 256 (2,048 GPUs / tp 4 / pp 2): 256e6 gradients of 4 bytes
    ("--bf16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2", 2048, 1_024_000_000),
    # dp without cp (the dp_group Megatron-Core sizes the bucket by): 2,048 / tp 2 / cp 4 = 256 -> 256e6 elements,
    # in bf16 with --grad-reduce-in-bf16
    ("--bf16 --tensor-model-parallel-size 2 --context-parallel-size 4 --grad-reduce-in-bf16", 2048, 512_000_000),
    # fp16 training reduces fp16 gradients: dp 64 -> max(40e6, 64e6) x 2 bytes
    ("--fp16", 64, 128_000_000),
    # --ddp-bucket-size given: it, in elements of the gradient buffer's dtype
    ("--bf16 --ddp-bucket-size 10000000", 8, 40_000_000),
])
def test_megatron_import_carries_megatron_cores_default_bucket(flags: str, gpus: int, bucket_bytes: int) -> None:
    """Without --ddp-bucket-size Megatron-Core buckets max(40,000,000, 1,000,000 x dp) gradients
    (megatron/core/distributed/distributed_data_parallel.py: ``ddp_config.bucket_size = max(40000000, 1000000 *
    dp_group.size())``, the data-parallel group without cp; the same rule at 1e05700595), not PyTorch DDP's 25 MiB:
    the imported scenario carries it in bytes of the gradient buffer's dtype, reported as Megatron's default."""
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 " \
        "--overlap-grad-reduce --use-distributed-optimizer "
    draft = import_megatron((base + flags).split(), Options(gpu="H100-SXM", gpus=gpus))
    assert draft.scenario().parallel.dp_bucket_size == bucket_bytes
    assert _status(draft, "--ddp-bucket-size") == ("mapped" if "--ddp-bucket-size" in flags else "default")


def test_megatron_import_without_overlap_leaves_the_bucket_out() -> None:
    """Without --overlap-grad-reduce Megatron-Core sets bucket_size None (one bucket per model chunk after the
    backward), which the simulator models whatever parallel.dp_bucket_size says: no default row is written."""
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16"
    draft = import_megatron(base.split(), Options(gpu="H100-SXM", gpus=8))
    assert draft.get("parallel.dp_bucket_size") is None
    assert not any(row.target.startswith("parallel.dp_bucket_size") for row in draft.rows)


@pytest.mark.parametrize(("optim", "bucket_bytes", "status"), [
    # NeMo 1.x mcore_distributed_optim: Megatron-Core's DDP with model.optim.ddp_bucket_size, in elements of the
    # gradient buffer (fp32: grad_reduce_in_fp32 = grad_sync_dtype == 'fp32'); bucket_cap_mb is not read
    ({"name": "mcore_distributed_optim", "ddp_bucket_size": 50_000_000}, 200_000_000, "mapped"),
    ({"name": "mcore_distributed_optim", "grad_sync_dtype": "bf16"}, 80_000_000, "default"),
    # Apex's DistributedFusedAdam (NeMo's distributed_fused_adam): bucket_cap_mb MiB of gradients in
    # grad_sync_dtype (apex distributed_fused_adam.py: bucket_size = 1024 * 1024 * bucket_cap_mb / dtype_size),
    # Apex's default 100 when the config leaves it out
    ({"name": "distributed_fused_adam", "bucket_cap_mb": 220}, 220 * 2**20, "mapped"),
    ({"name": "distributed_fused_adam", "bucket_cap_mb": None}, 100 * 2**20, "default"),
])
def test_nemo_bucket_follows_the_optimizer_that_buckets(tmp_path: Path, optim: dict[str, Any], bucket_bytes: int,
                                                        status: str) -> None:
    """The GPT-3 175B recipe (dp 32, overlap_grad_sync) under each of NeMo 1.x's distributed optimizers: the
    bucket the optimizer that owns the gradients runs, each row's source reported."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_gpt3_175b.yaml").read_text())
    config["model"]["optim"].update(optim)
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM"))
    s = draft.scenario()
    assert s.parallel.dp_bucket_size == bucket_bytes
    assert s.training.grad_dtype == ("bf16" if optim.get("grad_sync_dtype") == "bf16" else "auto")
    source = {"mcore_distributed_optim": "model.optim.ddp_bucket_size"}.get(optim["name"],
                                                                          "model.optim.bucket_cap_mb")
    assert next(row.status for row in draft.rows if row.target.startswith("parallel.dp_bucket_size")
                and row.source == source) == status


@pytest.mark.parametrize(("ddp", "bucket_bytes"), [
    ({}, 160_000_000),  # dp 4: max(40e6, 4e6) fp32 gradients (MegatronMixedPrecision's grad_reduce_in_fp32 True)
    ({"bucket_size": 100_000_000}, 400_000_000),  # DistributedDataParallelConfig.bucket_size, in elements
])
def test_nemo2_bucket_is_megatron_cores(tmp_path: Path, ddp: dict[str, Any], bucket_bytes: int) -> None:
    """NeMo 2.0's trainer.strategy.ddp is Megatron-Core's DistributedDataParallelConfig: its bucket_size, else
    Megatron-Core's default for the data-parallel size (16 GPUs / tp 2 / pp 2 = 4)."""
    from sim.interop.nemo import import_nemo

    config = {"trainer": {"num_nodes": 2, "devices": 8, "strategy": {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "sequence_parallel": True,
        "ddp": {"overlap_grad_reduce": True, "use_distributed_optimizer": True, **ddp}},
        "plugins": {"precision": "bf16-mixed"}},
        "model": {"config": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}},
        "data": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 128}}
    path = tmp_path / "nemo2.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama3-8b"))
    assert draft.scenario().parallel.dp_bucket_size == bucket_bytes
    if ddp:
        assert _status(draft, "trainer.strategy.ddp.bucket_size") == "mapped"


@pytest.mark.parametrize(("cfg", "sms", "chunks", "defaults"), [
    # fc2_fprop says only its method: TE's pipeline defaults, num_sm 16 and num_splits 4 -> mean(24, 16) = 20
    ({"proj_fprop": {"method": "pipeline", "num_sm": 24, "num_splits": 4, "set_sm_margin": 1},
      "fc2_fprop": {"method": "pipeline"}}, 20, 4, ["fc2_fprop.num_sm", "fc2_fprop.num_splits"]),
    # no row-GEMM entry at all: both are TE's defaults (pipeline, 16 SMs with set_sm_margin, 4 splits)
    ({"qkv_dgrad": {"method": "bulk", "num_sm": 8}}, 16, 4,
     ["proj_fprop.num_sm", "proj_fprop.num_splits", "fc2_fprop.num_sm", "fc2_fprop.num_splits"]),
    # ring exchange without num_sm / set_sm_margin: TE's 1 SM and no margin, so the GEMM keeps every SM; its
    # chunks are tp (the field's default), not num_splits
    ({"proj_fprop": {"method": "ring_exchange"}, "fc2_fprop": {"method": "ring_exchange"}}, 0, None,
     ["proj_fprop.num_sm", "fc2_fprop.num_sm"]),
    # an explicit set_sm_margin 0: the GEMM runs on all SMs beside that reduce-scatter (TE comm_gemm_overlap.cpp);
    # NeMo 2.x writes the margin as a boolean
    ({"proj_fprop": {"method": "pipeline", "num_sm": 24, "num_splits": 4, "set_sm_margin": 0},
      "fc2_fprop": {"method": "pipeline", "num_sm": 16, "num_splits": 4, "set_sm_margin": 1}}, 8, 4, []),
    ({"proj_fprop": {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True},
      "fc2_fprop": {"method": "pipeline", "num_sm": 16, "set_sm_margin": False}}, 0, 4, ["fc2_fprop.num_splits"]),
])
def test_nemo_userbuffers_cfg_fills_te_defaults_for_omitted_keys(tmp_path: Path, cfg: dict[str, Any], sms: int,
                                                                 chunks: int | None, defaults: list[str]) -> None:
    """A ub_cfg entry (or a row GEMM with no entry) runs Transformer Engine's defaults for what it omits
    (transformer_engine/pytorch/module/base.py initialize_ub, get_default_config, TE 2.x: num_sm 16 / 1,
    set_sm_margin for all but ring_exchange, num_splits 4 / tp for pipeline / ring_exchange; the user's keys
    update that dict): the imported scenario prices those, each filled key reported as TE's default."""
    from sim.interop.nemo import import_nemo

    config = yaml.safe_load((DATA / "nemo_llama2_70b.yaml").read_text())
    config["model"]["ub_tp_comm_overlap_cfg"] = cfg
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama2-70b"))
    s = draft.scenario()
    assert (s.parallel.tp_comm_overlap_sms, s.parallel.tp_comm_overlap_chunks) == (sms, chunks)
    for key in defaults:
        assert _status(draft, f"model.ub_tp_comm_overlap_cfg.{key}") == "default"
    assert not any(row.status == "unknown" for row in draft.rows if "ub_tp_comm_overlap_cfg" in row.source)


def test_megatron_emit_runs_the_loss_the_scenario_priced(tmp_path: Path) -> None:
    """Megatron-LM runs its unfused VocabParallelCrossEntropy unless --cross-entropy-loss-fusion is given
    (megatron/core/models/common/language_module/language_module.py compute_language_model_loss at 1e05700595), so
    a scenario priced with the fused loss (``training.cross_entropy: fused``, the default) is emitted with the flag
    and imports back fused; the unfused one (megatron) without it; Hugging Face's loss (hf), which Megatron has no
    setting for, is refused in one line naming the field."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    fused = load_scenario(ROOT / "scenarios" / "tiny.yaml")
    assert fused.training.cross_entropy == "fused"
    text = emit(fused, "megatron").text
    assert "--cross-entropy-loss-fusion" in text
    path = tmp_path / "emitted.sh"
    path.write_text(text)
    assert import_megatron([str(path)], Options(gpu=fused.cluster.gpu.name)).scenario().training.cross_entropy == \
        "fused"
    unfused = load_scenario(ROOT / "scenarios" / "tiny.yaml", ["training.cross_entropy=megatron"])
    unfused_text = emit(unfused, "megatron").text
    assert "--cross-entropy-loss-fusion" not in unfused_text
    # ... and a script without the flag imports as what Megatron-LM runs (arguments.py: the flag is opt-in).
    path.write_text(unfused_text)
    draft = import_megatron([str(path)], Options(gpu=unfused.cluster.gpu.name))
    assert draft.scenario().training.cross_entropy == "megatron"
    assert _status(draft, "--cross-entropy-loss-fusion") == "default"
    with pytest.raises(ConfigError) as error:
        emit(load_scenario(ROOT / "scenarios" / "tiny.yaml", ["training.cross_entropy=hf"]), "megatron")
    assert str(error.value).startswith("training.cross_entropy: ") and "\n" not in str(error.value)


@pytest.mark.parametrize(("where", "fusion", "loss"), [
    ("model", False, "megatron"), ("model", True, "fused"), ("model.config", False, "megatron"),
    ("model.config", True, "fused"), (None, None, "fused")])
def test_nemo_loss_fusion_sets_the_loss(tmp_path: Path, where: str | None, fusion: bool | None, loss: str) -> None:
    """NeMo passes cross_entropy_loss_fusion to Megatron-Core's TransformerConfig (NeMo 2.0 GPTConfig's field,
    default True; NeMo 1.x model.cross_entropy_loss_fusion), which runs the unfused VocabParallelCrossEntropy when
    it is false (NeMo 2.0's recipes set it false for fine-tuning, e.g. llm/recipes/llama31_8b.py): an explicit false
    is training.cross_entropy: megatron, true or absent the default, fused."""
    from sim.interop.nemo import import_nemo

    config: dict[str, Any] = {"trainer": {"num_nodes": 1, "devices": 8, "strategy": {
        "tensor_model_parallel_size": 2, "sequence_parallel": True}, "plugins": {"precision": "bf16-mixed"}},
        "model": {"config": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}},
        "data": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 32}}
    if where == "model":
        config["model"]["cross_entropy_loss_fusion"] = fusion
    elif where == "model.config":
        config["model"]["config"]["cross_entropy_loss_fusion"] = fusion
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(config))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM", model="llama3-8b"))
    assert draft.scenario().training.cross_entropy == loss
    if where is not None:
        assert _status(draft, f"{where}.cross_entropy_loss_fusion") == "mapped"


@pytest.mark.parametrize(("base", "overrides", "fields"), [
    # Qwen3's q/k norms (Megatron-LM --qk-layernorm; without it Megatron builds the attention without them)
    ("validation/moe/mz-qwen3-235b-h100-256-a2a-pp32.yaml", [], ("qk_layernorm",)),
    # DeepSeek-V3's multi-head latent attention and aux-loss-free routing bias, on a schedule Megatron-LM runs:
    # without --multi-latent-attention and its widths the script trains a multi-head-attention model
    ("deepseek-v3_h800-2048.yaml", ["schedule=1f1b"],
     ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
      "moe_router_enable_expert_bias")),
])
def test_megatron_emit_round_trips_the_attention_shape(base: str, overrides: list[str], fields: tuple[str, ...],
                                                        tmp_path: Path) -> None:
    """`sim search --emit megatron` writes the model's attention as Megatron-LM builds it (arguments.py at
    1e05700595: --qk-layernorm; --multi-latent-attention with --q-lora-rank, --kv-lora-rank, --qk-head-dim,
    --qk-pos-emb-head-dim, --v-head-dim and --no-rope-fusion, which Megatron-Core's TransformerConfig requires
    beside MLA; --moe-router-enable-expert-bias with the sigmoid score it requires), and `sim import megatron`
    reads each back (the model's fields equal)."""
    from sim.interop.emit import emit
    from sim.plan import resolve
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / base, overrides)
    text = emit(scenario, "megatron").text
    path = tmp_path / "run.sh"
    path.write_text(text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name,
                                                gpus=scenario.cluster.num_gpus)).scenario()
    for field in fields:
        assert getattr(resolve(back).model, field) == getattr(resolve(scenario).model, field), field
    if scenario.model.multi_latent_attention:  # what Megatron-Core asks beside MLA and the expert bias
        assert "--no-rope-fusion" in text and "--moe-router-score-function sigmoid" in text


@pytest.mark.parametrize("cp_comm_type, rotate", [("p2p", "alltoall"), ("all_gather", "allgather")])
def test_emit_torchtitan_writes_context_parallelism_and_imports_it_back(cp_comm_type: str, rotate: str,
                                                                        tmp_path: Path) -> None:
    """A layout with context parallelism (parallel.cp 2 of 8 GPUs, FSDP over the other 4) emitted for TorchTitan
    writes context_parallel_degree (ParallelDims asserts dp_replicate x dp_shard x cp x tp x pp = world size, so a
    config without it stops at start-up) and the KV exchange as PyTorch's ring rotater: p2p's ring is
    context_parallel_rotate_method "alltoall" (_AllToAllRotater: permute_tensor to the next rank, per step),
    all_gather's one gather "allgather" (_AllGatherRotater, TorchTitan's default); Ulysses (a2a) is no rotater and
    is refused in one line. Importing it gives back the layout, cp and its exchange. Found in review9: cp was not
    written (`sim search --emit torchtitan` on Llama 3 8B over 8 H100 wrote dp_shard 4 alone)."""
    from sim.interop.emit import emit
    from sim.interop.torchtitan import import_torchtitan
    from sim.spec.scenario import load_scenario

    overrides = ["parallel.tp=1", "parallel.cp=2", f"parallel.cp_comm_type={cp_comm_type}", "parallel.dp=4",
                 "fsdp.sharding=FULL_SHARD", "training.global_batch=8"]
    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml", overrides)
    emitted = emit(scenario, "torchtitan")
    assert "context_parallel_degree = 2" in emitted.text
    assert f'context_parallel_rotate_method = "{rotate}"' in emitted.text
    path = tmp_path / "job.toml"
    path.write_text(emitted.text)
    back = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=8, model="llama2-7b")).scenario()
    assert _layout(back) == _layout(scenario)
    assert (back.parallel.cp, back.parallel.cp_comm_type) == (2, cp_comm_type)
    with pytest.raises(ConfigError, match=r"^parallel.cp_comm_type: a2a"):
        emit(scenario.model_copy(update={"parallel": scenario.parallel.model_copy(
            update={"cp_comm_type": "a2a"})}), "torchtitan")


def test_torchtitan_context_parallelism_imports_with_its_default_kv_all_gather(tmp_path: Path) -> None:
    """TorchTitan's context_parallel_rotate_method defaults to "allgather" (PyTorch's _AllGatherRotater: the KV
    shards gathered once per attention), which is parallel.cp_comm_type all_gather, not the p2p ring."""
    from sim.interop.torchtitan import import_torchtitan

    path = tmp_path / "job.toml"
    path.write_text((DATA / "torchtitan_llama3_8b.toml").read_text().replace("context_parallel_degree = 1",
                                                                              "context_parallel_degree = 2"))
    s = import_torchtitan([str(path)], Options(gpu="H100-SXM", gpus=16)).scenario()
    assert (s.parallel.cp, s.parallel.cp_comm_type) == (2, "all_gather")


def test_emit_deepspeed_refuses_context_parallelism() -> None:
    """A DeepSpeed ZeRO run under the HF Trainer has no context parallelism: a layout with parallel.cp 2 is refused
    in one line naming the knob, not written as data parallelism over the cp ranks (found in review9)."""
    from sim.interop.emit import emit
    from sim.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml",
                             ["parallel.cp=2", "parallel.dp=4", "training.global_batch=8"])
    with pytest.raises(ConfigError, match=r"^parallel.cp: "):
        emit(scenario, "deepspeed")
