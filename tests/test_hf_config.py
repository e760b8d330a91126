"""The Hugging Face config.json import (sim.model.hf_config): the MoE models' published configs
(tests/data/hf_configs/, copied from the hub) give the presets, and what the importer cannot model is refused
with one line naming the key."""

import json
from pathlib import Path

import pytest

from sim.model.hf_config import read_hf_config, spec_from_hf_config
from sim.model.params import total_params
from sim.model.presets import MODEL_PRESETS
from sim.model.transformer import ModelSpec

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def load(repo: str) -> dict:
    return json.loads((CONFIGS / repo / "config.json").read_text())


@pytest.mark.parametrize("repo, preset", [
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("Mixtral-8x22B-v0.1", "mixtral-8x22b"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b"), ("Qwen3-235B-A22B", "qwen3-235b-a22b"),
    ("DeepSeek-V3", "deepseek-v3"), ("gpt-oss-120b", "gpt-oss-120b"), ("Llama-3.1-8B", "llama3.1-8b-128k"),
])
def test_published_configs_give_the_presets(repo, preset):
    fields = read_hf_config(str(CONFIGS / repo / "config.json"), CONFIGS)
    assert fields["name"] == repo  # the folder: the hub repository's name
    imported = ModelSpec(**{**fields, "name": preset})
    assert imported == MODEL_PRESETS[preset]
    assert total_params(imported) == total_params(MODEL_PRESETS[preset])


def test_deepseek_v3_import_reads_the_dense_layers_and_the_expert_bias():
    fields = spec_from_hf_config(load("DeepSeek-V3"), "v3")
    assert fields["moe_layer_freq"] == (0, 0, 0) + (1,) * 58  # first_k_dense_replace 3
    assert fields["moe_router_enable_expert_bias"]  # topk_method noaux_tc: e_score_correction_bias
    assert fields["moe_shared_expert_intermediate_size"] == 2048  # n_shared_experts 1 x moe_intermediate_size
    assert "kv_channels" not in fields


def test_gpt_oss_alternating_layers_are_a_sliding_window_every_other_layer():
    fields = spec_from_hf_config(load("gpt-oss-120b"), "g")
    assert (fields["window_size"], fields["window_attn_skip_freq"]) == (128, 2)
    assert fields["kv_channels"] == 64 and fields["bias"] and fields["softmax_type"] == "learnable"


def test_qwen3_moe_mlp_only_layers_and_sparse_step():
    config = {**load("Qwen3-30B-A3B"), "num_hidden_layers": 6, "mlp_only_layers": [0], "decoder_sparse_step": 2}
    assert spec_from_hf_config(config, "q")["moe_layer_freq"] == (0, 1, 0, 1, 0, 1)


def test_head_dim_is_honoured_for_dense_models():
    qwen3_8b_like = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                     "max_position_embeddings": 40960, "intermediate_size": 12288, "rms_norm_eps": 1e-6,
                     "rope_theta": 1e6, "hidden_act": "silu"}
    fields = spec_from_hf_config(qwen3_8b_like, "q")
    assert "kv_channels" not in fields and fields["qk_layernorm"]  # 4096 / 32 = 128: nothing to add
    nemo_like = {**qwen3_8b_like, "architectures": ["MistralForCausalLM"], "hidden_size": 5120}
    fields = spec_from_hf_config(nemo_like, "m")
    assert fields["kv_channels"] == 128 and "qk_layernorm" not in fields
    spec = ModelSpec(**fields)
    assert spec.q_dim == 32 * 128 and spec.kv_dim == 8 * 128


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["Qwen2MoeForCausalLM"]}, "architectures: Qwen2MoeForCausalLM is not modelled"),
    ({"n_shared_experts": 2}, "n_shared_experts: MixtralForCausalLM has no such key here"),
    ({"architectures": None}, "num_local_experts: a config without architectures has no such key here"),
    ({"architectures": ["LlamaForCausalLM"]}, "num_local_experts: LlamaForCausalLM has no such key here"),
])
def test_what_cannot_be_modelled_is_refused_naming_the_key(change, message, tmp_path):
    config = {**load("Mixtral-8x7B-v0.1"), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        read_hf_config(str(path), tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_unmodelled_sliding_pattern_is_refused():
    config = {**load("gpt-oss-120b"), "layer_types": ["full_attention"] + ["sliding_attention"] * 35}
    with pytest.raises(ValueError, match="layer_types: a pattern of sliding and full attention"):
        spec_from_hf_config(config, "g")


def test_dense_configs_with_all_full_attention_layer_types_are_read():
    llama = json.loads((CONFIGS.parent / "hf_llama2_7b_config.json").read_text())
    fields = spec_from_hf_config({**llama, "layer_types": ["full_attention"] * 32}, "l")
    assert ModelSpec(**{**fields, "name": "llama2-7b"}) == MODEL_PRESETS["llama2-7b"]


def test_a_refused_config_through_the_scenario_is_one_line_naming_the_key(tmp_path):
    import copy

    from sim.errors import ConfigError
    from sim.spec.scenario import scenario_from_dict

    from conftest import BASE
    (tmp_path / "config.json").write_text(json.dumps({**load("Mixtral-8x7B-v0.1"),
                                                      "architectures": ["JambaForCausalLM"]}))
    data = copy.deepcopy(BASE) | {"model": "config.json"}
    with pytest.raises(ConfigError) as error:
        scenario_from_dict(data, base_dir=tmp_path)
    assert "model: " in str(error.value) and "architectures: JambaForCausalLM is not modelled" in str(error.value)
    assert "\n" not in str(error.value)


# Exact parameter counts (issue 26, must-show 2): the hub's safetensors metadata total of each repository (the
# "Model size" the hub shows, summed over the checkpoint's tensors; bf16 weights, so one element per parameter):
# google/gemma-7b 8,537,680,896 (model card "8.54B"), mistralai/Mistral-Nemo-Base-2407 12,247,782,400 ("12B"),
# meta-llama/Meta-Llama-3-8B 8,030,261,248 ("8B"), Qwen/Qwen2.5-7B 7,615,616,512 ("7.61B"; the same count its
# Instruct fine-tune's metadata gives). Each is also the closed form of its config: e.g. Qwen2.5-7B
# 2 x 152064 x 3584 (untied) + 28 x (2 x 3584^2 + 2 x 3584 x 512 + 3584 + 2 x 512 (q/k/v biases)
# + 3 x 3584 x 18944 + 2 x 3584) + 3584.
@pytest.mark.parametrize("repo, params", [
    ("gemma-7b", 8_537_680_896),
    ("Mistral-Nemo-Base-2407", 12_247_782_400),
    ("Meta-Llama-3-8B", 8_030_261_248),
    ("Qwen2.5-7B", 7_615_616_512),
])
def test_dense_configs_give_the_hubs_exact_parameter_counts(repo, params):
    spec = ModelSpec(**read_hf_config(str(CONFIGS / repo / "config.json"), CONFIGS))
    assert total_params(spec) == params


def test_qwen2_has_a_bias_on_qkv_alone():
    """transformers' Qwen2Attention builds q/k/v_proj with bias=True and o_proj, the MLP without (no config key):
    Megatron's --add-qkv-bias with --disable-bias-linear; 28 x (3584 + 2 x 512) = 129,024 parameters."""
    fields = spec_from_hf_config(load("Qwen2.5-7B"), "q")
    assert (fields["bias"], fields["add_qkv_bias"]) == (False, True)
    without = ModelSpec(**{**fields, "add_qkv_bias": False})
    assert total_params(ModelSpec(**fields)) - total_params(without) == 28 * (3584 + 2 * 512)
    assert "add_qkv_bias" not in spec_from_hf_config(load("Meta-Llama-3-8B"), "l")


def test_gemma_is_a_gated_gelu_with_tied_embeddings_by_default():
    config = load("gemma-7b")
    assert "tie_word_embeddings" not in config and config["hidden_act"] == "gelu"  # as published
    fields = spec_from_hf_config(config, "g")
    assert (fields["mlp"], fields["tied_embeddings"], fields["kv_channels"]) == ("geglu", True, 256)
    # The two mistakes issue 26 found, in closed form: an ungated MLP drops one 3072 x 24576 matrix per layer,
    # untied embeddings add a 256000 x 3072 output layer.
    wrong = ModelSpec(**{**fields, "mlp": "gelu", "tied_embeddings": False})
    assert total_params(ModelSpec(**fields)) - total_params(wrong) == 28 * 3072 * 24576 - 256000 * 3072
    assert not spec_from_hf_config({**config, "tie_word_embeddings": False}, "g")["tied_embeddings"]
    # hidden_activation (newer Gemma configs) takes precedence over hidden_act
    assert spec_from_hf_config({**config, "hidden_activation": "gelu_pytorch_tanh"}, "g")["mlp"] == "geglu"


def test_mistral_nemo_head_dim_is_honoured():
    fields = spec_from_hf_config(load("Mistral-Nemo-Base-2407"), "n")
    assert fields["kv_channels"] == 128  # 5120 / 32 = 160 otherwise: +4.3% parameters
    spec = ModelSpec(**fields)
    without = ModelSpec(**{k: v for k, v in fields.items() if k != "kv_channels"})
    assert total_params(without) / total_params(spec) - 1 == pytest.approx(0.043, abs=0.001)


def test_an_unmodelled_activation_or_architecture_is_one_line_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"^hidden_act: 'relu' in a gated MLP \(LlamaForCausalLM\) is not modelled"):
        spec_from_hf_config({**load("Meta-Llama-3-8B"), "hidden_act": "relu"}, "x")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**load("gemma-7b"), "architectures": ["Gemma3ForCausalLM"]}))
    with pytest.raises(ValueError) as error:
        read_hf_config(str(path), tmp_path)
    message = str(error.value)
    assert "\n" not in message and "architectures: Gemma3ForCausalLM is not modelled" in message
