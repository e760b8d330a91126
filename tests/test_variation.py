"""ranks: all with asymmetry: stragglers, jitter, mixed GPUs, degraded and failed links; slice == all when
symmetric; the critical rank and link in the summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
DDP8 = SCENARIOS / "llama2-7b_h100-8_dp.yaml"
SPINE = SCENARIOS / "llama2-7b_h100-32_spine.yaml"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_slice_and_every_rank_agree_when_symmetric(path: Path) -> None:
    scenario = load_scenario(path, ["network.model=analytic"])
    if scenario.cluster.num_gpus > 64:
        pytest.skip("the 1024-GPU run is the benchmark's")
    sliced = runner.run(scenario.model_copy(update={"ranks": "slice"})).summary.step_time_s
    every = runner.run(scenario.model_copy(update={"ranks": "all"})).summary.step_time_s
    # MoE: under ranks: all the distributed optimizer's gradient-norm all-reduce over every rank is a rendezvous
    # (slice mode has none), so the stages start their tails together and a stage with a longer tail ends a few
    # nanoseconds later (Mixtral 8x7B: 3.6 ns of 3.1 s).
    assert every == pytest.approx(sliced, rel=1e-12 if not scenario.model.is_moe else 1e-8)


def test_a_straggler_stretches_the_step_by_its_extra_compute() -> None:
    base = runner.run(load_scenario(DDP8, ["ranks=all"])).summary
    slow = runner.run(load_scenario(DDP8, ["ranks=all", "variation.slowdown={3: 1.2}"])).summary
    assert base.critical_rank == 0 and slow.critical_rank == 3
    compute = slow.critical_path_s.compute_by_rank
    assert list(compute) == ["3"]  # the whole critical path's compute is the straggler's
    base_compute = base.critical_path_s.compute_by_rank["0"]
    assert compute["3"] == pytest.approx(1.2 * base_compute, rel=1e-12)
    # The step grew by exactly the straggler's extra compute: the DP tail after it is unchanged.
    assert slow.step_time_s - base.step_time_s == pytest.approx(0.2 * base_compute, rel=1e-9)
    assert slow.step_time_s == pytest.approx(sum(compute.values()) + sum(
        slow.critical_path_s.comm_by_kind.values()), rel=1e-12)
    # Every other rank waited at the gradient all-reduces (each bucket for the straggler's copy); it never did.
    waits = slow.collective_wait_s
    assert waits["3"] == 0.0
    assert all(waits[rank] == pytest.approx(waits["0"], rel=1e-12) and waits[rank] > 0 for rank in "0124567")
    assert all(wait == 0.0 for wait in base.collective_wait_s.values())


def test_a_failed_rail_moves_its_traffic_to_the_next_nic() -> None:
    fabric = ["cluster.fabric.oversubscription=1"]
    healthy = runner.run(load_scenario(SPINE, fabric))
    failed = runner.run(load_scenario(SPINE, [*fabric, "variation.links={nic0.3: 0}"]))

    def nic_bytes(result: runner.RunResult) -> dict[str, float]:
        links = result.links
        assert links is not None
        assert (links["peak_load_fraction"] <= 1 + 1e-9).all()  # no link over capacity, failed or not
        out = links[links["src"].str.startswith("nic0.") & links["dst"].str.startswith("leaf")]
        return dict(zip(out["src"], out["bytes"], strict=True))

    before, after = nic_bytes(healthy), nic_bytes(failed)
    assert "nic0.3" not in after  # nothing crosses the failed NIC
    assert after["nic0.4"] == pytest.approx(2 * before["nic0.4"], rel=1e-9)  # rail 3 rides on rail 4
    for nic in ("nic0.0", "nic0.1", "nic0.2", "nic0.5", "nic0.6", "nic0.7"):
        assert after[nic] == pytest.approx(before[nic], rel=1e-9)
    assert failed.summary.critical_link.link == "nic0.4->leaf0.4"
    # Two rails share one NIC, so the gradient all-reduce runs as with that NIC at half capacity.
    halved = runner.run(load_scenario(SPINE, [*fabric, "variation.links={nic0.4: 0.5}"])).summary
    assert failed.summary.step_time_s == pytest.approx(halved.step_time_s, rel=1e-6)
    assert failed.summary.step_time_s > healthy.summary.step_time_s * 1.1


def test_jitter_is_reproducible_from_the_seed() -> None:
    first = runner.run(load_scenario(DDP8, ["ranks=all", "variation.jitter=0.05"])).trace
    again = runner.run(load_scenario(DDP8, ["ranks=all", "variation.jitter=0.05"])).trace
    other = runner.run(load_scenario(DDP8, ["ranks=all", "variation.jitter=0.05", "seed=1"])).trace
    plain = runner.run(load_scenario(DDP8, ["ranks=all"])).trace
    assert first.equals(again)
    assert not first["end_s"].equals(other["end_s"])
    compute = (plain["kind"] == "forward") & (plain["name"] == "attention")
    ratio = ((first["end_s"] - first["start_s"]) / (plain["end_s"] - plain["start_s"]))[compute]
    assert ratio.median() == pytest.approx(1.0, abs=0.02)  # log-normal with median 1
    assert ratio.std() == pytest.approx(0.05, rel=0.25)


def test_a_slower_gpu_type_on_one_node_sets_the_pace() -> None:
    scenario = ["ranks=all", "cluster.nodes=2", "parallel.dp=16", "training.global_batch=16"]
    base = runner.run(load_scenario(DDP8, scenario)).summary
    mixed = runner.run(load_scenario(DDP8, [*scenario, "variation.gpus={1: A100-80GB-SXM}"])).summary
    assert mixed.critical_rank >= 8  # a rank of the A100 node
    assert mixed.step_time_s > 2 * base.step_time_s  # bf16 dense: 312 vs 989 TFLOP/s


@pytest.mark.parametrize("override, message", [
    (["variation.slowdown={1: 1.2}"], "variation: stragglers, jitter, mixed GPUs and link faults need ranks: all"),
    (["ranks=all", "variation.links={nic0.0: 0}"], "variation.links: degraded or failed links need network: "
                                                   "contention"),
    (["ranks=all", "variation.slowdown={99: 1.2}"], "variation.slowdown: rank 99 is not in 0..7"),
    (["ranks=all", "variation.slowdown={1: 0}"], "variation.slowdown"),
    (["ranks=all", "variation.gpus={0: TPU}"], "unknown GPU preset 'TPU'"),
])
def test_bad_variation_is_a_one_line_error(override: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_scenario(DDP8, override)


def test_an_unknown_link_name_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="variation.links: no NIC or link named 'nic9.9'"):
        runner.run(load_scenario(SPINE, ["variation.links={nic9.9: 0.5}"]))
