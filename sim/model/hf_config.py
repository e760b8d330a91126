"""Hugging Face ``config.json`` import: the fields of a ``ModelSpec`` (sim.model.transformer) from a model's HF
config, for the architectures whose parameters and FLOPs the simulator models, and a refusal (one line naming the
key) for anything it cannot model that would change them.

In: a parsed config dict (``spec_from_hf_config``) or a path (``read_hf_config``). Out: a dict of ModelSpec
fields (Megatron-Core names). Architectures (the config's ``architectures[0]``; a config without one is read as
a Llama-style or GPT-2-style dense model):

- dense: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (q/k norms), GPT2LMHeadModel,
  NemotronForCausalLM, GemmaForCausalLM; ``head_dim`` is honoured where it is not hidden_size /
  num_attention_heads (Mistral-NeMo-12B: 128 with hidden 5120 and 32 heads; Gemma-7B: 256 with 3072 and 16).

Two facts come from the architecture, not from the config's keys (``GATED``, ``TIE_DEFAULT``): whether the MLP is
a gated linear unit (3 matrices: Gemma writes ``hidden_act: gelu`` for its gated GELU, GemmaMLP's gate_proj,
up_proj and down_proj), and what a missing ``tie_word_embeddings`` means (each transformers configuration class's
own default: GemmaConfig ties, LlamaConfig does not). ``hidden_activation`` (Gemma) takes precedence over
``hidden_act``, as in GemmaMLP.
- MixtralForCausalLM (transformers models/mixtral/configuration_mixtral.py): num_local_experts,
  num_experts_per_tok; every layer MoE; the expert width is intermediate_size.
- Qwen3MoeForCausalLM (models/qwen3_moe): num_experts, num_experts_per_tok, moe_intermediate_size; a layer is
  MoE unless listed in mlp_only_layers, and where (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer).
- DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (deepseek-ai's modeling_deepseek.py): n_routed_experts,
  num_experts_per_tok, moe_intermediate_size, n_shared_experts x moe_intermediate_size of shared expert; layer i
  is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0; topk_method noaux_tc adds the per-expert
  e_score_correction_bias; MLA from q_lora_rank (may be null), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
  v_head_dim. The multi-token-prediction layers (num_nextn_predict_layers) are left out, as the 671B count
  leaves them out.
- GptOssForCausalLM (models/gpt_oss): num_local_experts, num_experts_per_tok (or experts_per_token), head_dim,
  attention_bias (biases on attention, experts and router), learnable sinks, layer_types alternating sliding and
  full attention (window sliding_window).
Routing details that change neither parameters nor FLOPs (scoring function, normalisation, group-limited
routing, aux-loss coefficients, SwiGLU clamp, rope scaling) are read past.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DENSE = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                   "GPT2LMHeadModel", "NemotronForCausalLM", "GemmaForCausalLM"})
MOE = frozenset({"MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                 "GptOssForCausalLM"})
# Keys that add experts, shared experts, dense/MoE layer patterns or latent attention: each architecture reads
# the ones it has (below); any other one present (not null, not zero, not empty) is refused, never ignored.
STRUCTURE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
                  "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                  "decoder_sparse_step", "mlp_only_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim", "num_experts_per_tok", "experts_per_token", "layer_types")
READS = {
    "MixtralForCausalLM": {"num_local_experts", "num_experts_per_tok"},
    "Qwen3MoeForCausalLM": {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                            "mlp_only_layers"},
    "DeepseekV2ForCausalLM": {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                              "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
                              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"},
    "GptOssForCausalLM": {"num_local_experts", "num_experts_per_tok", "experts_per_token", "layer_types"},
}
READS["DeepseekV3ForCausalLM"] = READS["DeepseekV2ForCausalLM"]
# Architectures whose MLP is a gated linear unit (gate_proj, up_proj, down_proj in their modeling_*.py MLP class;
# GPT-OSS's experts are a clamped SwiGLU); GPT2MLP (c_fc, c_proj) and NemotronMLP (up_proj, down_proj, relu2)
# are not. A config without ``architectures`` is gated when its activation is SiLU (read as before).
GATED = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                   "GemmaForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
                   "DeepseekV3ForCausalLM", "GptOssForCausalLM"})
# ``tie_word_embeddings`` when a config.json leaves it out: the default of the architecture's configuration class
# in transformers (models/<name>/configuration_<name>.py; GPT2Config keeps PretrainedConfig's True).
TIE_DEFAULT: dict[str, bool] = {
    "LlamaForCausalLM": False, "MistralForCausalLM": False, "Qwen2ForCausalLM": False, "Qwen3ForCausalLM": False,
    "GPT2LMHeadModel": True, "NemotronForCausalLM": False, "GemmaForCausalLM": True, "MixtralForCausalLM": False,
    "Qwen3MoeForCausalLM": False, "DeepseekV2ForCausalLM": False, "DeepseekV3ForCausalLM": False,
    "GptOssForCausalLM": False,
}
# hidden_act values (transformers activations.ACT2FN keys) by family.
SILU = frozenset({"silu", "swish", "swiglu"})
GELU = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate",
                  "quick_gelu"})


def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise KeyError(" or ".join(keys))


def _present(key: str, value: Any) -> bool:
    if key == "layer_types":  # recent transformers write all-"full_attention" lists into dense configs too
        return any(kind != "full_attention" for kind in value or ())
    return value is not None and value != 0 and value != [] and value is not False


def _architecture(config: dict[str, Any]) -> str | None:
    """The config's architecture, or None for a config without ``architectures`` (read as before: Llama or
    GPT-2 style). Refuses an architecture the simulator does not model."""
    architectures = config.get("architectures")
    if not architectures:
        return None
    name = str(architectures[0])
    if name not in DENSE | MOE:
        known = ", ".join(sorted(DENSE | MOE))
        raise ValueError(f"architectures: {name} is not modelled (known: {known})")
    return name


def _refuse_unread(config: dict[str, Any], architecture: str | None) -> None:
    reads = READS.get(architecture or "", set())
    for key in STRUCTURE_KEYS:
        if key not in reads and _present(key, config.get(key)):
            raise ValueError(f"{key}: {architecture or 'a config without architectures'} has no such key here; "
                             f"a mixture-of-experts or latent-attention structure it cannot model")


def _head_dim(config: dict[str, Any], hidden: int, heads: int) -> int | None:
    """HF ``head_dim`` as kv_channels where it differs from hidden / heads (Qwen3, GPT-OSS, Mistral-NeMo)."""
    head_dim = config.get("head_dim")
    return int(head_dim) if head_dim and int(head_dim) * heads != hidden else None


def _sliding_pattern(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """GPT-OSS's layer_types as Megatron-Core's window_size and window_attn_skip_freq (every N-th layer,
    1-based, attends fully)."""
    types = config.get("layer_types")
    if not types:
        return {}
    full = [kind == "full_attention" for kind in types]
    for skip in range(1, layers + 1):
        if full == [(i + 1) % skip == 0 for i in range(layers)]:
            return {"window_size": int(_first(config, "sliding_window")), "window_attn_skip_freq": skip}
    raise ValueError("layer_types: a pattern of sliding and full attention other than every N-th layer full")


def _moe_fields(config: dict[str, Any], architecture: str, layers: int) -> dict[str, Any]:
    if architecture == "MixtralForCausalLM":
        return {"num_moe_experts": int(_first(config, "num_local_experts")),
                "moe_router_topk": int(_first(config, "num_experts_per_tok"))}
    if architecture == "Qwen3MoeForCausalLM":
        step = int(config.get("decoder_sparse_step") or 1)
        dense = set(config.get("mlp_only_layers") or ())
        pattern = tuple(int(i not in dense and (i + 1) % step == 0) for i in range(layers))
        return {"num_moe_experts": int(_first(config, "num_experts")),
                "moe_router_topk": int(_first(config, "num_experts_per_tok")),
                "moe_ffn_hidden_size": int(_first(config, "moe_intermediate_size")),
                "moe_layer_freq": 1 if all(pattern) else pattern}
    if architecture == "GptOssForCausalLM":
        return {"num_moe_experts": int(_first(config, "num_local_experts")),
                "moe_router_topk": int(_first(config, "num_experts_per_tok", "experts_per_token")),
                "softmax_type": "learnable", **_sliding_pattern(config, layers)}
    # DeepSeek-V2/V3
    first_dense = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or 1)
    pattern = tuple(int(i >= first_dense and i % freq == 0) for i in range(layers))
    moe_ffn = int(_first(config, "moe_intermediate_size"))
    shared = int(config.get("n_shared_experts") or 0)
    q_lora = config.get("q_lora_rank")
    return {
        "num_moe_experts": int(_first(config, "n_routed_experts")),
        "moe_router_topk": int(_first(config, "num_experts_per_tok")),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": shared * moe_ffn or None,
        "moe_layer_freq": 1 if all(pattern) else pattern,
        "moe_router_enable_expert_bias": config.get("topk_method") == "noaux_tc",
        "multi_latent_attention": True,
        "q_lora_rank": int(q_lora) if q_lora else None,
        "kv_lora_rank": int(_first(config, "kv_lora_rank")),
        "qk_head_dim": int(_first(config, "qk_nope_head_dim")),
        "qk_pos_emb_head_dim": int(_first(config, "qk_rope_head_dim")),
        "v_head_dim": int(_first(config, "v_head_dim")),
    }


def _mlp(config: dict[str, Any], architecture: str | None) -> str:
    """ModelSpec.mlp from the architecture (gated or not, ``GATED``) and the activation (``hidden_activation``
    before ``hidden_act``, as GemmaMLP reads them). Refuses an activation it has no kernel for, naming it."""
    key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
    act = str(config.get(key) or "silu").lower()
    gated = architecture in GATED if architecture else act in SILU  # no architectures: as before
    if gated and act in SILU:
        return "swiglu"
    if gated and act in GELU:
        return "geglu"
    if not gated and act in GELU:
        return "gelu"
    if not gated and act == "relu2":
        return "squared_relu"
    kind = "gated" if gated else "ungated"
    raise ValueError(f"{key}: {act!r} in a {kind} MLP ({architecture or 'no architectures'}) is not modelled "
                     "(gated: silu or gelu; ungated: gelu or relu2)")


def spec_from_hf_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Fields of a ``ModelSpec`` from a Hugging Face ``config.json`` (the architectures above). Raises KeyError
    naming a missing key, ValueError naming a key it cannot model."""
    architecture = _architecture(config)
    _refuse_unread(config, architecture)
    is_gpt2 = architecture == "GPT2LMHeadModel" or config.get("model_type") == "gpt2" or "n_embd" in config
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
    tie = config.get("tie_word_embeddings")
    fields.update(
        num_kv_heads=int(config.get("num_key_value_heads") or fields["num_attention_heads"]),
        ffn_hidden_size=int(_first(config, "intermediate_size", "ffn_dim")),
        mlp=_mlp(config, architecture),
        position_embedding="rope" if "rope_theta" in config or config.get("position_embedding_type") != "absolute"
        else "learned",
        norm="rmsnorm" if "rms_norm_eps" in config or architecture == "GemmaForCausalLM" else "layernorm",
        tied_embeddings=bool(TIE_DEFAULT.get(architecture or "", False) if tie is None else tie),
        bias=bool(config.get("attention_bias", False) or config.get("mlp_bias", False)),
    )
    if architecture == "Qwen2ForCausalLM" and not fields["bias"]:
        # transformers' Qwen2Attention: q_proj, k_proj and v_proj are built with bias=True whatever the config
        # says (it has no attention_bias key), o_proj and the MLP without: 28 x (3584 + 2 x 512) parameters of
        # Qwen2.5-7B's 7,615,616,512.
        fields["add_qkv_bias"] = True
    if architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        fields["qk_layernorm"] = True  # Qwen3Attention's q_norm and k_norm (RMSNorm over head_dim)
    if architecture not in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        head_dim = _head_dim(config, hidden, fields["num_attention_heads"])
        if head_dim is not None:
            fields["kv_channels"] = head_dim
    if architecture in MOE:
        fields.update(_moe_fields(config, architecture, fields["num_layers"]))
    return fields


def find_hf_config(path_text: str, base_dir: Path) -> Path | None:
    """Where a scenario's ``config.json`` path points: itself if absolute, else relative to ``base_dir`` (the
    scenario file's directory), else relative to the working directory (a ``--set`` value typed at the shell);
    None when no such file exists. The Dask executor resolves paths with this before shipping points."""
    path = Path(path_text)
    candidates = [path] if path.is_absolute() else [base_dir / path, path]
    return next((p for p in candidates if p.is_file()), None)


def read_hf_config(path_text: str, base_dir: Path) -> dict[str, Any]:
    found = find_hf_config(path_text, base_dir)
    if found is None:
        raise ValueError(f"Hugging Face config {path_text!r} not found")
    try:
        config = json.loads(found.read_text())
        return spec_from_hf_config(config, name=config.get("_name_or_path") or found.parent.name or found.stem)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path_text!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except KeyError as exc:
        raise ValueError(f"{path_text!r} lacks {exc.args[0]}") from None
    except ValueError as exc:
        raise ValueError(f"{path_text!r}: {exc}") from None
