"""Model presets by name: GPT-3's shapes, Llama 2 / 3 / 3.1 and the mixture-of-experts models, each from its
published source (cited at each table).

In: nothing (tables). Out: ``MODEL_PRESETS``, preset name -> ``ModelSpec`` (sim.model.transformer), which a
scenario's ``model.preset`` names, and ``MOE_PRESETS``, the MoE ones among them.
"""

from __future__ import annotations

from typing import Any

from sim.model.transformer import ModelSpec


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
