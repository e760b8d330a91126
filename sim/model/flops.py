"""Model FLOPs of a ``ModelSpec``: one layer's forward (dense or MoE), the logits, and a training step (MFU's
numerator).

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch (or global batch) and sequence length. Out: FLOPs
as floats. FLOPs follow Narayanan et al. SC21 (2 FLOPs per multiply-add, GEMMs only, attention counted over the
full s x s score matrix as Megatron does): a GPT layer's forward is 24*b*s*h^2 + 4*b*s^2*h. What the kernels
execute (causal or windowed attention runs fewer tiles) is the ops' ``Op.executed_flops``, not this count.
"""

from __future__ import annotations

from sim.model.params import attention_params, norm_params, norm_params_of
from sim.model.transformer import ModelSpec


def _attention_gemm_flops(spec: ModelSpec, tokens: int) -> int:
    """Projection GEMM FLOPs of one layer's attention (MLA: the down and up projections and the output)."""
    h = spec.hidden_size
    if not spec.multi_latent_attention:
        return 2 * tokens * (h * (spec.q_dim + 2 * spec.kv_dim) + spec.q_dim * h)
    sharded, replicated = attention_params(spec)
    norms = norm_params(spec) + norm_params_of(spec, spec.kv_lora_rank or 0) + (
        norm_params_of(spec, spec.q_lora_rank) if spec.q_lora_rank else 0)
    return 2 * tokens * (sharded + replicated - norms)  # MLA has no biases: every other parameter is a weight


def _attention_core_flops(spec: ModelSpec, tokens: int, seq_len: int) -> int:
    """Q K^T and (softmax) V over the full score matrix (Megatron's count): 2 x s x head dims per token and head;
    MLA's scores are over d_nope + d_rope, its values over d_v."""
    heads = spec.num_attention_heads
    if spec.multi_latent_attention:
        qk = (spec.qk_head_dim or 0) + (spec.qk_pos_emb_head_dim or 0)
        return 2 * tokens * seq_len * heads * (qk + (spec.v_head_dim or 0))
    return 2 * 2 * tokens * seq_len * spec.q_dim


def moe_mlp_forward_flops(spec: ModelSpec, tokens: float) -> float:
    """Active FLOPs of one MoE layer's MLP over ``tokens`` tokens: the router GEMM (E x h), the top-k routed
    experts and the shared expert."""
    h = spec.hidden_size
    routed = spec.moe_router_topk * spec.mlp_matrices * h * spec.moe_ffn
    shared = spec.mlp_matrices * h * (spec.moe_shared_expert_intermediate_size or 0)
    return 2.0 * tokens * ((spec.num_moe_experts or 0) * h + routed + shared)


def layer_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int, moe: bool = False) -> float:
    """Model FLOPs of one layer's forward for one micro-batch (all TP ranks together); ``moe``: a MoE layer,
    its MLP counted active (top-k routed experts, shared expert, router). Sliding-window layers (GPT-OSS) keep
    this module's full s x s convention (Narayanan et al.; causal attention is not halved either), so MFU stays
    comparable across models; Megatron-Bridge's newer FLOPs formula counts min(window, s) keys there instead.
    The flash kernel's time counts only the tiles it runs (sim.model.flash_tiles.window_fraction). Biases, norms and
    sinks are not GEMMs and not counted."""
    tokens = micro_batch * seq_len
    h, f = spec.hidden_size, spec.ffn
    # Integers until the end, so a dense layer's count is exactly 24bsh^2(1 + ...) as before MoE existed.
    attention_flops = _attention_gemm_flops(spec, tokens) + _attention_core_flops(spec, tokens, seq_len)
    if moe:
        return float(attention_flops) + moe_mlp_forward_flops(spec, tokens)
    return float(attention_flops + 2 * tokens * spec.mlp_matrices * h * f)


def logits_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> float:
    return float(2 * micro_batch * seq_len * spec.hidden_size * spec.vocab_size)


def model_flops_per_step(spec: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Training FLOPs of one step without recomputation: 3x forward (Korthikanti et al. 2022 eq. 7), dense and
    MoE layers each counted with their own forward."""
    if not spec.is_moe:
        per_sequence = (spec.num_layers * layer_forward_flops(spec, 1, seq_len)
                        + logits_forward_flops(spec, 1, seq_len))
        return 3.0 * global_batch * per_sequence
    moe = spec.num_moe_layers
    per_sequence = (moe * layer_forward_flops(spec, 1, seq_len, moe=True)
                    + (spec.num_layers - moe) * layer_forward_flops(spec, 1, seq_len)
                    + logits_forward_flops(spec, 1, seq_len))
    return 3.0 * global_batch * per_sequence
