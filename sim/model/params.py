"""Parameter counts of a ``ModelSpec``: per layer (split by how tensor and expert parallelism shard them), per
leaf module (what FSDP / ZeRO-3 fetch as one), and for the embedding, the LM head and the whole model (total and
active).

In: a ``ModelSpec`` (sim.model.transformer), and for per-rank counts the TP (and EP x ETP) degrees. Out: integer
parameter counts (``LayerParams``, ``embedding_params``, ``head_params``, ``total_params``, ``active_params``)
and per-TP-rank element counts of each leaf module's tensors (``layer_modules``). A GPT model's count is
12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)) (Narayanan et al. SC21 eq. 2) plus the final layer norm.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.transformer import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, split by how tensor and expert parallelism shard them."""

    sharded: int  # weight matrices and column-parallel biases (shared expert included): divided by tp
    replicated: int  # norms, row-parallel output biases, MLA's down projections, the router: on every TP rank
    experts: int = 0  # all routed experts of a MoE layer, summed over experts: divided by ep x etp

    @property
    def total(self) -> int:
        return self.sharded + self.replicated + self.experts

    def per_tp_rank(self, tp: int) -> float:
        """Dense parameters one TP rank holds (routed experts excluded: ``experts_per_rank``)."""
        return self.sharded / tp + self.replicated

    def experts_per_rank(self, ep: int, etp: int) -> float:
        """Routed-expert parameters one rank holds: E/ep experts, each split over etp ranks."""
        return self.experts / (ep * etp)


def norm_params(spec: ModelSpec) -> int:
    """Parameters of one norm over hidden_size (LayerNorm: weight and bias; RMSNorm: weight)."""
    return 2 * spec.hidden_size if spec.norm == "layernorm" else spec.hidden_size


def norm_params_of(spec: ModelSpec, width: int) -> int:
    """Parameters of one norm over ``width`` (MLA's latent norms, Qwen3's q/k norms)."""
    return 2 * width if spec.norm == "layernorm" else width


def attention_params(spec: ModelSpec) -> tuple[int, int]:
    """(sharded, replicated) parameters of the attention block, input norm included.
    MHA/GQA: fused QKV h x (q + 2kv) and output projection q x h (q = heads x head_dim), their biases; Qwen3's
    q/k norms of head_dim (Megatron-Core qk_layernorm); GPT-OSS's learnable sinks, one per head (sharded with the
    heads). MLA (DeepSeek-V2 Sec. 2.1.2, HF modeling_deepseek DeepseekV3Attention): q down h x q_lora_rank with
    its norm, q up q_lora_rank x heads(d_nope + d_rope) (a full h x heads(d_nope + d_rope) without q_lora_rank),
    kv down h x (kv_lora_rank + d_rope) (the shared RoPE key) with a norm of kv_lora_rank, kv up
    kv_lora_rank x heads(d_nope + d_v), output heads d_v x h. Megatron-Core builds the two down projections as
    duplicated TELinear (multi_latent_attention.py, parallel_mode='duplicated'): every TP rank holds them whole."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    if spec.multi_latent_attention:
        kv_lora = spec.kv_lora_rank or 0
        nope, rope, v = spec.qk_head_dim or 0, spec.qk_pos_emb_head_dim or 0, spec.v_head_dim or 0
        q_width = heads * (nope + rope)
        if spec.q_lora_rank:
            q_sharded = spec.q_lora_rank * q_width
            q_replicated = h * spec.q_lora_rank + norm_params_of(spec, spec.q_lora_rank)
        else:
            q_sharded, q_replicated = h * q_width, 0
        sharded = q_sharded + kv_lora * heads * (nope + v) + heads * v * h
        replicated = q_replicated + h * (kv_lora + rope) + norm_params_of(spec, kv_lora) + norm_params(spec)
        return sharded, replicated
    q, kv = spec.q_dim, spec.kv_dim
    sharded = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if spec.bias or spec.add_qkv_bias else 0)
    sharded += heads if spec.softmax_type == "learnable" else 0
    replicated = (h if spec.bias else 0) + norm_params(spec)
    replicated += 2 * norm_params_of(spec, spec.head_dim) if spec.qk_layernorm else 0
    return sharded, replicated


def _mlp_params(spec: ModelSpec, width: int) -> tuple[int, int]:
    """(column-parallel, row-parallel) parameters of one MLP of FFN ``width``: weights and the up projection's
    bias, then the down projection's bias (h, replicated over TP)."""
    h = spec.hidden_size
    if width == 0:  # no such MLP (a MoE layer without a shared expert)
        return 0, 0
    column = spec.mlp_matrices * h * width + ((spec.mlp_matrices - 1) * width if spec.bias else 0)
    return column, h if spec.bias else 0


def layer_params(spec: ModelSpec, moe: bool = False) -> LayerParams:
    """Parameters of one layer: a dense one, or (``moe``) a MoE one, whose MLP is a router (E x h weight,
    replicated; plus an E bias where ``bias`` (GPT-OSS's router is a biased linear, HF GptOssTopKRouter) and E
    more for ``moe_router_enable_expert_bias``), the shared expert (sharded by tp like a dense MLP) and E routed
    experts of width ``moe_ffn`` (with their biases under ``bias``: GPT-OSS's gate_up_proj_bias, down_proj_bias)."""
    h, f = spec.hidden_size, spec.ffn
    attention_sharded, attention_replicated = attention_params(spec)
    norm = norm_params(spec)  # the post-attention norm
    if not moe:
        column, row = _mlp_params(spec, f)
        return LayerParams(attention_sharded + column, attention_replicated + row + norm)
    experts = spec.num_moe_experts or 0
    router = experts * h + (experts if spec.bias else 0) + (experts if spec.moe_router_enable_expert_bias else 0)
    shared_column, shared_row = _mlp_params(spec, spec.moe_shared_expert_intermediate_size or 0)
    expert_column, expert_row = _mlp_params(spec, spec.moe_ffn)
    return LayerParams(
        sharded=attention_sharded + shared_column,
        replicated=attention_replicated + norm + router + shared_row,
        experts=experts * (expert_column + expert_row),
    )


@dataclass(frozen=True)
class LayerModule:
    """One leaf module of a transformer layer (what a framework hooks and fetches as one): its parameter tensors'
    element counts per TP rank, in registration order (weight, then bias)."""

    name: str
    block: str  # attention or mlp
    tensors: tuple[float, ...]

    @property
    def params(self) -> float:
        return sum(self.tensors)


def layer_modules(spec: ModelSpec, tp: int = 1, moe: bool = False) -> tuple[LayerModule, ...]:
    """A layer's leaf modules in forward order, as Megatron-style fused modules (Megatron-DeepSpeed GPT: fused QKV
    and, for SwiGLU, one fused gate+up projection): input norm, QKV, output projection, post-attention norm, MLP
    up (fc1) and down (fc2). Weights and column-parallel biases are divided by ``tp``; norms and row-parallel
    biases are not. Their sum is ``layer_params(spec, moe).per_tp_rank(tp)``. Beside those: Qwen3's q/k norms,
    GPT-OSS's sinks (its attention module's own tensor, sharded with the heads), MLA's down projections, latent
    norms and up projections (Megatron-Core's linear_q_down_proj ... linear_kv_up_proj), and for a MoE layer
    (``moe``) the router and the shared expert's fc1 and fc2 in place of the MLP; the routed experts are not
    here (``LayerParams.experts_per_rank``)."""
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    norm = (float(h), float(h)) if spec.norm == "layernorm" else (float(h),)
    bias = spec.bias

    def norm_of(width: int) -> tuple[float, ...]:
        return (float(width), float(width)) if spec.norm == "layernorm" else (float(width),)

    attention: list[LayerModule] = [LayerModule("input_norm", "attention", norm)]
    if spec.multi_latent_attention:
        heads, kv_lora = spec.num_attention_heads, spec.kv_lora_rank or 0
        nope, rope, v = spec.qk_head_dim or 0, spec.qk_pos_emb_head_dim or 0, spec.v_head_dim or 0
        if spec.q_lora_rank:
            attention += [LayerModule("q_down_proj", "attention", (float(h * spec.q_lora_rank),)),
                          LayerModule("q_norm", "attention", norm_of(spec.q_lora_rank)),
                          LayerModule("q_up_proj", "attention", (spec.q_lora_rank * heads * (nope + rope) / tp,))]
        else:
            attention.append(LayerModule("q_proj", "attention", (h * heads * (nope + rope) / tp,)))
        attention += [LayerModule("kv_down_proj", "attention", (float(h * (kv_lora + rope)),)),
                      LayerModule("kv_norm", "attention", norm_of(kv_lora)),
                      LayerModule("kv_up_proj", "attention", (kv_lora * heads * (nope + v) / tp,)),
                      LayerModule("out_proj", "attention", (heads * v * h / tp,))]
    else:
        q = spec.q_dim
        attention.append(LayerModule("qkv", "attention",
                                     (h * (q + 2 * kv) / tp,)
                                     + (((q + 2 * kv) / tp,) if bias or spec.add_qkv_bias else ())))
        if spec.qk_layernorm:
            attention += [LayerModule("q_norm", "attention", norm_of(spec.head_dim)),
                          LayerModule("k_norm", "attention", norm_of(spec.head_dim))]
        if spec.softmax_type == "learnable":
            attention.append(LayerModule("sinks", "attention", (spec.num_attention_heads / tp,)))
        attention.append(LayerModule("out_proj", "attention", (q * h / tp,) + ((float(h),) if bias else ())))
    mlp: list[LayerModule] = [LayerModule("post_attention_norm", "mlp", norm)]
    width, prefix = f, "fc"
    if moe:
        experts = spec.num_moe_experts or 0
        router_bias = (experts if bias else 0) + (experts if spec.moe_router_enable_expert_bias else 0)
        mlp.append(LayerModule("router", "mlp", (float(experts * h),) + ((float(router_bias),) if router_bias else ())))
        width, prefix = spec.moe_shared_expert_intermediate_size or 0, "shared_expert_fc"
    if width:
        up = (spec.mlp_matrices - 1) * width  # gate + up under SwiGLU, one matrix under GELU
        mlp += [LayerModule(f"{prefix}1", "mlp", (h * up / tp,) + ((up / tp,) if bias else ())),
                LayerModule(f"{prefix}2", "mlp", (h * width / tp,) + ((float(h),) if bias else ()))]
    return tuple(attention + mlp)


def embedding_params(spec: ModelSpec) -> int:
    positions = spec.max_seq_len * spec.hidden_size if spec.position_embedding == "learned" else 0
    return spec.vocab_size * spec.hidden_size + positions


def head_params(spec: ModelSpec) -> int:
    """Final norm plus the output projection (zero extra when tied to the input embedding)."""
    return norm_params(spec) + (0 if spec.tied_embeddings else spec.vocab_size * spec.hidden_size)


def total_params(spec: ModelSpec) -> int:
    """Every parameter: layers (dense and MoE), embedding, final norm and LM head. DeepSeek-V3's multi-token
    prediction module is not part of the model here (its 671B excludes it)."""
    if not spec.is_moe:
        return spec.num_layers * layer_params(spec).total + embedding_params(spec) + head_params(spec)
    moe = spec.num_moe_layers
    layers = moe * layer_params(spec, moe=True).total + (spec.num_layers - moe) * layer_params(spec).total
    return layers + embedding_params(spec) + head_params(spec)


def active_params(spec: ModelSpec) -> int:
    """Parameters one token passes through: ``total_params`` with each MoE layer's routed experts cut to the
    top-k (moe_router_topk of num_moe_experts); the embedding and the LM head included (Mixtral's 12.9B counts
    both; GPT-OSS's model card counts the unembedding only)."""
    if not spec.is_moe:
        return total_params(spec)
    per_layer = layer_params(spec, moe=True)
    experts = spec.num_moe_experts or 1
    unused = per_layer.experts - per_layer.experts // experts * spec.moe_router_topk
    return total_params(spec) - spec.num_moe_layers * unused
