"""A transformer's shape: the frozen ``ModelSpec`` (Megatron-Core's TransformerConfig names) and the widths
derived from it.

In: a model's fields, from a preset (``sim.model.presets``), a scenario, or a Hugging Face ``config.json``
(``sim.model.hf_config``). Out: a validated ``ModelSpec`` with its derived defaults filled in (KV heads, FFN and
expert widths) and the shapes every counter reads (head and projection widths, gated MLP, which layers are MoE or
sliding-window). Its parameters are counted in ``sim.model.params``, its FLOPs in ``sim.model.flops``; the
kernels of a layer's forward pass, which the cost models price, are in ``sim.model.ops`` and the modules beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sim.hardware.frozen import FrozenSpec


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
