"""Parameter and FLOP counts against Narayanan et al. SC21 eqs. (2), (3) and Korthikanti et al. eq. (7)
(tests/data/narayanan2021_formulas.csv), and Llama counts against the published Hugging Face totals."""

import pytest

from sim.model.flops import layer_forward_flops, logits_forward_flops, model_flops_per_step
from sim.model.params import total_params
from sim.model.presets import MODEL_PRESETS

GPT3 = ["gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"]


def shape(name):
    m = MODEL_PRESETS[name]
    return m.num_layers, m.hidden_size, m.vocab_size, m.max_seq_len


@pytest.mark.parametrize("name", GPT3)
def test_gpt_params_match_narayanan_eq2(name):
    l, h, V, s = shape(name)  # noqa: E741 (l: the number of layers, the papers' symbol)
    eq2 = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    final_norm = 2 * h  # eq. (2) leaves out the final layer norm
    assert total_params(MODEL_PRESETS[name]) == pytest.approx(eq2 + final_norm, rel=1e-12)


@pytest.mark.parametrize("name", GPT3)
def test_gpt_flops_match_narayanan_eq3_with_full_recompute(name):
    l, h, V, s = shape(name)  # noqa: E741 (l: the number of layers, the papers' symbol)
    B = 1536
    eq3 = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    spec = MODEL_PRESETS[name]
    # Full recompute: 4 forward passes of the layers, 3 of the logit layer.
    ours = B * (4 * l * layer_forward_flops(spec, 1, s) + 3 * logits_forward_flops(spec, 1, s))
    assert ours == pytest.approx(eq3, rel=1e-12)


@pytest.mark.parametrize("name", GPT3)
def test_model_flops_match_korthikanti_eq7(name):
    l, h, V, s = shape(name)  # noqa: E741 (l: the number of layers, the papers' symbol)
    B = 64
    eq7 = 72 * B * l * s * h**2 * (1 + s / (6 * h) + V / (12 * h * l))
    assert model_flops_per_step(MODEL_PRESETS[name], B, s) == pytest.approx(eq7, rel=1e-12)


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3-405b", 405_853_388_800),
])
def test_llama_params_match_hugging_face_totals(name, published):
    assert total_params(MODEL_PRESETS[name]) == published


def test_gpt3_175b_is_175b():
    assert total_params(MODEL_PRESETS["gpt3-175b"]) == pytest.approx(174.6e9, rel=1e-3)
