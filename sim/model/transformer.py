"""Transformer shapes: presets, parameter and FLOP counts (the Hugging Face ``config.json`` import is
``sim.model.hf_config``).

In: a preset name, an explicit shape, or the fields an HF config gives. Out: a frozen ``ModelSpec`` and pure
functions of it: parameters per layer / per tensor-parallel rank and model FLOPs per token. The kernels of a
layer's forward pass, which the cost models price, are in ``sim.model.ops``.

FLOPs follow Narayanan et al. SC21 (2 FLOPs per multiply-add, GEMMs only, attention counted over the full
s x s score matrix as Megatron does): a GPT layer's forward is 24*b*s*h^2 + 4*b*s^2*h, and parameters are
12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)) (their eq. 2) plus the final layer norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from sim.hardware.frozen import FrozenSpec
from sim.model.hf_config import read_hf_config as read_hf_config  # re-exported: the importer's old home
from sim.model.hf_config import spec_from_hf_config as spec_from_hf_config


class ModelSpec(FrozenSpec):
    name: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int | None = Field(default=None, ge=1, description="GQA groups; default = heads (MHA)")
    ffn_hidden_size: int | None = Field(default=None, ge=1, description="default 4*hidden (GELU MLP)")
    vocab_size: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)
    mlp: Literal["gelu", "swiglu", "geglu", "squared_relu"] = Field(default="gelu", description=(
        "gelu: 2 matrices; swiglu: 3 (gate, up, down), silu(gate) * up; geglu: 3, gelu(gate) * up (Shazeer 2020, "
        "'GLU Variants Improve Transformer'; Gemma); squared_relu: 2 matrices, relu(x)^2 (Nemotron-4)"))
    position_embedding: Literal["learned", "rope"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = True
    bias: bool = Field(default=True, description=(
        "biases on the linear layers (Megatron's add_bias_linear): QKV, output projection, MLP; on a MoE layer "
        "also every expert's two projections and the router (GPT-OSS)"))
    add_qkv_bias: bool = Field(default=False, description=(
        "a bias on the QKV projection alone (Megatron-Core's add_qkv_bias; Qwen2's q/k/v_proj, whose o_proj and MLP "
        "have none); implied by bias"))
    kv_channels: int | None = Field(default=None, ge=1, description=(
        "head dimension where it is not hidden_size / num_attention_heads (HF head_dim; Qwen3, GPT-OSS)"))
    qk_layernorm: bool = Field(default=False, description="a norm of head_dim on each query and key head (Qwen3)")
    # Mixture of experts (Megatron-Core TransformerConfig names).
    num_moe_experts: int | None = Field(default=None, ge=1, description="routed experts per MoE layer; None: dense")
    moe_router_topk: int = Field(default=2, ge=1, description="experts each token is routed to")
    moe_ffn_hidden_size: int | None = Field(default=None, ge=1, description=(
        "one routed expert's FFN width; default ffn_hidden_size"))
    moe_shared_expert_intermediate_size: int | None = Field(default=None, ge=1, description=(
        "total FFN width of the shared expert(s) every token passes through (DeepSeek); None: none"))
    moe_layer_freq: int | tuple[int, ...] = Field(default=1, description=(
        "int N: layer i (0-based) is MoE iff i % N == 0; a tuple: one 0/1 per layer (DeepSeek-V3: 3 dense, 58 MoE)"))
    moe_router_enable_expert_bias: bool = Field(default=False, description=(
        "a per-expert routing bias of E parameters (DeepSeek-V3's aux-loss-free balancing, e_score_correction_bias)"))
    # Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core MLATransformerConfig names).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = Field(default=None, ge=1, description="query latent width; None: a full q projection")
    kv_lora_rank: int | None = Field(default=None, ge=1, description="key/value latent width")
    qk_head_dim: int | None = Field(default=None, ge=1, description=(
        "query/key head dim without RoPE (HF qk_nope_head_dim)"))
    qk_pos_emb_head_dim: int | None = Field(default=None, ge=1, description="the RoPE part (HF qk_rope_head_dim)")
    v_head_dim: int | None = Field(default=None, ge=1, description="value head dim")
    # GPT-OSS (Megatron-Core names): learnable attention sinks, one logit per head ("learnable"; "off-by-one": a
    # fixed one, no parameters); sliding-window attention of window_size tokens on all layers but every
    # window_attn_skip_freq-th. Neither changes FLOPs in Megatron's full s x s count (see layer_forward_flops).
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = "vanilla"
    window_size: int | None = Field(default=None, ge=1, description="sliding-window attention span (GPT-OSS: 128)")
    window_attn_skip_freq: int | None = Field(default=None, ge=1, description=(
        "every N-th layer (1-based) attends fully, the others over window_size (GPT-OSS: 2)"))

    @model_validator(mode="after")
    def _fill_defaults(self) -> ModelSpec:
        # Frozen model: fill derived defaults once, so the resolved scenario shows them explicitly.
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.num_moe_experts is not None and self.moe_ffn_hidden_size is None:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        if self.kv_channels is None and not self.multi_latent_attention and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_kv_heads {self.kv_heads}"
            )
        if self.num_moe_experts is not None and self.moe_router_topk > self.num_moe_experts:
            raise ValueError(
                f"moe_router_topk {self.moe_router_topk} exceeds num_moe_experts {self.num_moe_experts}")
        if isinstance(self.moe_layer_freq, tuple):
            if len(self.moe_layer_freq) != self.num_layers or set(self.moe_layer_freq) - {0, 1}:
                raise ValueError(f"moe_layer_freq must be {self.num_layers} entries of 0 or 1 (one per layer)")
        elif self.moe_layer_freq < 1:
            raise ValueError(f"moe_layer_freq {self.moe_layer_freq} must be at least 1")
        if self.multi_latent_attention:
            for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
                if getattr(self, key) is None:
                    raise ValueError(f"{key} is required with multi_latent_attention")
            if self.bias or self.add_qkv_bias:
                raise ValueError("bias with multi_latent_attention is not modelled (DeepSeek's MLA has none)")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim; hidden_size unless kv_channels."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        """A gated linear unit (Megatron-Core's gated_linear_unit): fc1 makes gate and up, 3 matrices."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts is not None

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Whether each layer (global 0-based index) is a MoE layer (Megatron-Core's moe_layer_freq rule)."""
        if self.num_moe_experts is None:
            return (False,) * self.num_layers
        if isinstance(self.moe_layer_freq, tuple):
            return tuple(bool(flag) for flag in self.moe_layer_freq)
        return tuple(i % self.moe_layer_freq == 0 for i in range(self.num_layers))

    @property
    def window_layers(self) -> tuple[bool, ...]:
        """Whether each layer attends over a sliding window of ``window_size`` tokens: all but every
        ``window_attn_skip_freq``-th layer (1-based, Megatron-Core's rule; GPT-OSS: even 0-based layers)."""
        if self.window_size is None:
            return (False,) * self.num_layers
        skip = self.window_attn_skip_freq
        return tuple(skip is None or (i + 1) % skip != 0 for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def moe_ffn(self) -> int:
        """One routed expert's FFN width."""
        return self.moe_ffn_hidden_size or self.ffn


# ----------------------------------------------------------------------------------------------- parameters


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


def _norm_params(spec: ModelSpec) -> int:
    return 2 * spec.hidden_size if spec.norm == "layernorm" else spec.hidden_size


def _norm_of(spec: ModelSpec, width: int) -> int:
    return 2 * width if spec.norm == "layernorm" else width


def _attention_params(spec: ModelSpec) -> tuple[int, int]:
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
            q_replicated = h * spec.q_lora_rank + _norm_of(spec, spec.q_lora_rank)
        else:
            q_sharded, q_replicated = h * q_width, 0
        sharded = q_sharded + kv_lora * heads * (nope + v) + heads * v * h
        replicated = q_replicated + h * (kv_lora + rope) + _norm_of(spec, kv_lora) + _norm_params(spec)
        return sharded, replicated
    q, kv = spec.q_dim, spec.kv_dim
    sharded = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if spec.bias or spec.add_qkv_bias else 0)
    sharded += heads if spec.softmax_type == "learnable" else 0
    replicated = (h if spec.bias else 0) + _norm_params(spec)
    replicated += 2 * _norm_of(spec, spec.head_dim) if spec.qk_layernorm else 0
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
    attention_sharded, attention_replicated = _attention_params(spec)
    norm = _norm_params(spec)  # the post-attention norm
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
    return _norm_params(spec) + (0 if spec.tied_embeddings else spec.vocab_size * spec.hidden_size)


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


# ------------------------------------------------------------------------------------------------- FLOPs


def _attention_gemm_flops(spec: ModelSpec, tokens: int) -> int:
    """Projection GEMM FLOPs of one layer's attention (MLA: the down and up projections and the output)."""
    h = spec.hidden_size
    if not spec.multi_latent_attention:
        return 2 * tokens * (h * (spec.q_dim + 2 * spec.kv_dim) + spec.q_dim * h)
    sharded, replicated = _attention_params(spec)
    norms = _norm_params(spec) + _norm_of(spec, spec.kv_lora_rank or 0) + (
        _norm_of(spec, spec.q_lora_rank) if spec.q_lora_rank else 0)
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
    The flash kernel's time counts only the tiles it runs (sim.model.ops.window_fraction). Biases, norms and
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


# ------------------------------------------------------------------------------------------ presets, import


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    # GPT-3 paper Table 2.1 shapes; vocabulary padded to 51200 as in Megatron-LM (Narayanan et al. Table 1).
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        vocab_size=51200, max_seq_len=2048,
    )


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> ModelSpec:
    # Shapes from the models' published config.json files on the Hugging Face hub.
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
        ffn_hidden_size=ffn, vocab_size=vocab, max_seq_len=seq, mlp="swiglu", position_embedding="rope",
        norm="rmsnorm", tied_embeddings=False, bias=False,
    )


# Mixture-of-experts presets, each from its Hugging Face config.json (copies in tests/data/hf_configs/, which
# tests/test_model_moe.py imports and compares with these): mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1,
# Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3 (without its multi-token-prediction layer,
# num_nextn_predict_layers), openai/gpt-oss-120b.
def _moe(**fields: Any) -> ModelSpec:
    # Every MoE preset here is a Llama-style decoder: SwiGLU experts, RoPE, RMSNorm, untied head, no biases.
    return ModelSpec(**{"mlp": "swiglu", "position_embedding": "rope", "norm": "rmsnorm", "tied_embeddings": False,
                        "bias": False, **fields})


MOE_PRESETS: tuple[ModelSpec, ...] = (
    _moe(name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
         ffn_hidden_size=14336, vocab_size=32000, max_seq_len=32768, num_moe_experts=8, moe_router_topk=2),
    _moe(name="mixtral-8x22b", num_layers=56, hidden_size=6144, num_attention_heads=48, num_kv_heads=8,
         ffn_hidden_size=16384, vocab_size=32000, max_seq_len=65536, num_moe_experts=8, moe_router_topk=2),
    _moe(name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_attention_heads=32, num_kv_heads=4,
         kv_channels=128, qk_layernorm=True, ffn_hidden_size=6144, moe_ffn_hidden_size=768,
         vocab_size=151936, max_seq_len=40960, num_moe_experts=128, moe_router_topk=8),
    _moe(name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_attention_heads=64, num_kv_heads=4,
         kv_channels=128, qk_layernorm=True, ffn_hidden_size=12288, moe_ffn_hidden_size=1536,
         vocab_size=151936, max_seq_len=40960, num_moe_experts=128, moe_router_topk=8),
    _moe(name="deepseek-v3", num_layers=61, hidden_size=7168, num_attention_heads=128, num_kv_heads=128,
         ffn_hidden_size=18432, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
         vocab_size=129280, max_seq_len=163840, num_moe_experts=256, moe_router_topk=8,
         moe_layer_freq=(0,) * 3 + (1,) * 58, moe_router_enable_expert_bias=True,
         multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
         qk_pos_emb_head_dim=64, v_head_dim=128),
    _moe(name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_attention_heads=64, num_kv_heads=8,
         kv_channels=64, ffn_hidden_size=2880, vocab_size=201088, max_seq_len=131072, num_moe_experts=128,
         moe_router_topk=4, softmax_type="learnable", window_size=128, window_attn_skip_freq=2,
         bias=True),
)

MODEL_PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5120, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        # Llama 3.1 (meta-llama/Llama-3.1-{8B,70B,405B} config.json): Llama 3's shapes with max_position_embeddings
        # 131072 through rope_scaling (rope_type llama3, factor 8, original_max_position_embeddings 8192), which
        # changes no cost. "-8k": the pre-training context (Dubey et al. 2024 Sec. 3.4.1); "-128k": the
        # long-context stage's (Sec. 3.4.2).
        *(_llama(f"llama3.1-{size}-{ctx}k", layers, hidden, heads, 8, ffn, 128256, ctx * 1024)
          for size, layers, hidden, heads, ffn in (("8b", 32, 4096, 32, 14336), ("70b", 80, 8192, 64, 28672),
                                                   ("405b", 126, 16384, 128, 53248))
          for ctx in (8, 128)),
        *MOE_PRESETS,
    )
}
