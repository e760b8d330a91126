"""The flex (DeepEP) token dispatcher (issue 23, docs/mechanisms/deepep.md): what DeepEP's normal kernels send per
rank against the alltoall dispatcher's NCCL all-to-all for uniform routing, in closed form, and the seconds both
replays give its tasks."""

from __future__ import annotations

import itertools
from math import comb
from pathlib import Path
from typing import Any

import pytest

from sim import runner
from sim.errors import ConfigError, SimError
from sim.network import deepep
from sim.network import models as network_models
from sim.plan import resolve
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict
from sim.workload.moe_layer import combine_exchanges, dispatch_exchanges

from conftest import NEMO_MOE_MODEL, SCENARIOS, small_moe_model

QWEN3_EP32 = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32.yaml"
GB = 1e9


def _plan(*overrides: str):
    """The Qwen3 ep 32 row with uniform routing (its forced balance off: the closed forms here are DeepEP's)."""
    return resolve(load_scenario(QWEN3_EP32, overrides=["moe.token_dispatcher=flex", "moe.force_load_balancing=false",
                                                        *overrides]))


@pytest.mark.parametrize(("experts", "groups", "topk"), [(8, 4, 2), (12, 3, 4), (16, 8, 3), (6, 2, 1)])
def test_distinct_groups_is_the_mean_over_every_routing(experts: int, groups: int, topk: int) -> None:
    """Every top-k set equally likely (uniform routing): the mean number of groups a token reaches, enumerated."""
    per = experts // groups
    counts = [len({e // per for e in chosen}) for chosen in itertools.combinations(range(experts), topk)]
    assert deepep.distinct_groups(groups, experts, topk) == pytest.approx(sum(counts) / len(counts), rel=1e-12)


def test_bytes_per_rank_against_the_alltoall_dispatcher() -> None:
    """Qwen3-235B (128 experts, top-8, h 4096, bf16) at tp 2, ep 32 over 4 nodes: a rank routes b*s/tp = 2048
    tokens. alltoall sends every (token, expert) pair: 2048 x 8 x 4096 x 2 B. DeepEP sends a token once per
    destination node over RDMA: 2048 x 4 (1 - C(96,8)/C(128,8)) x 4096 x 2 B (3.63 of 8 copies), and once per
    destination rank over NVLink: 2048 x 32 (1 - C(124,8)/C(128,8)) x 4096 x 2 B."""
    plan = _plan()
    assert plan.deepep_shape == (4, 8)
    row = 4096 * 2
    assert plan.dispatch_bytes == 2048 * 8 * row
    nodes = 4 * (1 - comb(96, 8) / comb(128, 8))
    ranks = 32 * (1 - comb(124, 8) / comb(128, 8))
    rdma, nvlink = plan.deepep_bytes
    assert rdma == pytest.approx(2048 * nodes * row, rel=1e-12)
    assert nvlink == pytest.approx(2048 * ranks * row, rel=1e-12)
    assert nodes == pytest.approx(3.6290, abs=1e-4) and ranks == pytest.approx(7.3594, abs=1e-4)
    assert rdma / plan.dispatch_bytes == pytest.approx(nodes / 8, rel=1e-12)


def test_seconds_at_the_readme_bandwidths_and_the_knobs() -> None:
    """Across 4 nodes the RDMA part bounds it: bytes / 58 GB/s (dispatch) and / 57 GB/s (combine), the README's
    EP 32 row on a 50 GB/s NIC, as DGX H100's; the NVLink part (bytes / (0.765 x 450 GB/s)) is shorter. The knobs
    replace either bandwidth; the ideal network makes them free."""
    plan = _plan()
    rdma, nvlink = plan.deepep_bytes
    dispatch, combine = plan.deepep_seconds
    assert dispatch == pytest.approx(rdma / (58 * GB), rel=1e-12)
    assert combine == pytest.approx(rdma / (57 * GB), rel=1e-12)
    assert nvlink / (153 / 200 * 450 * GB) < dispatch
    assert _plan("moe.deepep_rdma_bandwidth=29 GB/s").deepep_seconds[0] == pytest.approx(2 * dispatch, rel=1e-12)
    slow_nvlink = _plan("moe.deepep_nvlink_bandwidth=10 GB/s").deepep_seconds[0]
    assert slow_nvlink == pytest.approx(nvlink / (10 * GB), rel=1e-12)
    assert _plan("network.model=ideal").deepep_seconds == (0.0, 0.0)


def test_inside_one_node_nvlink_bounds_it() -> None:
    """ep 8 inside a node (tp 4, ep 8): no RDMA; a token once per destination rank over NVLink at 153 / 200 of
    the 450 GB/s line rate (dispatch), with 16 experts per rank: 8 (1 - C(112,8)/C(128,8)) ranks per token."""
    plan = _plan("parallel.tp=4", "parallel.dp=8", "parallel.ep=8")
    assert plan.deepep_shape == (1, 8)
    rdma, nvlink = plan.deepep_bytes
    ranks = 8 * (1 - comb(112, 8) / comb(128, 8))
    assert rdma == 0.0
    assert nvlink == pytest.approx(1024 * ranks * 4096 * 2, rel=1e-12)
    assert plan.deepep_seconds[0] == pytest.approx(nvlink / (153 / 200 * 450 * GB), rel=1e-12)


def test_routing_skew_scales_the_time() -> None:
    assert _plan("moe.imbalance=1.5").deepep_seconds[0] == pytest.approx(1.5 * _plan().deepep_seconds[0], rel=1e-12)


def test_the_exchanges_and_the_trace_carry_those_seconds() -> None:
    """One fused exchange each way (no etp collectives); the trace's ep tasks last exactly the closed form, and the
    estimate prices the same exchanges."""
    plan = _plan("training.global_batch=256")
    dispatch, combine = dispatch_exchanges(plan), combine_exchanges(plan)
    assert [ex.seconds for ex in dispatch + combine] == list(plan.deepep_seconds)
    trace = runner.run(plan.scenario).trace
    ep = trace[trace["stream"] == "ep"]
    assert len(ep) > 0
    seconds = (ep["end_s"] - ep["start_s"]).round(12)
    expected = {round(s, 12) for s in plan.deepep_seconds}
    assert set(seconds) == expected


def test_flex_with_expert_tensor_parallelism_is_refused_in_one_line() -> None:
    with pytest.raises(SimError, match=r"moe\.token_dispatcher: flex \(DeepEP\) with parallel\.etp = 2"):
        load_scenario(QWEN3_EP32, overrides=["moe.token_dispatcher=flex", "parallel.etp=2", "parallel.ep=16"])


def test_sim_import_maps_the_flex_dispatcher_and_the_a2a_overlap() -> None:
    """Megatron flags -> scenario: --moe-token-dispatcher-type flex (the deepep backend, Megatron-Core's default)
    and --overlap-moe-expert-parallel-comm --delay-wgrad-compute; another flex backend is refused in one line."""
    from sim.interop.draft import Options
    from sim.interop.megatron import import_megatron

    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4 --moe-token-dispatcher-type flex ")
    s = import_megatron((base + "--overlap-moe-expert-parallel-comm --delay-wgrad-compute").split(),
                        Options(gpu="H100-SXM", gpus=8)).scenario()
    assert (s.moe.token_dispatcher, s.moe.a2a_overlap, s.parallel.ep) == ("flex", True, 4)
    with pytest.raises(SimError) as error:
        import_megatron((base + "--moe-flex-dispatcher-backend hybridep").split(), Options(gpu="H100-SXM", gpus=8))
    assert "'hybridep' is not modelled (deepep)" in str(error.value) and "\n" not in str(error.value)


def _moe_one(overrides: list[str], zero: int = 0) -> Scenario:
    """Two MoE layers of 8 experts on one node, ep 8, ZeRO ``zero``, with ``overrides`` (``moe.<field>=<value>``)."""
    doc: dict[str, Any] = {
        "name": "moe", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=2, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                 max_seq_len=2048),
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "zero": zero}, "schedule": "1f1b", "moe": {}}
    for override in overrides:
        key, value = override.split("=")
        doc["moe"][key.split(".")[1]] = {"true": True, "false": False}.get(value, int(value) if value.isdigit()
                                                                            else value)
    return scenario_from_dict(doc)


@pytest.mark.parametrize(("flags", "sms"), [
    ("", 20),
    ("--moe-deepep-num-sms 32", 32),
    ("--moe-flex-dispatcher-num-sms 24", 24),
    ("--moe-deepep-num-sms 32 --moe-flex-dispatcher-num-sms 24", 24),  # the unified knob wins (__post_init__)
])
def test_sim_import_maps_deepeps_sms(flags: str, sms: int) -> None:
    """Megatron-Core's SMs for DeepEP (--moe-deepep-num-sms, deprecated into --moe-flex-dispatcher-num-sms, which
    takes precedence: transformer_config.py __post_init__; None -> DeepEP V1's 20) -> moe.deepep_sms, reported as
    mapped (it was listed as not read, and the scenario kept 20)."""
    from sim.interop.draft import Options
    from sim.interop.megatron import import_megatron

    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4 --moe-token-dispatcher-type flex ")
    draft = import_megatron((base + flags).split(), Options(gpu="H100-SXM", gpus=8))
    assert draft.scenario().moe.deepep_sms == sms
    assert not [row for row in draft.rows if "num-sms" in row.source and row.status == "unknown"]


def test_megatron_emit_keeps_deepeps_sms(tmp_path: Path) -> None:
    """`sim search --emit megatron` writes moe.deepep_sms as --moe-deepep-num-sms (it was dropped: Megatron then
    runs DeepEP on 20 SMs) and imports back to it; 0 (the model's switch for no SM contention) is no DeepEP
    setting and is refused in one line."""
    from sim.interop.draft import Options
    from sim.interop.emit import emit
    from sim.interop.megatron import import_megatron

    scenario = _moe_one(["moe.token_dispatcher=flex", "moe.deepep_sms=32"], zero=1)
    path = tmp_path / "emitted.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert (back.moe.token_dispatcher, back.moe.deepep_sms, back.parallel.ep) == ("flex", 32, 8)
    default = _moe_one(["moe.token_dispatcher=flex"], zero=1)
    assert "num-sms" not in emit(default, "megatron").text  # Megatron-Core's own default, as before
    with pytest.raises(ConfigError) as error:
        emit(_moe_one(["moe.token_dispatcher=flex", "moe.deepep_sms=0"], zero=1), "megatron")
    assert str(error.value).startswith("moe.deepep_sms: 0") and "\n" not in str(error.value)


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
@pytest.mark.parametrize(("overrides", "knob"), [
    (["moe.token_dispatcher=flex"], "moe.token_dispatcher"),
    (["moe.a2a_overlap=true"], "moe.a2a_overlap"),
    ([], "parallel.ep"),
])
def test_other_emitters_refuse_what_they_cannot_write(framework: str, overrides: list[str], knob: str) -> None:
    """An emitter with no setting for the flex dispatcher, the EP A2A overlap (or, DeepSpeed's JSON, for expert
    parallelism) refuses it in one line naming the knob, instead of writing a launch that runs without it."""
    from sim.interop.emit import emit

    scenario = _moe_one(overrides)
    if knob == "parallel.ep" and framework == "torchtitan":
        assert "expert_parallel_degree = 8" in emit(scenario, framework).text  # TorchTitan writes it
        return
    with pytest.raises(ConfigError) as error:
        emit(scenario, framework)
    assert str(error.value).startswith(f"{knob}: ") and "\n" not in str(error.value)


def test_megatron_emit_keeps_the_moe_shape_and_the_uneven_pipeline(tmp_path: Path) -> None:
    """`sim search --emit megatron` on the Qwen3-235B DeepEP row writes what makes its launch train that model on
    that split: --moe-ffn-hidden-size 1536 (without it Megatron-Core's experts take --ffn-hidden-size 12288, 8x
    wider), and --account-for-embedding/loss-in-pipeline-split (without them Megatron refuses 94 layers over
    pp 8 x vpp 4), --recompute-modules layernorm moe_act; imported back it is the same model and layout. A layer
    pattern (DeepSeek-V3's dense first layers) is written as Megatron's list and read back, as is a shared expert's
    width and a first stage's layers."""
    from sim.interop.draft import Options
    from sim.interop.emit import emit
    from sim.interop.megatron import import_megatron

    scenario = load_scenario(QWEN3_EP32, overrides=["moe.token_dispatcher=flex"])
    path = tmp_path / "qwen3.sh"
    path.write_text(emit(scenario, "megatron").text)
    back = import_megatron([str(path)], Options(gpu=scenario.cluster.gpu.name)).scenario()
    assert back.model.moe_ffn_hidden_size == 1536 and back.model.moe_layers == scenario.model.moe_layers
    p, q = back.parallel, scenario.parallel
    assert (p.tp, p.pp, p.vpp, p.ep, p.account_for_embedding_in_pipeline_split,
            p.account_for_loss_in_pipeline_split) == (q.tp, q.pp, q.vpp, q.ep, True, True)
    assert resolve(back).stage_chunks == resolve(scenario).stage_chunks
    assert back.training.recompute_modules == ["layernorm", "moe_act"]  # --recompute-modules, Megatron's names
    pattern = (0, 1, 0, 1)
    doc = {"name": "pattern", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "model": {"name": "moe-pattern", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                     "num_kv_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 32000, "max_seq_len": 2048,
                     "mlp": "swiglu", "position_embedding": "rope", "norm": "rmsnorm", "tied_embeddings": False,
                     "bias": False, "num_moe_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 512,
                     "moe_shared_expert_intermediate_size": 1024, "moe_layer_freq": list(pattern)},
           "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
           "parallel": {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "zero": 1, "first_stage_layers": 1},
           "schedule": "1f1b"}
    small = scenario_from_dict(doc)
    path = tmp_path / "pattern.sh"
    path.write_text(emit(small, "megatron").text)
    back = import_megatron([str(path)], Options(gpu="H100-SXM")).scenario()
    assert back.model.moe_layers == (False, True, False, True)
    assert (back.model.moe_ffn_hidden_size, back.model.moe_shared_expert_intermediate_size) == (512, 1024)
    assert back.parallel.first_stage_layers == 1


NEMO_MOE = NEMO_MOE_MODEL + """  moe_token_dispatcher_type: flex
  moe_flex_dispatcher_backend: BACKEND
  moe_deepep_num_sms: 32
  overlap_moe_expert_parallel_comm: true
  delay_wgrad_compute: true
  recompute_granularity: selective
  recompute_modules: [layernorm, moe_act]
"""


def test_sim_import_nemo_reads_the_flex_backend_the_overlap_and_the_recompute_modules(tmp_path: Path) -> None:
    """A NeMo config's TransformerConfig keys, named as Megatron-Core's: the flex dispatcher's backend (hybridep was
    imported as DeepEP, unread), its SMs, the EP A2A overlap and the recomputed modules (each listed as not read
    and simulated without) map as the Megatron flags do; another backend is refused in one line."""
    from sim.interop.draft import Options
    from sim.interop.nemo import import_nemo

    path = tmp_path / "nemo.yaml"
    path.write_text(NEMO_MOE.replace("BACKEND", "deepep"))
    draft = import_nemo([str(path)], Options(gpu="H100-SXM"))
    s = draft.scenario()
    assert (s.moe.token_dispatcher, s.moe.deepep_sms, s.moe.a2a_overlap) == ("flex", 32, True)
    assert s.training.recompute_modules == ["layernorm", "moe_act"]
    assert not [row for row in draft.rows if row.status == "unknown"]
    path.write_text(NEMO_MOE.replace("BACKEND", "hybridep"))
    with pytest.raises(ConfigError) as error:
        import_nemo([str(path)], Options(gpu="H100-SXM"))
    assert "'hybridep' is not modelled (deepep)" in str(error.value) and "\n" not in str(error.value)


def _two_nodes(network: str, **moe: Any) -> Scenario:
    """One MoE layer of 16 experts, ep 16 over 2 nodes of 8 H100s (DeepEP's internode kernels: 2 domains of 8
    ranks, the smallest internode group DeepEP V1 runs), dp 16, 4 micro-batches, on ``network``."""
    return scenario_from_dict({
        "name": "deepep-net", "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=1, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                 max_seq_len=2048) | {"num_moe_experts": 16},
        "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "dp": 16, "ep": 16}, "schedule": "1f1b",
        "moe": {"token_dispatcher": "flex", **moe}, "network": {"model": network}})


@pytest.mark.parametrize("op", [deepep.DISPATCH, deepep.COMBINE])
def test_contention_flows_put_the_closed_form_bytes_on_each_link(op: str) -> None:
    """The contention model's DeepEP exchange over 2 nodes x 8 ranks: each GPU sends R / 2 to the GPU of its local
    index on the other node (its NIC, PCIe and the rail's leaf: (D - 1) R / D with D = 2) and N / 8 to each of
    its 7 node peers (its NVLink port: (P - 1) N / P with P = 8), R and N as DeepEP counts them. Alone, every
    flow ends at the closed form (RDMA bound here: R / 43 GB/s), and the hottest receiver's at skew x it."""
    plan = resolve(_two_nodes("contention"))
    traffic, group = plan.deepep_traffic, plan.grid.ep_group(0)
    assert traffic is not None and plan.deepep_shape == (2, 8)
    topo = runner.build_topology(plan)
    net = network_models.make("contention", topo, deepep=traffic)
    assert isinstance(net, network_models.ContentionNetwork)
    (phase,) = net.transfer(op, traffic.rdma_bytes, group)
    carried: dict[tuple[str, str], float] = {}
    for channel in phase.channels:
        for link, hops in channel.loads:
            ends = (topo.links[link].src, topo.links[link].dst)
            carried[ends] = carried.get(ends, 0.0) + hops * channel.nbytes
    rdma, nvlink = traffic.rdma_bytes, traffic.nvlink_bytes
    for rank in group:
        node, local = divmod(rank, 8)
        assert carried[(f"gpu{rank}", f"nic{node}.{local}")] == pytest.approx(rdma / 2, rel=1e-12)
        assert carried[(f"nic{node}.{local}", f"leaf0.{local}")] == pytest.approx(rdma / 2, rel=1e-12)
        assert carried[(f"gpu{rank}", f"nvswitch{node}")] == pytest.approx(7 * nvlink / 8, rel=1e-12)
        assert carried[(f"nvswitch{node}", f"gpu{rank}")] == pytest.approx(7 * nvlink / 8, rel=1e-12)
    assert len(carried) == 16 * 6  # per GPU, each way: PCIe to its NIC, that NIC to the rail's leaf, its NVLink port
    alone = max(channel.nbytes / channel.rate_cap for channel in phase.channels)
    assert alone == pytest.approx(traffic.seconds(op), rel=1e-12)
    assert traffic.seconds(op) == pytest.approx(rdma / 43e9, rel=1e-12)  # the README's 2-node row, 50 GB/s NIC
    (hot,) = net.transfer(op, traffic.rdma_bytes, group, 1.5)
    assert max(ch.nbytes / ch.rate_cap for ch in hot.channels) == pytest.approx(1.5 * traffic.seconds(op), rel=1e-12)


def test_contention_replay_times_the_exchanges_as_the_analytic_one_when_uncontended() -> None:
    """The same 2-node layout under both models. The dispatches and combines (and their gradients) share no link
    with anything (no TP, the gradients reduced after the last backward), so their flows end exactly at the closed
    form (to 1e-9); the step agrees to 0.1%. The links' load over the first micro-batch's forward (before any
    backward) carries exactly the two exchanges' RDMA bytes on the NICs: 16 GPUs x R / 2 each."""
    analytic = runner.run(_two_nodes("analytic"))
    contention = runner.run(_two_nodes("contention"), record_links=True)
    plan = contention.plan
    assert plan.deepep_traffic is not None
    dispatch, combine = plan.deepep_seconds
    trace = contention.trace
    exchanges = trace[trace["stream"] == "ep"]
    assert len(exchanges) == 4 * 4 and set(exchanges["op"]) == set(deepep.OPS)  # 4 a micro-batch, 4 micro-batches
    spans = (exchanges["end_s"] - exchanges["start_s"]).to_numpy()
    expected = exchanges["op"].map({deepep.DISPATCH: dispatch, deepep.COMBINE: combine}).to_numpy()
    assert spans == pytest.approx(expected, rel=1e-9)
    assert contention.summary.step_time_s == pytest.approx(analytic.summary.step_time_s, rel=1e-3)
    first_backward = float(trace[(trace["rank"] == 0) & (trace["kind"] == "backward")]["start_s"].min())
    segments = contention.link_segments
    assert segments is not None
    nic = segments[(segments["tier"] == "nic") & segments["src"].str.startswith("nic")
                   & (segments["end_s"] <= first_backward + 1e-12)]
    capacity = runner.build_topology(plan).links[0].capacity  # nic0.0 -> leaf0.0, as every NIC link
    moved = float(((nic["end_s"] - nic["start_s"]) * nic["load_fraction"]).sum() * capacity)
    assert moved == pytest.approx(2 * 16 * plan.deepep_traffic.rdma_bytes / 2, rel=1e-9)


def test_a_gradient_all_reduce_on_the_nics_slows_the_exchange_flows() -> None:
    """Contention with DP traffic: two gradient buckets' ring all-reduces on each rail's pair of GPUs (rank r and
    r + 8, one per node, as data-parallel groups that span the nodes rail by rail) in flight with a dispatch.
    Max-min fair on the links (sim.network.flows): each rail's NIC link carries one RDMA flow (cap B_rdma / D =
    21.5 GB/s) and one channel of each ring (cap 47 GB/s, the link's capacity), so the RDMA flows get a third of
    47 GB/s, less than their cap, and the dispatch outlasts its closed form by 21.5 / 15.67. One ring alone would
    leave them their cap (a half of 47 GB/s)."""
    from sim.network.flows import max_min_rates

    plan = resolve(_two_nodes("contention"))
    traffic, group = plan.deepep_traffic, plan.grid.ep_group(0)
    assert traffic is not None
    net = network_models.make("contention", runner.build_topology(plan), deepep=traffic)
    assert isinstance(net, network_models.ContentionNetwork)
    (dispatch,) = net.transfer(deepep.DISPATCH, traffic.rdma_bytes, group)
    channels = list(dispatch.channels)
    ring = [ch for rail in range(8) for size in (256e6, 128e6)
            for phase in net.transfer("all_reduce", size, (rail, rail + 8)) for ch in phase.channels]
    loads = {key: ch.loads for key, ch in enumerate(channels + ring)}
    caps = {key: ch.rate_cap for key, ch in enumerate(channels + ring)}
    rates = max_min_rates(loads, caps, net.capacities)
    nic_links = {i for i, link in enumerate(net.topology.links) if link.tier == "nic"}
    rdma = [key for key, ch in enumerate(channels) if any(link in nic_links for link, _ in ch.loads)]
    nvlink = [key for key in range(len(channels)) if key not in rdma]
    # one RDMA channel per sender (one other node) and one NVLink channel per sender carrying its 7 node peers'
    # pairs (its NVLink port loaded 7 times; sim.network.models ContentionNetwork._deepep_phase)
    assert len(rdma) == 16 and len(nvlink) == 16
    assert all(max(hops for _, hops in channels[key].loads) == 7 for key in nvlink)
    assert all(rates[key] == pytest.approx(net.capacities[0] / 3, rel=1e-9) for key in rdma)
    assert all(rates[key] < 0.99 * caps[key] for key in rdma)
    slowest = max(channels[key].nbytes / rates[key] for key in range(len(channels)))
    assert slowest == pytest.approx(traffic.seconds(deepep.DISPATCH) * caps[rdma[0]] / rates[rdma[0]], rel=1e-9)
    alone = max_min_rates({key: channels[key].loads for key in rdma}, {key: caps[key] for key in rdma},
                          net.capacities)
    assert all(alone[key] == pytest.approx(caps[key], rel=1e-9) for key in rdma)


def _flex(gpus_per_node: int, nodes: int, ep: int, experts: int, tp: int = 1) -> dict[str, Any]:
    """One MoE layer on ``nodes`` x ``gpus_per_node`` H100s, ep ``ep`` (etp 1), the flex dispatcher."""
    gpus = nodes * gpus_per_node
    return {"name": "deepep-peers", "cluster": {"gpu": "H100-SXM", "nodes": nodes, "gpus_per_node": gpus_per_node},
            "model": small_moe_model("moe-one", num_layers=1, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                     max_seq_len=2048) | {"num_moe_experts": experts},
            "training": {"global_batch": gpus // tp, "micro_batch": 1, "seq_len": 2048},
            "parallel": {"tp": tp, "pp": 1, "ep": ep, "etp": 1, "sequence_parallel": tp > 1},
            "moe": {"token_dispatcher": "flex"}}


@pytest.mark.parametrize(("gpus_per_node", "nodes", "ep", "experts", "message"), [
    # 16 EP ranks in one 16-GPU NVLink domain: DeepEP V1 reaches 8 NVLink peers (NUM_MAX_NVL_PEERS)
    (16, 1, 16, 16, "16 ranks of the EP group share an NVLink domain; DeepEP's normal kernels reach at most 8 "
                    "NVLink peers"),
    # an NVL72-like domain holding the whole ep 72 group
    (72, 1, 72, 72, "72 ranks of the EP group share an NVLink domain"),
    # ep 8 over two 4-GPU nodes: DeepEP takes 8 consecutive EP ranks as one NVLink node (rank / 8)
    (4, 2, 8, 8, "4 ranks of the EP group per NVLink domain over 2 domains; DeepEP's internode kernels take each 8 "
                 "consecutive EP ranks as one NVLink node"),
    # ep 168 over 21 nodes of 8: 21 RDMA peers, above NUM_MAX_RDMA_PEERS 20 (num_ranks <= 8 x 20)
    (8, 21, 168, 168, "the EP group spans 21 NVLink domains; DeepEP's normal kernels reach at most 20 RDMA peers"),
])
def test_deepeps_peer_limits_are_refused_in_one_line(gpus_per_node: int, nodes: int, ep: int, experts: int,
                                                     message: str) -> None:
    """DeepEP V1's normal kernels (csrc/kernels/configs.cuh: NUM_MAX_NVL_PEERS 8, NUM_MAX_RDMA_PEERS 20;
    csrc/deep_ep.cpp Buffer: num_ranks <= 8 x 20, num_ranks < 8 or a multiple of 8, rdma_rank = rank / 8 and
    nvl_rank = rank % 8, the 8 NVLink ranks' buffers opened by CUDA IPC) run an EP group of at most 8 ranks in one
    NVLink domain, or of 8 ranks in each of at most 20 domains: a flex layout outside that is one line naming
    moe.token_dispatcher."""
    with pytest.raises(ConfigError) as error:
        scenario_from_dict(_flex(gpus_per_node, nodes, ep, experts))
    assert str(error.value).startswith("moe.token_dispatcher: flex (DeepEP): ") and message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("gpus_per_node", "nodes", "ep", "experts", "tp", "shape"), [
    (8, 1, 8, 8, 1, (1, 8)),  # intranode, 8 NVLink peers
    (8, 2, 4, 8, 4, (1, 4)),  # ep 4 inside a node (tp 4): fewer than 8 ranks, intranode
    (8, 20, 160, 160, 1, (20, 8)),  # the largest internode group: 20 RDMA peers of 8
    (4, 1, 4, 8, 1, (1, 4)),  # a 4-GPU node, ep 4
])
def test_layouts_within_deepeps_limits_run(gpus_per_node: int, nodes: int, ep: int, experts: int, tp: int,
                                           shape: tuple[int, int]) -> None:
    plan = resolve(scenario_from_dict(_flex(gpus_per_node, nodes, ep, experts, tp)))
    assert plan.deepep_shape == shape
