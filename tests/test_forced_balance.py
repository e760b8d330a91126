"""Megatron-Core's forced load balancing (--moe-router-force-load-balancing, ``moe.force_load_balancing``): the
expected busiest EP rank's token-expert pairs under random top-k routing (sim.parallel.forced_balance) against
published order-statistics values and a seeded Monte Carlo of the router; the Plan's rule; the importers' flag;
and a validation row moving by the amount the load predicts (docs/mechanisms/forced_load_balancing.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.errors import ConfigError
from sim.parallel.forced_balance import busiest_rank_load, busiest_receiver_tokens, expected_max_normal
from sim.plan import resolve
from sim.spec.scenario import load_scenario, scenario_from_dict
from sim.validation.validate import published, run_validation

from conftest import DATA, NEMO_MOE_MODEL, SCENARIOS, small_moe_model

MOE = SCENARIOS / "validation" / "moe"


# ------------------------------------------------------------------------------------------- the closed form
@pytest.mark.parametrize("m, value", [
    (1, 0.0),
    (2, 1 / math.sqrt(math.pi)),  # E[max(Z1, Z2)] = 1/sqrt(pi)
    (3, 3 / (2 * math.sqrt(math.pi))),
    # Harter (1961) / Teichroew (1956) tables of expected normal order statistics, 5 decimals
    (5, 1.16296), (10, 1.53875), (25, 1.96531), (100, 2.50759),
])
def test_expected_maximum_of_normals_against_closed_forms_and_tables(m: int, value: float) -> None:
    assert expected_max_normal(m) == pytest.approx(value, abs=1e-5)


def _router_counts(tokens: int, experts: int, topk: int, ranks: int, trials: int, seed: int) -> np.ndarray:
    """(trials, ranks) token-expert pairs per EP rank, by Megatron's forced-balance router itself: i.i.d. N(0, 1)
    logits per token and expert (RandomSTE's normal_), the top k of each token's row (torch.topk), the chosen
    experts binned by rank (rank j holds experts j*E/ep .. (j+1)*E/ep - 1)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((trials, tokens, experts))
    top = np.argpartition(-logits, topk - 1, axis=-1)[..., :topk]
    owner = top // (experts // ranks)
    return np.stack([(owner == rank).sum(axis=(1, 2)) for rank in range(ranks)], axis=1)


def test_the_random_router_sends_hypergeometric_pairs_to_each_rank() -> None:
    """The router simulated (normal logits, top-k): each rank's pairs have the mean n k/ep and the variance
    n k (L/E)(1 - L/E)(E - k)/(E - 1) the closed form assumes (a uniformly random k-subset per token), within 3
    standard errors over 3,000 trials; the busiest rank's mean load within 4% of the closed form's excess."""
    tokens, experts, topk, ranks, trials = 256, 16, 2, 4, 3000
    counts = _router_counts(tokens, experts, topk, ranks, trials, seed=7)
    mean = tokens * topk / ranks
    share = 1 / ranks
    variance = tokens * topk * share * (1 - share) * (experts - topk) / (experts - 1)
    assert counts.sum(axis=1).tolist() == [tokens * topk] * trials  # every token's k pairs land somewhere
    samples = counts.size
    assert counts.mean() == pytest.approx(mean, abs=3 * math.sqrt(variance / samples))
    assert counts.var() == pytest.approx(variance, rel=3 * math.sqrt(2 / samples))
    simulated = (counts.max(axis=1) / mean).mean()
    assert busiest_rank_load(tokens, experts, topk, ranks) - 1 == pytest.approx(simulated - 1, rel=0.04)


@pytest.mark.parametrize("tokens, experts, topk, ranks, low", [
    (4096, 8, 2, 8, 0.97),  # Mixtral-like: 8 experts, top-2, one per rank; 1,024 pairs per rank
    (2048, 64, 8, 8, 0.97),  # 2,048 pairs per rank
    (1024, 128, 8, 32, 0.96),  # Qwen3-like experts over 32 ranks: 256 pairs per rank
    (512, 160, 6, 16, 0.96),  # DeepSeek-V2-like: 192 pairs per rank
    (64, 16, 2, 8, 0.94),  # 16 pairs per rank: the skewed small-count end
])
def test_the_closed_form_against_a_seeded_monte_carlo(tokens: int, experts: int, topk: int, ranks: int,
                                                      low: float) -> None:
    """The busiest rank's expected load / the mean over 2,000 seeded draws of the per-token rank counts
    (multivariate hypergeometric, what the router test above shows a token sends): the closed form's excess
    (load - 1) is ``low`` to 1.01 of the simulated one (the Gaussian limit misses the counts' right skew; the
    simulated excess has a standard error under 1%)."""
    rng = np.random.default_rng(11)
    per_token = rng.multivariate_hypergeometric([experts // ranks] * ranks, topk, size=(2000, tokens),
                                                method="count")
    loads = per_token.sum(axis=1).max(axis=1) / (tokens * topk / ranks)
    ratio = (busiest_rank_load(tokens, experts, topk, ranks) - 1) / (loads.mean() - 1)
    assert low <= ratio <= 1.01


def test_deepeps_busiest_receivers_against_the_router() -> None:
    """DeepEP counts distinct tokens: ep 16 = 4 nodes of 4 ranks, 32 experts top-4, 128 tokens a rank, the router
    simulated 400 times. Over RDMA, rank (node m, local r) receives the tokens of the 4 ranks of local index r that
    reach node m; over NVLink, the tokens of all 16 ranks that reach it. The closed form's excess is 1.00-1.15x the
    simulated one over RDMA (1.10x here: it treats the receivers of other local indices as correlated, which
    overstates the maximum) and within 4% over NVLink; both below the pairs' load (a token with two experts on a
    rank counts once)."""
    tokens, experts, topk, nodes, per_node, trials = 128, 32, 4, 4, 4, 400
    ranks = nodes * per_node
    rng = np.random.default_rng(5)
    rdma, nvlink = [], []
    for _ in range(trials):
        logits = rng.standard_normal((ranks, tokens, experts))
        rank = np.argpartition(-logits, topk - 1, axis=-1)[..., :topk] // (experts // ranks)
        hit_rank = np.zeros((ranks, tokens, ranks), bool)
        np.put_along_axis(hit_rank, rank, True, axis=-1)
        hit_node = np.zeros((ranks, tokens, nodes), bool)
        np.put_along_axis(hit_node, rank // per_node, True, axis=-1)
        by_index = hit_node.reshape(nodes, per_node, tokens, nodes).sum(axis=(0, 2))  # [local index, node]
        received = hit_rank.sum(axis=(0, 1))
        rdma.append(by_index.max() / by_index.mean())
        nvlink.append(received.max() / received.mean())
    rdma_form = busiest_receiver_tokens(tokens * nodes, experts, topk, nodes, ranks)
    nvlink_form = busiest_receiver_tokens(tokens * ranks, experts, topk, ranks, ranks)
    assert 1.0 <= (rdma_form - 1) / (np.mean(rdma) - 1) <= 1.15
    assert (nvlink_form - 1) == pytest.approx(np.mean(nvlink) - 1, rel=0.04)
    assert nvlink_form < busiest_rank_load(tokens * ranks, experts, topk, ranks)


def test_the_load_is_one_where_routing_cannot_be_uneven() -> None:
    """One rank, every expert chosen (k = E: each rank gets exactly k/ep per token), or no tokens: exactly 1."""
    assert busiest_rank_load(4096, 8, 2, 1) == 1.0
    assert busiest_rank_load(4096, 8, 8, 4) == 1.0
    assert busiest_rank_load(0, 8, 2, 4) == 1.0
    with pytest.raises(ValueError, match="ranks: 3 EP ranks, 8 experts"):
        busiest_rank_load(4096, 8, 2, 3)


# -------------------------------------------------------------------------------------------------- the plan
H, E, TOPK = 1024, 8, 2


def _scenario(moe: dict[str, Any], **parallel: Any):
    return scenario_from_dict({
        "name": "forced", "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
        "model": small_moe_model("moe-small", num_layers=4, hidden_size=H, heads=8, ffn_hidden_size=2048,
                                 max_seq_len=4096) | {"num_moe_experts": E, "moe_router_topk": TOPK},
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 2, "ep": 4, "zero": 1} | parallel, "moe": moe})


def test_the_plan_takes_the_busiest_ranks_load_from_the_layout() -> None:
    """tp 2 (sequence parallel), ep 4, etp 2: a rank routes b*s/tp = 1,024 tokens; its experts compute the pairs of
    the etp x ep = 8 ranks' 8,192 tokens, its all-to-all receives those of the ep = 4 ranks' 4,096. Written out:
    L/E = 1/4, Var(H) = 2 (1/4)(3/4)(6/7) = 9/28, e_4 = 1.02938 (Harter's table), load = 1 + e_4 sqrt(Var(H)/n)
    / (k/ep) / sqrt(3/4)."""
    plan = resolve(_scenario({"force_load_balancing": True}, tp=2, sequence_parallel=True, etp=2))
    e4 = 1.0293754

    def load(n: float) -> float:
        return 1 + e4 * math.sqrt(9 / 28 / n) / 0.5 / math.sqrt(0.75)

    assert plan.dispatch_tokens == 1024
    assert plan.expert_load == pytest.approx(load(8192), rel=1e-6)  # 1.01489
    assert plan.dispatch_skew == pytest.approx(load(4096), rel=1e-6)  # 1.02106
    assert plan.routed_tokens == pytest.approx(1024 * TOPK * 2 * load(8192), rel=1e-6)
    assert plan.dispatch_bytes == pytest.approx(1024 * TOPK * H * 2)  # a rank sends exactly its own pairs


def test_deepeps_skew_is_the_slower_tiers_in_distinct_tokens() -> None:
    """Qwen3-235B ep 32 over 4 nodes (the ModelZoo row, flex): a rank routes 2,048 tokens. Over RDMA its receiver
    counts the 4 x 2,048 tokens of its local index reaching its node, q = 1 - C(96,8)/C(128,8); over NVLink the
    32 x 2,048 tokens reaching it, q = 1 - C(124,8)/C(128,8); e_32 = 2.06967. RDMA's time is the slower (as
    test_deepep holds), so the exchange's skew is RDMA's unless NVLink's skewed time passes it."""
    from math import comb

    plan = resolve(load_scenario(MOE / "mz-qwen3-235b-h100-256-deepep-ep32.yaml"))
    e32 = 2.0696688

    def form(n: float, size: int) -> float:
        total = comb(128, 8)
        miss, miss_both = comb(128 - size, 8) / total, comb(128 - 2 * size, 8) / total
        q = 1 - miss
        return 1 + e32 * math.sqrt((q * (1 - q) - (1 - 2 * miss + miss_both - q * q)) / n) / q

    traffic = plan.deepep_traffic
    rdma = traffic.rdma_bytes / traffic.rdma_bandwidth[0]
    nvlink = traffic.nvlink_bytes / traffic.nvlink_bandwidth[0]
    skew = max(rdma * form(4 * 2048, 32), nvlink * form(32 * 2048, 4)) / max(rdma, nvlink)
    assert plan.dispatch_skew == pytest.approx(skew, rel=1e-9)
    assert plan.dispatch_skew == pytest.approx(form(4 * 2048, 32), rel=1e-9)  # 1.0075: RDMA's
    assert plan.expert_load == pytest.approx(1 + e32 * math.sqrt(8 / 32 * 31 / 32 * 120 / 127 / 65536) / 0.25
                                             / math.sqrt(31 / 32), rel=1e-6)  # 1.0157: the pairs'
    uniform = resolve(load_scenario(MOE / "mz-qwen3-235b-h100-256-deepep-ep32.yaml",
                                    ["moe.force_load_balancing=false"]))
    assert plan.deepep_seconds[0] == pytest.approx(skew * uniform.deepep_seconds[0], rel=1e-9)


def test_capacity_caps_the_forced_load_and_padding_replaces_it() -> None:
    """Forced balance with a capacity factor: the load is capped by it (tokens over it dropped); padded to capacity,
    every expert gets exactly its capacity, as without forced balance."""
    forced = resolve(_scenario({"force_load_balancing": True})).expert_load
    assert forced > 1.01
    assert resolve(_scenario({"force_load_balancing": True, "capacity_factor": 1.0})).expert_load == 1.0
    padded = resolve(_scenario({"force_load_balancing": True, "capacity_factor": 1.25, "pad_to_capacity": True}))
    assert (padded.expert_load, padded.dispatch_skew) == (1.25, 1.0)
    assert resolve(_scenario({"force_load_balancing": True}, ep=1)).expert_load == 1.0


@pytest.mark.parametrize("moe, message", [
    ({"force_load_balancing": True, "imbalance": 1.3},
     "moe.imbalance: 1.3 cannot be combined with moe.force_load_balancing"),
])
def test_an_explicit_imbalance_with_forced_balance_is_refused_in_one_line(moe: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        _scenario(moe)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------ importers
MEGATRON = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4 ")


def test_sim_import_megatron_maps_the_forced_balance_flag_and_emit_writes_it_back(tmp_path) -> None:
    """--moe-router-force-load-balancing -> moe.force_load_balancing (reported as mapped, not unknown); without it
    false; `sim search --emit megatron` writes the flag and it imports back; TorchTitan's emitter refuses it."""
    from sim.interop.draft import Options
    from sim.interop.emit import emit
    from sim.interop.megatron import import_megatron

    draft = import_megatron((MEGATRON + "--moe-router-force-load-balancing").split(), Options(gpu="H100-SXM", gpus=8))
    scenario = draft.scenario()
    assert scenario.moe.force_load_balancing
    assert [row.status for row in draft.rows if "force-load-balancing" in row.source] == ["mapped"]
    assert not import_megatron(MEGATRON.split(), Options(gpu="H100-SXM", gpus=8)).scenario().moe.force_load_balancing
    path = tmp_path / "emitted.sh"
    path.write_text(emit(scenario, "megatron").text)
    assert import_megatron([str(path)], Options(gpu="H100-SXM")).scenario().moe.force_load_balancing
    with pytest.raises(ConfigError) as error:
        emit(scenario, "torchtitan")
    assert str(error.value).startswith("moe.force_load_balancing: ") and "\n" not in str(error.value)


def test_sim_import_nemo_maps_the_forced_balance_key(tmp_path) -> None:
    """NeMo 2.0's model.config key (Megatron-Core TransformerConfig.moe_router_force_load_balancing)."""
    from sim.interop.draft import Options
    from sim.interop.nemo import import_nemo

    path = tmp_path / "nemo.yaml"
    path.write_text(NEMO_MOE_MODEL + "  moe_router_force_load_balancing: true\n")
    draft = import_nemo([str(path)], Options(gpu="H100-SXM"))
    assert draft.scenario().moe.force_load_balancing
    assert not [row for row in draft.rows if row.status == "unknown"]


# -------------------------------------------------------------------------------------- a validation row
def test_the_mixtral_forced_balance_row_moves_by_the_busiest_ranks_extra_work() -> None:
    """ModelZoo Mixtral 8x22B forced balance (tp 2 SP, ep 8, 8 experts top-2: 2,048 tokens a rank, 16,384 over the
    EP group): load 1 + e_8 sqrt(0.1875/16384)/(1/4)/sqrt(7/8) = 1.0206. The expert GEMMs of every rank take that
    factor exactly; the step grows by (load - 1) x (the rank's expert GEMMs + its all-to-all time), within 10% (the
    pipeline passes a stage's extra time on with its bubbles; the all-to-all's latency does not grow)."""
    from sim import runner

    path = MOE / "mz-mixtral-8x22b-h100-128-forcebal.yaml"
    forced = load_scenario(path)
    assert forced.moe.force_load_balancing
    uniform = load_scenario(path, ["moe.force_load_balancing=false"])
    load = 1 + 1.4236003 * math.sqrt(0.1875 / 16384) / 0.25 / math.sqrt(7 / 8)
    runs = {name: runner.run(sc) for name, sc in (("uniform", uniform), ("forced", forced))}
    assert runs["forced"].plan.expert_load == pytest.approx(load, rel=1e-6)

    def work(name: str) -> tuple[float, float]:
        trace = runs[name].trace
        rank0 = trace[trace["rank"] == 0]
        spans = rank0["end_s"] - rank0["start_s"]
        return float(spans[rank0["name"] == "moe_experts"].sum()), float(spans[rank0["stream"] == "ep"].sum())

    (experts, exchanges), (forced_experts, _) = work("uniform"), work("forced")
    assert forced_experts == pytest.approx(load * experts, rel=1e-4)
    grew = runs["forced"].summary.step_time_s - runs["uniform"].summary.step_time_s
    assert grew == pytest.approx((load - 1) * (experts + exchanges), rel=0.10)


def test_exactly_the_rows_whose_source_forced_balance_set_the_knob() -> None:
    """tests/data/moe_published_runs.csv's force_balance column (read from each run's command, moe_sources.md) is
    the scenario's moe.force_load_balancing, for every validation row."""
    runs = pd.read_csv(DATA / "moe_published_runs.csv")
    rows = runs[runs["use"] == "validation"]
    assert rows["force_balance"].eq(True).sum() == 6
    for _, row in rows.iterrows():
        forced = row["force_balance"] is True
        assert load_scenario(MOE / row["scenario"]).moe.force_load_balancing == forced, row["id"]


@pytest.mark.slow
def test_the_forced_balance_rows_read_slower_by_at_most_the_load() -> None:
    """Each forced-balance row's prediction grows by at most the busiest rank's excess load (only expert GEMMs and
    exchanges grow); the Mixtral row, whose MoE passes the device paces (not the host sync, docs/mechanisms/
    moe_host_sync.md: the Qwen3 rows' are host-bound in part or whole), by at least a third of it."""
    names = [name for name in published(MOE)["scenario"] if load_scenario(MOE / name).moe.force_load_balancing]
    forced = run_validation(MOE, only=names).set_index("scenario")
    uniform = run_validation(MOE, only=names, overrides=["moe.force_load_balancing=false"]).set_index("scenario")
    for name in names:
        load = resolve(load_scenario(MOE / name)).expert_load
        grew = forced.loc[name, "predicted_iteration_time_s"] / uniform.loc[name, "predicted_iteration_time_s"] - 1
        assert 0 <= grew <= load - 1, (name, grew, load)
        if name == "mz-mixtral-8x22b-h100-128-forcebal.yaml":
            assert grew >= (load - 1) / 3, (name, grew, load)
