"""The kernels of one layer's attention block on one TP rank: MHA/GQA or multi-head latent attention.

In: a ``LayerShape`` (sim.model.layer_shape: the ``ModelSpec``, micro-batch, sequence length, TP split, dtype
size and the kernel options: flash attention, fused or eager kernels, causal attention, FP8's casts) and under
context parallelism the keys each query sees. Out: ``Op`` tuples in forward order: input norm, QKV projection (MLA:
its down and up projections and latent norms), the attention core (one flash kernel, or scores, softmax and
values), output projection, dropout + residual. ``FLASH_ATTENTION`` and ``ATTENTION_CORE`` name the core's ops.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.model.flash_tiles import causal_fraction, window_fraction
from sim.model.fp8_casts import with_fp8_casts
from sim.model.layer_shape import LayerShape
from sim.model.ops import Op, eager_rope, elementwise, gemm, linear
from sim.model.transformer import ModelSpec

# The fused attention kernel's op name (priced on an attention curve where the profile has one: sim.costs.models).
FLASH_ATTENTION = "flash_attention"
# The attention core: what selective recomputation recomputes (Korthikanti et al. 2022 Sec. 5).
ATTENTION_CORE = frozenset({"attention_scores", "softmax_dropout", "attention_values", FLASH_ATTENTION})


def _executed_share(spec: ModelSpec, seq_len: int, causal: bool) -> float:
    """The share of the full-matrix attention FLOPs the flash kernel executes, averaged over the model's layers
    (the ops are one layer's, the same for every layer): full-attention layers ``causal_fraction`` (or all of it),
    sliding-window layers (``ModelSpec.window_layers``) ``window_fraction``."""
    full = causal_fraction(seq_len) if causal else 1.0
    if spec.window_size is None:
        return full
    windowed = sum(spec.window_layers)
    band = window_fraction(seq_len, spec.window_size)
    return ((spec.num_layers - windowed) * full + windowed * band) / spec.num_layers


def _mla_projections(spec: ModelSpec, tokens: float, replicated_tokens: float, tp: int, elem_bytes: int,
                     norm: Callable[..., Op]) -> list[Op]:
    """Multi-head latent attention's projections on one TP rank (Megatron-Core multi_latent_attention.py,
    MLASelfAttention.get_query_key_value_tensors): the q and kv down projections are duplicated linears run on the
    rank's own tokens (``replicated_tokens``: b*s/tp under sequence parallelism, whose all-gather then carries the
    latents), their norms, and the column-parallel up projections over all b*s tokens and heads/tp."""
    h, heads = spec.hidden_size, spec.num_attention_heads / tp
    kv_lora = spec.kv_lora_rank or 0
    nope, rope, v = spec.qk_head_dim or 0, spec.qk_pos_emb_head_dim or 0, spec.v_head_dim or 0
    ops: list[Op] = []
    if spec.q_lora_rank:
        ops += [linear("q_down_proj", replicated_tokens, spec.q_lora_rank, h, elem_bytes),
                norm("q_norm", replicated_tokens * spec.q_lora_rank, elem_bytes, reads=1, writes=1),
                linear("q_up_proj", tokens, heads * (nope + rope), spec.q_lora_rank, elem_bytes)]
    else:
        ops.append(linear("q_proj", tokens, heads * (nope + rope), h, elem_bytes))
    ops += [linear("kv_down_proj", replicated_tokens, kv_lora + rope, h, elem_bytes),
            norm("kv_norm", replicated_tokens * kv_lora, elem_bytes, reads=1, writes=1),
            linear("kv_up_proj", tokens, heads * (nope + v), kv_lora, elem_bytes)]
    return ops


def attention_forward_ops(shape: LayerShape, kv_seq_len: int | None = None,
                          executed: float | None = None) -> tuple[Op, ...]:
    """Forward kernels of one layer's attention block on one TP rank (``layer_forward_ops``'s ``attention``):
    input norm, QKV projection (MLA: its down and up projections), the attention core, output projection,
    dropout + residual. ``shape``: the rank's shape and kernel options (sim.model.layer_shape; all of them apply);
    under context parallelism (sim.parallel.context) ``shape.seq_len`` is the rank's s/cp tokens, ``kv_seq_len``
    the keys each query sees (all s; default ``shape.seq_len``) and ``executed`` the share of the flash kernel's
    full-matrix FLOPs it runs (default: ``causal_fraction``)."""
    spec, tp, elem_bytes = shape.spec, shape.tp, shape.elem_bytes
    b, s, h = shape.micro_batch, shape.seq_len, spec.hidden_size
    kv_s = kv_seq_len or s
    tokens, replicated_tokens = shape.tokens, shape.replicated_tokens
    heads = spec.num_attention_heads / tp
    kv_local = spec.kv_dim / tp
    q_local = spec.q_dim / tp
    hidden_elems = replicated_tokens * h
    if spec.multi_latent_attention:
        qk_dim = (spec.qk_head_dim or 0) + (spec.qk_pos_emb_head_dim or 0)
        v_dim = spec.v_head_dim or 0
    else:
        qk_dim = v_dim = spec.head_dim

    norm = shape.norm
    attention: list[Op] = [norm("input_norm", hidden_elems, elem_bytes, reads=1, writes=1)]
    if spec.multi_latent_attention:
        attention += _mla_projections(spec, tokens, replicated_tokens, tp, elem_bytes, norm)
    else:
        attention.append(linear("qkv_proj", tokens, q_local + 2 * kv_local, h, elem_bytes))
    if not shape.norm_rope_fused and spec.position_embedding == "rope":
        attention.append(eager_rope(tokens * (q_local + kv_local)))
    if shape.flash_attention:
        # Fused kernel: reads Q, K, V and writes O once; the s x s scores never reach HBM (Dao et al. 2022).
        # Its FLOPs are Megatron's full-matrix count (MFU, HFU); its time is that of the tiles it executes.
        if spec.multi_latent_attention:  # q and k of d_nope + d_rope, v and o of d_v per head
            flash_flops = 2.0 * b * heads * s * s * (qk_dim + v_dim)
            flash_bytes = float(elem_bytes * tokens * heads * (2 * qk_dim + 2 * v_dim))
        else:  # q and o of the rank's tokens, k and v of the keys they see
            flash_flops = 2.0 * 2 * b * heads * s * kv_s * spec.head_dim
            flash_bytes = float(elem_bytes * b * (2 * q_local * s + 2 * kv_local * kv_s))
        share = _executed_share(spec, s, shape.causal) if executed is None else executed
        attention.append(Op(FLASH_ATTENTION, flash_flops, flash_bytes, True, executed=share, head_dim=int(qk_dim)))
    else:
        score_elems = b * heads * s * s
        attention += [
            gemm("attention_scores", s, s, qk_dim, elem_bytes, batch=b * heads, weights=False),
            elementwise("softmax_dropout", score_elems, elem_bytes, reads=1, writes=2, masks=1),
            gemm("attention_values", s, v_dim, s, elem_bytes, batch=b * heads, weights=False),
        ]
    out_local = heads * v_dim if spec.multi_latent_attention else q_local
    if not shape.fused_kernels:  # (b, heads, s, d) attention output copied back to (b, s, h) before the projection
        attention.append(elementwise("attention_transpose", tokens * out_local, elem_bytes, reads=1, writes=1))
    attention += [
        linear("out_proj", tokens, h, out_local, elem_bytes),
        elementwise("attn_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1,
                    masks=1 if shape.fused_kernels else 0),
    ]
    return with_fp8_casts(tuple(attention), tp, shape.sequence_parallel, shape.fp8_casts)
