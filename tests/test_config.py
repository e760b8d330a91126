import copy

import pytest
import yaml

from sim.errors import ConfigError
from sim.hardware.nodes import NODE_PRESETS
from sim.plan import resolve
from sim.spec.scenario import apply_overrides, load_scenario, resolved_yaml, scenario_from_dict

from conftest import BASE, DATA, SCENARIOS, make_scenario


def test_bundled_175b_loads_with_presets_expanded():
    s = load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml")
    assert (s.parallel.tp, s.parallel.pp, resolve(s).dp, resolve(s).microbatches) == (8, 8, 16, 96)
    assert s.cluster.gpu.peak("bf16") == 312e12
    assert s.cluster.intra_node.bandwidth == 300e9 and s.cluster.inter_node.bandwidth == 25e9
    assert s.model.num_layers == 96 and s.model.hidden_size == 12288


def test_dp_defaults_from_gpu_count():
    s = make_scenario(parallel={"tp": 2, "pp": 2, "dp": None})
    assert resolve(s).dp == 2


def test_link_fields_override_the_node_preset_one_by_one():
    s = make_scenario(cluster={**BASE["cluster"], "intra_node": {"bandwidth": "600 GB/s"}})
    assert s.cluster.intra_node.bandwidth == 600e9
    assert s.cluster.intra_node.latency == pytest.approx(NODE_PRESETS["dgx-a100"].intra_node.latency, rel=1e-9)


def rejects(fragment: str, **sections) -> None:
    with pytest.raises(ConfigError) as info:
        make_scenario(**sections)
    message = str(info.value)
    assert fragment in message, message
    assert "\n" not in message


def test_unknown_key_names_the_field():
    rejects("parallel.tpp: unknown key", parallel={"tpp": 2})


def test_bad_unit_names_the_field():
    rejects("cluster.gpu.hbm_capacity: unknown unit 'GX'", cluster={**BASE["cluster"],
            "gpu": {"preset": "A100-80GB-SXM", "hbm_capacity": "80 GX"}})


def test_split_must_match_gpus():
    rejects("parallel: tp*pp*dp = 96 but the cluster has 8 GPUs", parallel={"tp": 8, "pp": 4, "dp": 3})


def test_layers_must_divide_over_stages():
    rejects("parallel.pp: 3 does not divide model.num_layers = 8",
            cluster={**BASE["cluster"], "gpus_per_node": 3}, parallel={"tp": 1, "pp": 3, "dp": 1})


def test_heads_must_divide_over_tp():
    rejects("parallel.tp: 16 does not divide model.num_attention_heads = 8",
            cluster={**BASE["cluster"], "gpus_per_node": 16}, parallel={"tp": 16, "pp": 1, "dp": 1})


def test_global_batch_vs_dp_times_micro_batch():
    rejects("training.global_batch: 12 is not a multiple of dp*micro_batch = 8*1 = 8",
            training={"global_batch": 12})


def test_fp8_needs_a_gpu_that_has_it():
    rejects("training.dtype: fp8 has no tensor-core peak on A100-80GB-SXM", training={"dtype": "fp8"})


def test_unknown_preset_lists_the_known_ones():
    rejects("unknown model preset 'gpt5'", model="gpt5")


def test_fixed_costs_need_times():
    rejects("costs.forward: Field required", costs="fixed")


def test_missing_scenario_file():
    with pytest.raises(ConfigError, match="scenario: file 'nope.yaml' not found"):
        load_scenario("nope.yaml")


def test_missing_hf_config_file():
    rejects("model: Hugging Face config 'missing/config.json' not found", model="missing/config.json")


def test_hf_config_import_matches_the_preset():
    data = copy.deepcopy(BASE)
    data["model"] = "hf_llama2_7b_config.json"
    data["training"] = {"global_batch": 8, "seq_len": 4096}
    from_hf = scenario_from_dict(data, base_dir=DATA).model
    preset = make_scenario(model="llama2-7b", training={"seq_len": 4096}).model
    assert from_hf.model_dump(exclude={"name"}) == preset.model_dump(exclude={"name"})


def test_overrides_reach_nested_fields_and_shorthands():
    data = apply_overrides(copy.deepcopy(BASE) | {"costs": "roofline"},
                           ["parallel.tp=2", "parallel.dp=4", "costs.model=fixed", "costs.forward=1 ms",
                            "costs.backward=2 ms", "cluster.gpu.hbm_capacity=40 GiB"])
    s = scenario_from_dict(data)
    assert s.parallel.tp == 2 and s.costs.forward == pytest.approx(1e-3)
    assert s.cluster.gpu.hbm_capacity == 40 * 2**30 and s.cluster.gpu.name == "A100-80GB-SXM"


def test_resolved_yaml_loads_back_to_the_same_scenario(tmp_path):
    s = load_scenario(SCENARIOS / "gpt3-175b_a100-1024.yaml")
    path = tmp_path / "resolved.yaml"
    path.write_text(resolved_yaml(s))
    again = load_scenario(path)
    assert again.model == s.model and again.parallel.dp == 16 and again.training.seq_len == 2048
    assert again.cluster.gpu.peak_flops == pytest.approx(s.cluster.gpu.peak_flops)
    assert yaml.safe_load(path.read_text())["cluster"]["gpu"]["hbm_capacity"] == "80 GiB"
