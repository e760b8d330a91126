"""``sim import nemo`` of multi-head latent attention (DeepSeek-V2/V3): NeMo's MLA keys mapped as the Megatron
importer maps its MLA flags, the widths NeMo's config class builds where a key is absent.

NeMo 2.0 builds ``DeepSeekConfig`` (nemo/collections/llm/gpt/model/deepseek.py at NVIDIA/NeMo 8cfedd7203, an
``MLATransformerConfig``: q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim
128; ``DeepSeekV2LiteConfig`` q_lora_rank None); NeMo 1.x builds Megatron-Core's ``MLATransformerConfig`` when
``model.multi_latent_attention`` is set (megatron_base_model.py build_transformer_config; transformer_config.py at
Megatron-LM 1e05700595: 512, 512, 128, 64, 128). Round trip: the imported scenario emitted as a Megatron-LM script
(``sim search --emit megatron``) and imported back has the same attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.errors import ConfigError
from sim.interop.draft import Draft, Options
from sim.interop.emit import emit
from sim.interop.megatron import import_megatron
from sim.interop.nemo import import_nemo

WIDTHS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def _nemo2(config: dict[str, Any]) -> dict[str, Any]:
    """A NeMo 2.0 run as NeMo-Run serialises a recipe: 4 layers of a DeepSeek-shaped model on 8 GPUs (ep 8)."""
    return {"trainer": {"num_nodes": 1, "devices": 8, "strategy": {
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 8},
        "plugins": {"precision": "bf16-mixed"}},
        "model": {"_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekModel", "config": {
            "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
            "moe_ffn_hidden_size": 512, "num_moe_experts": 16, "moe_router_topk": 2, "moe_layer_freq": 1,
            "gated_linear_unit": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
            "add_bias_linear": False, **config}},
        "data": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 16}}


def _import(tmp_path: Path, data: dict[str, Any], model: str = "llama3-8b") -> Draft:
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(data))
    return import_nemo([str(path)], Options(gpu="H100-SXM", model=model))


def _row(draft: Draft, source: str) -> Any:
    return next(row for row in draft.rows if row.source == source)


def _round_trip(draft: Draft, tmp_path: Path) -> None:
    """The scenario emitted as a Megatron-LM script and imported back: the same attention fields."""
    scenario = draft.scenario()
    path = tmp_path / "run.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu="H100-SXM")).scenario()
    for field in ("multi_latent_attention", *WIDTHS):
        assert getattr(back.model, field) == getattr(scenario.model, field), field


@pytest.mark.parametrize(("target", "widths"), [
    ("DeepSeekV3Config", (1536, 512, 128, 64, 128)),
    ("DeepSeekV2Config", (1536, 512, 128, 64, 128)),
    ("DeepSeekV2LiteConfig", (None, 512, 128, 64, 128)),
])
def test_nemo2_deepseek_config_class_builds_mla_with_its_widths(target: str, widths: tuple[Any, ...],
                                                                tmp_path: Path) -> None:
    """``model.config._target_`` naming a DeepSeek config class is MLA (MLATransformerConfig's
    multi_latent_attention True) with that class's widths where the YAML gives none, each reported as NeMo's
    default; the base model (--model llama3-8b) has no MLA, so every width comes from the class."""
    draft = _import(tmp_path, _nemo2({"_target_": f"nemo.collections.llm.gpt.model.deepseek.{target}",
                                      "mtp_num_layers": 1, "mtp_loss_scaling_factor": 0.1}))
    m = draft.scenario().model
    assert m.multi_latent_attention
    assert tuple(getattr(m, key) for key in WIDTHS) == widths
    assert _row(draft, "model.config._target_").status == "mapped"
    assert all(_row(draft, f"model.config.{key}").status == "default" for key in WIDTHS)
    # the pretraining recipe's multi-token prediction (use_mtp): reported as not simulated, not unknown
    assert _row(draft, "model.config.mtp_num_layers").status == "unmapped"
    _round_trip(draft, tmp_path)


def test_nemo2_mla_keys_override_the_class_defaults(tmp_path: Path) -> None:
    """Keys the recipe sets win over the class's (mapped); ``q_lora_rank: null`` is a full query projection (the
    V2-Lite shape), not the class's 1536."""
    draft = _import(tmp_path, _nemo2({"_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekV3Config",
                                      "kv_lora_rank": 256, "qk_pos_emb_head_dim": 32, "q_lora_rank": None}))
    m = draft.scenario().model
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim) == \
        (None, 256, 128, 32, 128)
    assert _row(draft, "model.config.kv_lora_rank").status == "mapped"
    assert _row(draft, "model.config.q_lora_rank").status == "mapped"
    assert _row(draft, "model.config.v_head_dim").status == "default"
    _round_trip(draft, tmp_path)


def test_nemo1_multi_latent_attention_takes_megatron_cores_mla_config(tmp_path: Path) -> None:
    """NeMo 1.x: ``model.multi_latent_attention: true`` builds Megatron-Core's MLATransformerConfig, its fields
    from ``model.*`` else that class's defaults (512, 512, 128, 64, 128), not Megatron-LM arguments.py's
    (kv_lora_rank 32, q_lora_rank None)."""
    data = {"trainer": {"num_nodes": 1, "devices": 8, "precision": "bf16-mixed"},
            "model": {"micro_batch_size": 1, "global_batch_size": 16, "encoder_seq_length": 2048,
                      "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
                      "bias": False, "multi_latent_attention": True, "v_head_dim": 64}}
    draft = _import(tmp_path, data)
    m = draft.scenario().model
    assert tuple(getattr(m, key) for key in WIDTHS) == (512, 512, 128, 64, 64)
    assert _row(draft, "model.multi_latent_attention").status == "mapped"
    _round_trip(draft, tmp_path)


def test_nemo_multi_latent_attention_false_builds_standard_attention(tmp_path: Path) -> None:
    """An explicit ``multi_latent_attention: false`` over an MLA base model (--model deepseek-v3) builds Megatron's
    standard attention: the scenario's model has no MLA."""
    draft = _import(tmp_path, _nemo2({"multi_latent_attention": False}), model="deepseek-v3")
    assert not draft.scenario().model.multi_latent_attention


@pytest.mark.parametrize(("key", "value", "message"), [
    ("kv_lora_rank", "wide", "model.config.kv_lora_rank: "),
    ("qk_head_dim", 0, "model.config.qk_head_dim: 0"),
])
def test_nemo_mla_width_that_cannot_be_modelled_is_one_line(key: str, value: Any, message: str,
                                                            tmp_path: Path) -> None:
    """A width that is no positive whole number is refused in one line naming the key."""
    data = _nemo2({"_target_": "nemo.collections.llm.gpt.model.deepseek.DeepSeekV3Config", key: value})
    with pytest.raises(ConfigError) as error:
        _import(tmp_path, data).scenario()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_megatron_mla_script_without_q_lora_rank_builds_a_full_query_projection(tmp_path: Path) -> None:
    """The mapping NeMo shares: Megatron-LM's --q-lora-rank defaults to None (arguments.py at 1e05700595), so a
    script with --multi-latent-attention and no --q-lora-rank builds a full query projection whatever the base
    model (--model deepseek-v3, q_lora_rank 1536) says; the importer kept the base model's 1536."""
    script = ("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --num-layers 61 --hidden-size 7168 "
              "--num-attention-heads 128 --ffn-hidden-size 18432 --seq-length 2048 --max-position-embeddings 2048 "
              "--micro-batch-size 1 --global-batch-size 8 --bf16 --disable-bias-linear --swiglu "
              "--normalization RMSNorm --position-embedding-type rope --multi-latent-attention --kv-lora-rank 512\n")
    path = tmp_path / "run.sh"
    path.write_text(script)
    draft = import_megatron([str(path)], Options(gpu="H100-SXM", model="deepseek-v3"))
    m = draft.scenario().model
    assert (m.multi_latent_attention, m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim) == (True, None, 512, 128)
    assert _row(draft, "--q-lora-rank").status == "default"
