"""Per-rank memory: model states and activations.

In: a ``ModelSpec``, the layout (tp, pp, stage), training dtype, micro-batch, sequence length, recompute
mode, ZeRO stage. Out: bytes of weights, gradients and optimizer states on one rank (mixed precision with
Adam: 2 + 2 + 12 bytes per parameter, Rajbhandari et al. SC20 Sec. 3.1, or 2 + 4 + 12 with fp32 gradients as
Megatron-LM keeps them for bf16; fp32: 4 + 4 + 8; divided over the data-parallel ranks by ZeRO stage), the
activation bytes one
layer stashes per micro-batch (Korthikanti et al. 2022 Table 2), and the peak of activations in flight given
when each (micro-batch, layer) was stashed and freed (taken from the trace).

The activation accounting is Korthikanti's, term by term, so that for a GPT layer (FFN = 4h, MHA) it equals
their formulas exactly: sbh(34 + 5as/h) without parallelism; sbh(10 + 24/t + 5as/(ht)) with TP;
sbh(34/t + 5as/(ht)) with TP + sequence parallel; the 5as/h term drops with selective recompute; 2sbh per
layer with full recompute. GQA and SwiGLU change the K/V and MLP terms accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.hardware.dtypes import bytes_per_element
from sim.model.params import embedding_params, head_params, layer_params
from sim.model.transformer import ModelSpec

Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class ModelStates:
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def optimizer_bytes_per_param(dtype: str, master_weights: bool = True, optimizer_dtype: str = "fp32") -> int:
    """Bytes of Adam's states per trained parameter: an fp32 master copy where the weights are 16-bit and
    ``master_weights`` (mixed precision, Micikevicius et al. 2018; Rajbhandari et al. SC20 Sec. 3.1: 4 + 4 + 4 =
    12), plus the first and second moments (exp_avg, exp_avg_sq) in ``optimizer_dtype``. fp32/tf32 weights are
    their own master (4 + 4 = 8). Pure 16-bit training keeps no master and Adam's moments in the parameters'
    dtype, as torch.optim.AdamW allocates them (``torch.zeros_like(param)``): torchtune's ``dtype: bf16`` ("all
    activations, gradients and optimizer states are in bfloat16", recipes/lora_finetune_distributed.py), 2 + 2 =
    4. Megatron-Core's precision-aware optimizer keeps the fp32 master with bf16 moments (``--exp-avg-dtype``,
    ``--exp-avg-sq-dtype``): 4 + 2 + 2 = 8."""
    master = 4 if master_weights and dtype not in ("fp32", "tf32") else 0
    return master + 2 * bytes_per_element(optimizer_dtype)


def adam_step_bytes_per_param(dtype: str, grad_bytes: float, master_weights: bool = True,
                              optimizer_dtype: str = "fp32") -> float:
    """HBM bytes the (memory-bound, fused) Adam step moves per parameter: it reads the gradient, the master copy
    (or, without one, the weight itself) and both moments, writes those three back, and, where a master exists,
    writes the working 16-bit weight cast from it (apex/TE multi_tensor_adam, torch's fused AdamW). Mixed
    precision with a 16-bit gradient: 2 + 12 + 12 + 2 = 28 (30 with Megatron-LM's fp32 gradients); pure bf16
    (torchtune): 2 + 6 + 6 = 14; fp32 weights, their own master: 4 + 12 + 12 = 28."""
    wide = dtype in ("fp32", "tf32")
    weight, moments = (4 if wide else 2), 2 * bytes_per_element(optimizer_dtype)
    if wide or not master_weights:  # Adam updates the weight itself in place
        return grad_bytes + 2 * (weight + moments)
    return grad_bytes + 2 * (4 + moments) + weight


def model_state_bytes(params: float, dtype: str, zero_stage: int = 0, shards: int = 1,
                      grad_dtype: str | None = None, master_weights: bool = True,
                      optimizer_dtype: str = "fp32") -> ModelStates:
    """Weights, gradients and Adam states (fp32 master copy, m, v where mixed precision) that one rank keeps
    for ``params`` parameters, with ZeRO stage 1 sharding the optimizer states over ``shards`` data-parallel
    ranks, stage 2 also the gradients and stage 3 also the weights (Rajbhandari et al. SC20 Sec. 5:
    (4 + 12/N), (2 + 14/N) and 16/N bytes per parameter for mixed precision). ``grad_dtype``: gradients kept
    in another dtype than the weights (``Scenario.grad_dtype``: fp32 for Megatron-LM's bf16, 18 bytes each).
    ``master_weights`` / ``optimizer_dtype``: the optimizer's states (``optimizer_bytes_per_param``; pure bf16
    training: 2 + 2 + 4 = 8 bytes per parameter)."""
    weights, gradients = (4, 4) if dtype in ("fp32", "tf32") else (2, 2)
    optimizer = optimizer_bytes_per_param(dtype, master_weights, optimizer_dtype)
    if grad_dtype is not None:
        gradients = bytes_per_element(grad_dtype)
    return ModelStates(
        weights=weights * params / (shards if zero_stage >= 3 else 1),
        gradients=gradients * params / (shards if zero_stage >= 2 else 1),
        optimizer=optimizer * params / (shards if zero_stage >= 1 else 1),
    )


def placed(states: ModelStates, offload_optimizer: bool, offload_params: bool) -> tuple[ModelStates, float]:
    """(what stays in HBM, bytes in host memory) under CPU offload: the optimizer states (fp32 master, m, v)
    and, with parameter offload, the 16-bit weight shards move to the host (Ren et al. ATC 2021)."""
    host = (states.optimizer if offload_optimizer else 0.0) + (states.weights if offload_params else 0.0)
    gpu = ModelStates(weights=0.0 if offload_params else states.weights, gradients=states.gradients,
                      optimizer=0.0 if offload_optimizer else states.optimizer)
    return gpu, host


def comm_buffer_bytes(zero_stage: int, dp: int, sharded_units: bool, gradient_bytes: float, bucket_size: float,
                      bucket_view: bool, main_grad_buffer: bool = False) -> float:
    """Communication buffers beside the model states. DDP copies gradients into flat buckets (a second copy of
    every gradient unless gradient_as_bucket_view); ZeRO-1/2 reduce through two buckets (DeepSpeed's
    overlap_comm double buffer); ZeRO-3/FSDP's flat parameters are the gathered and unreduced buffers the trace
    already counts. ``main_grad_buffer``: Megatron-LM's wider-than-the-weights (fp32) gradients live in one
    contiguous buffer that its buckets and its distributed optimizer's reduce-scatter are views of
    (megatron/core/distributed/param_and_grad_buffer.py), so without sharded gradients there is no copy."""
    if dp <= 1 or sharded_units or (main_grad_buffer and zero_stage <= 1):
        return 0.0
    if zero_stage == 0:
        return 0.0 if bucket_view else gradient_bytes
    return min(2 * bucket_size, gradient_bytes)


def with_allocator(parts: dict[str, float], reserved: float, overhead: float) -> dict[str, float]:
    """``parts`` plus the CUDA context/workspaces (``reserved``) and the caching allocator's fragmentation
    (``overhead`` x everything allocated through it), and the new total."""
    allocated = sum(value for key, value in parts.items() if key != "total")
    extra = {"allocator_overhead": overhead * allocated, "reserved": reserved}
    return {**{k: v for k, v in parts.items() if k != "total"}, **extra,
            "total": allocator_total(allocated, reserved, overhead)}


def allocator_total(allocated: float, reserved: float, overhead: float) -> float:
    """``with_allocator``'s total of ``allocated`` bytes: they, the caching allocator's ``overhead`` share of them
    and the ``reserved`` context/workspaces (the overhead and reserved added first, as the parts are listed)."""
    return allocated + (overhead * allocated + reserved)


def rank_params(spec: ModelSpec, tp: int, layers: int, embedding: bool, head: bool, tied_copy: bool) -> float:
    """Parameters held by one TP rank with ``layers`` transformer layers, plus the input embedding and the
    final norm + LM head where it runs them, and (``tied_copy``) the head's own copy of tied word embeddings,
    which Megatron keeps on a head stage other than the embedding's. Which stage holds what is the plan's
    (``sim.plan.Plan.stage_params``)."""
    params = layers * layer_params(spec).per_tp_rank(tp)
    if embedding:
        params += embedding_params(spec) / tp
    if head:
        params += head_params(spec) / tp
    if tied_copy:
        params += spec.vocab_size * spec.hidden_size / tp
    return params


def activation_bytes_per_layer(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash_attention: bool = False,
    moe: bool = False,
    routed_tokens: float = 0.0,
    etp: int = 1,
    modules: frozenset[str] | None = None,
) -> float:
    """Bytes one transformer layer keeps for the backward of one micro-batch (16-bit activations, 1-byte
    dropout masks), per TP rank.

    ``moe``: a MoE layer, whose MLP activations (dense: fc1 output and activation output, sharded by tp) are
    instead, for ``routed_tokens`` token-expert pairs on this rank (the Plan's, imbalance included):
    the router's scores (rank's tokens x E, for the softmax/sigmoid backward), the permuted tokens (the experts'
    fc1 input, routed_tokens x h, whole on every etp rank), the experts' fc1 and activation outputs (sharded by
    etp) and the expert outputs the unpermute's top-k weighted sum keeps for its probability gradient (rank's
    tokens x topk x h; Megatron-Core moe_utils.unpermute); plus a shared expert's fc1 and activation outputs,
    sharded by tp like a dense MLP's. Its input is the dense MLP's (already counted).
    Multi-head latent attention keeps its latents whole on every TP rank (the q and kv down projections' outputs
    and their norms' outputs, gathered under sequence parallelism) and Q, K (d_nope + d_rope), V and the
    projection input (d_v) per head, sharded by tp.

    ``modules``: under selective recomputation, the submodules recomputed in the backward (Megatron-Core
    --recompute-modules; default ``{"core_attn"}``, Korthikanti's selective recompute), whose activations are
    not kept: ``core_attn`` the attention scores (without flash attention); ``layernorm`` the two norms' outputs,
    i.e. the QKV and MLP inputs (2sbh each; output-discarding checkpoint, transformer_layer.py); ``mla_up_proj``
    MLA's Q, K and V (the up projections' outputs after RoPE; multi_latent_attention.py); ``mlp`` a dense
    layer's fc1 and activation outputs; ``moe_act`` the routed experts' activation output (routed tokens x
    moe_ffn / etp, experts.py CheckpointWithoutOutput); ``shared_experts`` the shared expert's fc1 and
    activation outputs; ``moe`` everything of the MoE layer past its input (moe_layer.py: the layer runs under
    tensor_parallel.checkpoint, which keeps only its input)."""
    s, b, h = seq_len, micro_batch, spec.hidden_size
    sbh = s * b * h
    if recompute == "full":
        # Only the layer input is kept (Korthikanti Table 2, last row), and under sequence parallelism that input
        # is already the [s/t, b, h] shard: Megatron-LM's TransformerBlock keeps it whole only without SP
        # (distribute_saved_activations = config.distribute_saved_activations and not config.sequence_parallel),
        # TorchTitan's SequenceParallel blocks take a Shard(1) input.
        return 2.0 * sbh / tp if sequence_parallel else 2.0 * sbh
    if modules is None:
        modules = frozenset({"core_attn"}) if recompute == "selective" else frozenset()
    # Kept whole on every TP rank unless sequence parallel shards them: two norm inputs (4sbh), QKV and MLP
    # inputs (2sbh each), two dropout masks (sbh each). The QKV and MLP inputs are the norms' outputs.
    replicated = (6.0 if "layernorm" in modules else 10.0) * sbh
    # Sharded by TP: Q and K (2sbq + 2sb*kv), V (2sb*kv), projection input (2sbq; q = heads x head_dim = h
    # unless kv_channels), MLP activations.
    latents = 0.0
    if spec.multi_latent_attention:
        heads, v = spec.num_attention_heads, spec.v_head_dim or 0
        qk = (spec.qk_head_dim or 0) + (spec.qk_pos_emb_head_dim or 0)
        attention_acts = 2 * heads * qk + 2 * heads * qk + 2 * heads * v + 2 * heads * v
        if "mla_up_proj" in modules:  # Q, K, V recomputed from the latents; the projection input stays
            attention_acts = 2 * heads * v
        latents = 2.0 * s * b * (2 * (spec.q_lora_rank or 0) + (spec.kv_lora_rank or 0) * 2
                                 + (spec.qk_pos_emb_head_dim or 0))
    else:
        attention_acts = 2 * spec.q_dim + 2 * spec.kv_dim + 2 * spec.kv_dim + 2 * spec.q_dim
    acts_per_width = 6 if spec.gated_mlp else 4  # fc1 output (x2 gate and up) and activation output
    routed = 0.0
    if moe:
        shared_dropped = "shared_experts" in modules or "moe" in modules
        mlp_acts = 0 if shared_dropped else acts_per_width * (spec.moe_shared_expert_intermediate_size or 0)
        rank_tokens = s * b / tp if sequence_parallel else s * b
        experts, topk = spec.num_moe_experts or 0, spec.moe_router_topk
        expert_width = (acts_per_width - (2 if "moe_act" in modules else 0)) * spec.moe_ffn / etp
        routed = 0.0 if "moe" in modules else (2.0 * rank_tokens * experts + 2.0 * routed_tokens * h
                                                + routed_tokens * expert_width + 2.0 * rank_tokens * topk * h)
    else:
        mlp_acts = 0 if "mlp" in modules else acts_per_width * spec.ffn
    sharded = s * b * (attention_acts + mlp_acts)
    if flash_attention:
        scores = 4.0 * b * spec.num_attention_heads * s  # fp32 log-sum-exp per row instead of s x s scores
    elif "core_attn" in modules:
        scores = 0.0  # the attention core is recomputed (Korthikanti Sec. 5)
    else:
        scores = 5.0 * spec.num_attention_heads * s * s * b  # softmax out (2), dropout mask (1), dropout out (2)
    per_rank_replicated = replicated / tp if sequence_parallel else replicated
    if not moe and not spec.multi_latent_attention:
        return per_rank_replicated + (sharded + scores) / tp
    return per_rank_replicated + (sharded + scores) / tp + latents + routed


CrossEntropy = Literal["fused", "megatron", "hf"]
# The loss head's logits, in bytes per logit element (tokens x vocab / tp on a TP rank): (held from the head's
# forward to its backward, the peak while the loss and its gradient run). The bf16 logits GEMM output is 2 bytes.
# - fused: nothing held beyond the kernel (the accounting of earlier versions of this simulator).
# - megatron: VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py) casts the bf16 logits to
#   fp32 (``calculate_logits_max``: ``vocab_parallel_logits.float()``), turns them in place into exp_logits and
#   saves those for the backward (4 held); forward peak bf16 + fp32 = 6; the backward makes the softmax gradient
#   in place and casts it to bf16 for the output layer's backward (4 + 2 = 6).
# - hf: Hugging Face transformers with the Trainer's bf16 autocast: the loss (ForCausalLMLoss in
#   transformers/loss/loss_utils.py, ``logits = logits.float()``; remote-code models such as Qwen-7B's
#   modeling_qwen.py slice ``lm_logits[..., :-1, :].contiguous()`` and torch.autocast runs log_softmax/nll_loss in
#   fp32, "CUDA Ops that can autocast to float32") keeps the fp32 log_softmax output for the backward (4 held).
#   The peak is the backward of log_softmax: nll_loss's dense fp32 gradient, the saved output and the input
#   gradient it writes, 3 x 4 = 12 (the forward's bf16 logits + fp32 copy + log_softmax output is 10, or 12 with
#   Qwen's bf16 shifted copy).
LOSS_BYTES: dict[str, tuple[float, float]] = {"fused": (0.0, 0.0), "megatron": (4.0, 6.0), "hf": (4.0, 12.0)}


def loss_bytes(spec: ModelSpec, micro_batch: int, seq_len: int, tp: int, mode: CrossEntropy) -> float:
    """Peak bytes the loss head's logits take on a TP rank of the head stage for one micro-batch under
    ``mode`` (``LOSS_BYTES``): tokens x vocab / tp elements."""
    return micro_batch * seq_len * spec.vocab_size / tp * LOSS_BYTES[mode][1]


def peak_usage(parts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Peak of the sum of several kinds of allocations, each given as (alloc times, free times, bytes), and
    each kind's bytes at that moment. At equal times allocations come before frees (the conservative order)."""
    times, deltas, kinds = [], [], []
    for index, (starts, ends, sizes) in enumerate(parts.values()):
        times += [np.asarray(starts, float), np.asarray(ends, float)]
        deltas += [np.asarray(sizes, float), -np.asarray(sizes, float)]
        kinds += [np.full(len(starts), index), np.full(len(ends), index)]
    result = {name: 0.0 for name in parts}
    if not times or sum(len(t) for t in times) == 0:
        return result | {"total": 0.0}
    t, d, k = np.concatenate(times), np.concatenate(deltas), np.concatenate(kinds)
    order = np.lexsort((-np.sign(d), t))
    d, k = d[order], k[order]
    per_kind = np.zeros((len(parts), len(d)))
    per_kind[k, np.arange(len(d))] = d
    running = np.cumsum(per_kind, axis=1)
    at = int(np.argmax(running.sum(axis=0)))
    for index, name in enumerate(parts):
        result[name] = float(running[index, at])
    return result | {"total": float(running[:, at].sum())}
