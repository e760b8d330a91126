"""Transformer shapes: presets, Hugging Face ``config.json`` import, parameter and FLOP counts.

In: a preset name, an explicit shape, or a parsed HF config dict. Out: a frozen ``ModelSpec`` and pure
functions of it: parameters per layer / per tensor-parallel rank and model FLOPs per token. The kernels of a
layer's forward pass, which the cost models price, are in ``sim.model.ops``.

FLOPs follow Narayanan et al. SC21 (2 FLOPs per multiply-add, GEMMs only, attention counted over the full
s x s score matrix as Megatron does): a GPT layer's forward is 24*b*s*h^2 + 4*b*s^2*h, and parameters are
12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)) (their eq. 2) plus the final layer norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from sim.hardware import FrozenSpec


class ModelSpec(FrozenSpec):
    name: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int | None = Field(default=None, ge=1, description="GQA groups; default = heads (MHA)")
    ffn_hidden_size: int | None = Field(default=None, ge=1, description="default 4*hidden (GELU MLP)")
    vocab_size: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)
    mlp: Literal["gelu", "swiglu", "squared_relu"] = Field(default="gelu", description=(
        "gelu: 2 matrices; swiglu: 3 (gate, up, down); squared_relu: 2 matrices, relu(x)^2 (Nemotron-4)"))
    position_embedding: Literal["learned", "rope"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = True
    bias: bool = True

    @model_validator(mode="after")
    def _fill_defaults(self) -> ModelSpec:
        # Frozen model: fill derived defaults once, so the resolved scenario shows them explicitly.
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_kv_heads {self.kv_heads}"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2


# ----------------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, split by how tensor parallelism shards them."""

    sharded: int  # weight matrices and column-parallel biases: divided by tp
    replicated: int  # norms and row-parallel output biases: every TP rank holds them

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_tp_rank(self, tp: int) -> float:
        return self.sharded / tp + self.replicated


def _norm_params(spec: ModelSpec) -> int:
    return 2 * spec.hidden_size if spec.norm == "layernorm" else spec.hidden_size


def layer_params(spec: ModelSpec) -> LayerParams:
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    weights = h * (h + 2 * kv) + h * h + spec.mlp_matrices * h * f
    column_bias = (h + 2 * kv) + (2 * f if spec.mlp == "swiglu" else f) if spec.bias else 0
    row_bias = 2 * h if spec.bias else 0  # attention output projection and MLP down projection
    return LayerParams(sharded=weights + column_bias, replicated=row_bias + 2 * _norm_params(spec))


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


def layer_modules(spec: ModelSpec, tp: int = 1) -> tuple[LayerModule, ...]:
    """A layer's leaf modules in forward order, as Megatron-style fused modules (Megatron-DeepSpeed GPT: fused QKV
    and, for SwiGLU, one fused gate+up projection): input norm, QKV, output projection, post-attention norm, MLP
    up (fc1) and down (fc2). Weights and column-parallel biases are divided by ``tp``; norms and row-parallel
    biases are not. Their sum is ``layer_params(spec).per_tp_rank(tp)``."""
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    norm = (float(h), float(h)) if spec.norm == "layernorm" else (float(h),)
    bias = spec.bias
    up = (spec.mlp_matrices - 1) * f  # gate + up under SwiGLU, one matrix under GELU
    return (
        LayerModule("input_norm", "attention", norm),
        LayerModule("qkv", "attention", (h * (h + 2 * kv) / tp,) + (((h + 2 * kv) / tp,) if bias else ())),
        LayerModule("out_proj", "attention", (h * h / tp,) + ((float(h),) if bias else ())),
        LayerModule("post_attention_norm", "mlp", norm),
        LayerModule("fc1", "mlp", (h * up / tp,) + ((up / tp,) if bias else ())),
        LayerModule("fc2", "mlp", (h * f / tp,) + ((float(h),) if bias else ())),
    )


def embedding_params(spec: ModelSpec) -> int:
    positions = spec.max_seq_len * spec.hidden_size if spec.position_embedding == "learned" else 0
    return spec.vocab_size * spec.hidden_size + positions


def head_params(spec: ModelSpec) -> int:
    """Final norm plus the output projection (zero extra when tied to the input embedding)."""
    return _norm_params(spec) + (0 if spec.tied_embeddings else spec.vocab_size * spec.hidden_size)


def total_params(spec: ModelSpec) -> int:
    return spec.num_layers * layer_params(spec).total + embedding_params(spec) + head_params(spec)


# ------------------------------------------------------------------------------------------------- FLOPs


def layer_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """Model FLOPs of one layer's forward for one micro-batch (all TP ranks together)."""
    tokens = micro_batch * seq_len
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    gemm = 2 * tokens * (h * (h + 2 * kv) + h * h + spec.mlp_matrices * h * f)
    attention = 2 * 2 * tokens * seq_len * h  # Q K^T and (softmax) V over the full score matrix
    return float(gemm + attention)


def logits_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> float:
    return float(2 * micro_batch * seq_len * spec.hidden_size * spec.vocab_size)


def model_flops_per_step(spec: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Training FLOPs of one step without recomputation: 3x forward (Korthikanti et al. 2022 eq. 7)."""
    per_sequence = spec.num_layers * layer_forward_flops(spec, 1, seq_len) + logits_forward_flops(spec, 1, seq_len)
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
    )
}


def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise KeyError(" or ".join(keys))


def spec_from_hf_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Fields of a ``ModelSpec`` from a Hugging Face ``config.json`` (Llama/Mistral/Qwen style or GPT-2 style).
    Raises KeyError naming the missing key."""
    is_gpt2 = config.get("model_type") == "gpt2" or "n_embd" in config
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    fields: dict[str, Any] = {
        "name": name,
        "num_layers": int(_first(config, "num_hidden_layers", "n_layer", "num_layers")),
        "hidden_size": hidden,
        "num_attention_heads": int(_first(config, "num_attention_heads", "n_head")),
        "vocab_size": int(_first(config, "vocab_size")),
        "max_seq_len": int(_first(config, "max_position_embeddings", "n_positions", "n_ctx")),
    }
    if is_gpt2:
        fields.update(ffn_hidden_size=config.get("n_inner") or 4 * hidden, mlp="gelu", position_embedding="learned",
                      norm="layernorm", tied_embeddings=bool(config.get("tie_word_embeddings", True)), bias=True)
        return fields
    act = str(config.get("hidden_act", "silu")).lower()
    fields.update(
        num_kv_heads=int(config.get("num_key_value_heads") or fields["num_attention_heads"]),
        ffn_hidden_size=int(_first(config, "intermediate_size", "ffn_dim")),
        mlp="swiglu" if act in ("silu", "swish", "swiglu") else "squared_relu" if act == "relu2" else "gelu",
        position_embedding="rope" if "rope_theta" in config or config.get("position_embedding_type") != "absolute"
        else "learned",
        norm="rmsnorm" if "rms_norm_eps" in config else "layernorm",
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        bias=bool(config.get("attention_bias", False) or config.get("mlp_bias", False)),
    )
    return fields


def read_hf_config(path_text: str, base_dir: Path) -> dict[str, Any]:
    path = Path(path_text)
    candidates = [path] if path.is_absolute() else [base_dir / path, path]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise ValueError(f"Hugging Face config {path_text!r} not found")
    try:
        config = json.loads(found.read_text())
        return spec_from_hf_config(config, name=config.get("_name_or_path") or found.parent.name or found.stem)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path_text!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except KeyError as exc:
        raise ValueError(f"{path_text!r} lacks {exc.args[0]}") from None
