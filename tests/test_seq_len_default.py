"""training.seq_len's stated default (sim.spec.degrees.DEFAULT_SEQ_LEN, never a long-context model's maximum) and
the note ``sim check`` prints; the Llama 3.1 presets at 8k and 128k (issue 24)."""

import pytest

from sim import api, runner
from sim.model.params import total_params
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.degrees import DEFAULT_SEQ_LEN

from conftest import make_scenario


def llama(model: str, **training):
    return make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}, model=model,
                         training={"global_batch": 8, "micro_batch": 1, **training},
                         parallel={"tp": 8, "pp": 1, "dp": 1}, costs="roofline")


def test_default_is_stated_not_the_models_maximum():
    """Llama 3.1 (max_position_embeddings 131,072) defaults to 8,192, not 131,072; a preset whose maximum is
    shorter keeps its maximum (GPT-3 2,048), so the existing presets' defaults are unchanged."""
    assert DEFAULT_SEQ_LEN == 8192
    base = make_scenario(training={"global_batch": 8, "micro_batch": 1, "seq_len": None})
    assert resolve(base).seq_len == 512  # the test model's max_seq_len, shorter than the default
    long = {"global_batch": 8, "micro_batch": 1, "seq_len": None}
    assert resolve(make_scenario(model="llama3.1-8b-128k", training=long)).seq_len == 8192
    assert resolve(make_scenario(model="gpt3-1.3b", training=long)).seq_len == 2048
    assert resolve(make_scenario(model="llama3-8b", training=long)).seq_len == 8192


def test_check_notes_a_defaulted_seq_len():
    checked = api.check(make_scenario(model="llama3.1-8b-128k",
                                      training={"global_batch": 8, "micro_batch": 1, "seq_len": None}))
    assert checked.notes == ["note: training.seq_len not set: 8192 tokens (the default, 8192; llama3.1-8b-128k "
                             "allows up to 131072); set it to what the run trains at"]
    assert api.check(make_scenario()).notes == []


@pytest.mark.parametrize("size, llama3", [("8b", "llama3-8b"), ("70b", "llama3-70b"), ("405b", "llama3-405b")])
def test_llama31_presets_have_llama3_shapes_and_differ_only_in_max_seq_len(size, llama3):
    short, long = MODEL_PRESETS[f"llama3.1-{size}-8k"], MODEL_PRESETS[f"llama3.1-{size}-128k"]
    assert short.model_copy(update={"name": llama3}) == MODEL_PRESETS[llama3]
    assert long.model_copy(update={"name": short.name, "max_seq_len": 8192}) == short
    assert (short.max_seq_len, long.max_seq_len) == (8192, 131072)
    assert total_params(short) == total_params(long)


def test_rope_scaling_makes_no_cost_difference():
    """At the same sequence length the 128k preset (rope scaling) simulates the same step as the 8k one."""
    times = [runner.run(llama(model, seq_len=8192)).summary.step_time_s
             for model in ("llama3.1-8b-8k", "llama3.1-8b-128k")]
    assert times[0] == times[1]
