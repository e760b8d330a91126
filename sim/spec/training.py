"""The ``training:`` section of a scenario: what one optimizer step trains, and how its kernels run.

In: the ``training:`` mapping: batch and sequence length, dtypes (training, gradients, master weights, Adam's
moments), recomputation (full, selective, Megatron-Core's recompute modules), kernel options (attention backend,
fused kernels, FP8's recipe and casts, CUDA graphs), gradient clipping, the trainer's metric sync, a token budget,
the loss head's logits, activation offload, the inputs' document lengths (``sim.spec.sequence``) and the
fine-tuning method (``sim.spec.method``). Out: a frozen ``TrainingSpec`` with every default filled, and
``RecomputeModule``, the recompute module names it accepts. The batch and sequence length it leaves unset are
implied by ``sim.spec.degrees``; the rules across its fields and other sections are ``sim.spec.rules_training``'.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.spec.method import LoraSpec, QloraSpec
from sim.spec.sequence import SequenceSpec
from sim.units import Count

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
