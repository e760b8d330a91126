"""TP communication overlapped with the GEMMs beside it (``parallel.tp_comm_overlap`` with sequence parallelism:
Transformer Engine's userbuffers; docs/mechanisms/tp_comm_overlap.md): the chunks it emits, the block's closed
form, and the step saving it gives against the synchronous collectives, priced independently here."""

from __future__ import annotations

import pytest

from sim import runner
from sim.network import models as network
from sim.plan import resolve
from sim.runner import build_topology
from sim.workload import tp_overlap
from sim.workload.blocks import BLOCKS, blocks
from sim.workload.build import build
from sim.workload.cost_model import make_costs

from conftest import make_scenario

# A 4-layer GPT on one node's 4 GPUs, one micro-batch, no pipeline: a step is the layers' forward and backward.
MODEL = {"name": "overlap-gpt", "num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
         "vocab_size": 32000, "max_seq_len": 4096}


def _scenario(overlap: bool, chunks: int | None = None, tp: int = 4, chunk_gemms: bool = True):
    parallel = {"tp": tp, "pp": 1, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": overlap,
                "tp_comm_overlap_chunk_gemms": chunk_gemms}
    if chunks is not None:
        parallel["tp_comm_overlap_chunks"] = chunks
    return make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": tp}, model=MODEL,
                         training={"global_batch": 1, "micro_batch": 1, "seq_len": 4096, "recompute": "none",
                                   "flash_attention": True}, parallel=parallel)


@pytest.mark.parametrize("tp, chunks, expected", [(4, None, 4), (8, None, 8), (4, 2, 2)])
def test_chunks_default_to_tp_and_need_sequence_parallelism(tp, chunks, expected):
    assert tp_overlap.tp_overlap_chunks(resolve(_scenario(True, chunks, tp))) == expected
    assert tp_overlap.tp_overlap_chunks(resolve(_scenario(False, chunks, tp))) == 0
    assert tp_overlap.tp_overlap_chunks(resolve(_scenario(True, 1, tp))) == 0  # one chunk: not split (the ablation)
    no_sp = make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": tp}, model=MODEL,
                          training={"global_batch": 1, "micro_batch": 1, "seq_len": 4096},
                          parallel={"tp": tp, "pp": 1, "dp": 1, "sequence_parallel": False, "tp_comm_overlap": True})
    assert tp_overlap.tp_overlap_chunks(resolve(no_sp)) == 0  # Megatron-Core asserts SP for --tp-comm-overlap


def test_a_forward_block_gathers_in_chunks_and_its_first_gemm_waits_for_the_first_only():
    plan = resolve(_scenario(True))
    g = build(plan)
    forward = [t for t in g.tasks if t.microbatch == 0 and t.layer == 1 and t.kind in ("forward", "tp")][:6]
    # attention block: gather head, gather body, compute before the output projection, reduce-scatter body,
    # output projection, reduce-scatter tail
    assert [t.op or t.stream for t in forward] == ["all_gather", "all_gather", "compute", "reduce_scatter",
                                                  "compute", "reduce_scatter"]
    head, body, pre, rs_body, row, rs_tail = forward
    assert head.nbytes == pytest.approx(plan.tp_bytes / 4) and body.nbytes == pytest.approx(plan.tp_bytes * 3 / 4)
    assert rs_tail.nbytes == pytest.approx(plan.tp_bytes / 4)
    assert rs_body.nbytes == pytest.approx(plan.tp_bytes * 3 / 4)
    assert head.id in pre.deps and body.id not in pre.deps
    assert pre.id in rs_body.deps and row.id in rs_tail.deps and rs_body.id not in row.deps
    costs = make_costs(plan)
    work = blocks(plan)
    # the GEMMs beside the chunks run one per chunk (parallel.tp_comm_overlap_chunk_gemms, on in _scenario)
    # and the row GEMM on the 132 - 16 SMs TE's pipelined reduce-scatter leaves (parallel.tp_comm_overlap_sms)
    row_whole = costs.compute_time(work.chunked_row["attention"], "forward")
    assert row.duration == pytest.approx(row_whole * 132 / 116)
    assert pre.duration == pytest.approx(costs.compute_time(work.chunked["attention"], "forward") - row_whole)


def test_the_gemms_beside_the_chunks_run_one_per_chunk_at_the_chunks_size():
    """TE's ring exchange / pipelined reduce-scatter and PyTorch's AsyncTP issue one GEMM per chunk: the row GEMM
    is priced as 4 GEMMs of a quarter of its FLOPs each on the cost model's curve, slower than the whole GEMM where
    the curve falls with size (this block's 4096 x 1024 x 4096 output projection: 4 x 8.6 GFLOP), and the
    block's other GEMMs but QKV (column-parallel) are left whole; off, the block is priced unchanged."""
    plan = resolve(_scenario(True))
    costs, work = make_costs(plan), blocks(plan)
    (whole,) = work.row["attention"].ops
    assert [op.name for op in work.chunked_row["attention"].ops] == [whole.name] * 4
    quarter = costs.kernel_time(whole, "forward") / 4  # the whole GEMM's time shared evenly: no chunking cost
    chunk = costs.kernel_time(work.chunked_row["attention"].ops[0], "forward")
    assert work.chunked_row["attention"].ops[0].flops == pytest.approx(whole.flops / 4)
    assert chunk == pytest.approx(whole.flops / 4 / costs.gemm_rate(whole.flops / 4) * costs.factor)
    assert chunk > 1.2 * quarter  # the curve: a quarter GEMM runs >20% slower per FLOP on the H100 profile
    assert costs.compute_time(work.chunked_row["attention"], "forward") == pytest.approx(4 * chunk)
    names = [op.name for op in work.chunked["attention"].ops]
    assert names.count("qkv_proj") == 4 and names.count("out_proj") == 4
    assert work.chunked["attention"].flops("forward") == pytest.approx(work.block["attention"].flops("forward"))
    assert blocks(resolve(_scenario(True, chunk_gemms=False))).chunked == {}


def test_chunk_gemms_lengthen_the_step_by_their_unhidden_extra_time():
    """Per block forward, the chunk GEMMs add their extra time (the chunked block less the whole one, the row
    GEMM's on 132 - 16 SMs) less what of it the chunks' communication already exposed: the step grows, by at
    most the layers' whole extra forward time (the exact block saving is the closed-form test's)."""
    plan, plain = resolve(_scenario(True)), resolve(_scenario(True, chunk_gemms=False))
    costs, work = make_costs(plan), blocks(plan)
    extra = sum(costs.compute_time(work.chunked[b], "forward") - costs.compute_time(work.block[b], "forward")
                for b in BLOCKS)
    t = {flag: runner.run(_scenario(True, chunk_gemms=flag)).summary.step_time_s for flag in (True, False)}
    assert extra > 0 and blocks(plain).chunked == {}
    assert 0.5 * MODEL["num_layers"] * extra < t[True] - t[False] <= MODEL["num_layers"] * extra * 132 / 116


def _block_seconds(plan, net, costs, work, block: str, chunked: bool, sms: int = 16) -> tuple[float, float]:
    """(forward, backward) of one block and its TP collectives, by the closed forms of the mechanism page."""
    group = plan.grid.tp_group(0)
    n, nbytes = 4, plan.tp_bytes
    ag, rs = (net.collective_time(op, nbytes, group) for op in ("all_gather", "reduce_scatter"))
    total_f = costs.compute_time(work.block[block], "forward")
    row = costs.compute_time(work.row[block], "forward")
    if chunked:  # the block's forward GEMMs beside the chunks, one per chunk; the row GEMM on 132 - 16 SMs
        row = costs.compute_time(work.chunked_row.get(block, work.row[block]), "forward")
        whole = costs.compute_time(work.chunked.get(block, work.block[block]), "forward")
        total_f = whole - row + row * 132 / (132 - sms)
        row *= 132 / (132 - sms)
    weight = costs.compute_time(work.column[block], "weight_grad")
    dgrad = costs.compute_time(work.block[block], "backward") - weight
    if not chunked:  # Megatron's synchronous collectives; the backward's asynchronous input-gradient reduction
        return ag + total_f + rs, ag + max(dgrad, ag) + max(rs, weight)
    head_a, body_a = (net.collective_time("all_gather", nbytes * k / n, group) for k in (1, n - 1))
    tail_r, body_r = (net.collective_time("reduce_scatter", nbytes * k / n, group) for k in (1, n - 1))
    forward = head_a + max(total_f, max(total_f - row, body_a) + body_r) + tail_r
    backward = head_a + max(dgrad, body_a + ag) + max(rs, weight)
    return forward, backward


@pytest.mark.parametrize("chunk_gemms", [True, False])
def test_the_step_saves_what_the_closed_form_of_each_block_saves(chunk_gemms):
    """Same scenario with and without the overlap: the step shrinks by the layers' forward and backward savings,
    each block priced by the page's closed form from the network model and the cost model directly."""
    sync, overlapped = _scenario(False), _scenario(True, chunk_gemms=chunk_gemms)
    plan = resolve(overlapped)
    net = network.make("analytic", build_topology(plan), "auto", "auto")
    costs, work = make_costs(plan), blocks(plan)
    saving = 0.0
    for block in BLOCKS:
        before, after = (_block_seconds(plan, net, costs, work, block, chunked) for chunked in (False, True))
        saving += (before[0] - after[0]) + (before[1] - after[1])
    saving *= MODEL["num_layers"]
    t_sync = runner.run(sync).summary.step_time_s
    t_overlap = runner.run(overlapped).summary.step_time_s
    assert saving > 0.01 * t_sync  # a saving that matters: the TP collectives are several % of this step
    assert t_sync - t_overlap == pytest.approx(saving, rel=1e-6)


@pytest.mark.parametrize("dtype, sms, expected", [("bf16", None, 16), ("fp8", None, 16), ("bf16", 0, 0),
                                                  ("bf16", 20, 20), ("fp8", 1, 1)])
def test_the_reduce_scatter_takes_tes_default_sms_from_the_row_gemm(dtype, sms, expected):
    """TE's pipelined reduce-scatter runs on num_sm SMs and the GEMM beside it on the rest (set_sm_margin): by
    default TE's own without a userbuffers config, 16 with the margin whatever the dtype (initialize_ub's
    get_default_config, TE 2.x; Megatron-LM's --tp-comm-overlap without --tp-comm-overlap-cfg); NeMo's H100 configs
    set 20 (bf16: proj_fprop 24, fc2_fprop 16) or 1 (fp8 ring exchange); the row GEMM then takes 132 / (132 - n)
    of its time. PyTorch's AsyncTP (sim import torchtitan) takes none."""
    base = _scenario(True)
    parallel = base.parallel.model_copy(update={"tp_comm_overlap_sms": sms})
    training = base.training.model_copy(update={"dtype": dtype})
    plan = resolve(base.model_copy(update={"parallel": parallel, "training": training}))
    assert tp_overlap.tp_overlap_sms(plan) == expected
    assert tp_overlap.beside_reduce_scatter(plan, 1.0) == pytest.approx(132 / (132 - expected))
    assert tp_overlap.tp_overlap_sms(resolve(_scenario(False))) == 0  # nothing chunked, nothing taken


def test_a_block_with_no_gemm_to_hide_under_exposes_all_its_chunks():
    """The closed form's other branch: with nothing to run beside, every chunk is exposed (no saving over the
    whole collective but the chunks' extra latency)."""
    assert tp_overlap.overlapped_collective(1.0, 3.0, 0.0) == 4.0
    assert tp_overlap.overlapped_collective(1.0, 3.0, 5.0) == 1.0


def _async_tp(method: str, chunk_gemms: bool | None = None, sms: int | None = 0):
    base = _scenario(True)
    parallel = base.parallel.model_copy(update={"tp_comm_overlap_method": method,
                                                "tp_comm_overlap_chunk_gemms": chunk_gemms,
                                                "tp_comm_overlap_sms": sms})
    return base.model_copy(update={"parallel": parallel})


def test_async_tp_defaults_to_chunk_gemms_and_no_sms():
    """PyTorch's AsyncTP issues one mm per shard (_symmetric_memory's shard_consumer / chunk_producer) and copies
    with cudaMemcpy between them: by default its chunk GEMMs are priced at their own size and it takes no SMs;
    TE's userbuffers keep TE's defaults (whole GEMMs, 16 SMs)."""
    titan, te = resolve(_async_tp("async_tp", None, None)), resolve(_async_tp("userbuffers", None, None))
    assert tp_overlap.async_tp(titan) and not tp_overlap.async_tp(te)
    assert tp_overlap.tp_overlap_chunk_gemms(titan) and not tp_overlap.tp_overlap_chunk_gemms(te)
    assert tp_overlap.tp_overlap_sms(titan) == 0 and tp_overlap.tp_overlap_sms(te) == 16
    assert not tp_overlap.async_tp(resolve(_scenario(False)))  # nothing chunked: no AsyncTP whatever the method


def test_async_tp_moves_one_chunk_per_rank():
    """AsyncTP's fused collectives split into exactly tp chunks (one per rank of the group: shard_consumer per
    source rank, chunk_producer per destination rank); another count is refused in one line naming the field."""
    from sim.errors import SimError
    base = _async_tp("async_tp")
    with pytest.raises((SimError, ValueError), match="parallel.tp_comm_overlap_chunks: 2 under async_tp"):
        make_scenario(**{**base.model_dump(exclude={"parallel"}),
                         "parallel": {**base.parallel.model_dump(), "tp_comm_overlap_chunks": 2}})
    assert tp_overlap.tp_overlap_chunks(resolve(make_scenario(**{**base.model_dump(exclude={"parallel"}), "parallel": {
        **base.parallel.model_dump(), "tp_comm_overlap_chunks": 1}}))) == 0  # the ablation: not split


def test_async_tp_sums_the_partials_after_each_chunked_reduce_scatter():
    """AsyncTP's reduce-scatter copies each peer's partial of this rank's shard and then sums the tp partials in
    one kernel (torch/distributed/_symmetric_memory reduce_partials): it reads tp x (b s h / tp) elements and
    writes b s h / tp, (1 + 1/tp) b s h x 2 bytes = 1.25 x 4096 x 4096 x 2 = 41.9 MB here, priced as a
    memory-bound kernel; one per block in the forward and one per block's input-gradient reduce-scatter in the
    backward, on the compute stream after the collective. TE's reduce-scatter has none."""
    plan = resolve(_async_tp("async_tp"))
    costs = make_costs(plan)
    expected_bytes = 1.25 * 4096 * 4096 * 2
    assert tp_overlap.reduce_partials_bytes(plan) == pytest.approx(expected_bytes)
    assert tp_overlap.reduce_partials_bytes(resolve(_async_tp("userbuffers"))) == 0
    g = build(plan)
    sums = [t for t in g.tasks if t.name.endswith("_reduce_partials")]
    assert len(sums) == 4 * MODEL["num_layers"]  # attention and MLP, forward and backward
    for t in sums:
        assert t.stream == "compute" and t.nbytes == pytest.approx(expected_bytes)
        assert t.duration == pytest.approx(costs.memory_time(expected_bytes))
        assert any(g.tasks[d].stream == "tp" and g.tasks[d].op == "reduce_scatter" for d in t.deps)
    assert costs.memory_time(expected_bytes) == pytest.approx(
        expected_bytes / (3.35e12 * 3.0 / 3.35) * costs.factor)  # H100's copy rate x the end-to-end factor


def _async_tp_fused(plan, net, costs, gathering: float, scattering: float) -> float:
    """AsyncTP's two fused collectives by the mechanism page's closed forms, n = 4: the shard's copy into the
    symmetric buffer, the ``gathering`` GEMM's first n - 1 chunks beside the n - 1 remote shards' copies and its
    last after both; the ``scattering`` GEMM's first chunk, its others beside the reduce-scatter's copies, the
    reduction of the partials."""
    group, n, nbytes = plan.grid.tp_group(0), 4, plan.tp_bytes
    copy = costs.memory_time(2 * nbytes / n)
    gathered = net.collective_time("all_gather", nbytes * (n - 1) / n, group)
    scattered = net.collective_time("reduce_scatter", nbytes * (n - 1) / n, group)
    summed = costs.memory_time(nbytes * (1 + 1 / n))
    return (copy + max(gathering * (n - 1) / n, gathered) + gathering / n
            + scattering / n + max(scattering * (n - 1) / n, scattered) + summed)


def _async_tp_forward(plan, net, costs, work, block: str) -> float:
    """A block's forward under AsyncTP: the gather fused with the column GEMMs, the rest of the block, the row GEMM
    fused with the reduce-scatter."""
    column = costs.compute_time(work.chunked_column[block], "forward")
    row = costs.compute_time(work.chunked_row[block], "forward")
    rest = costs.compute_time(work.chunked[block], "forward") - row - column
    return _async_tp_fused(plan, net, costs, column, row) + rest


def _async_tp_backward(plan, net, costs, work, block: str) -> float:
    """A block's backward under AsyncTP: the output gradient's gather fused with the row GEMM's input gradient,
    the rest of the backward (the row GEMM's weight gradient in it), the column GEMMs' input gradient fused with
    the reduce-scatter, then the column GEMMs' weight gradient; no input all-gather."""
    row = costs.compute_time(work.chunked_row[block], "input_grad")
    column = costs.compute_time(work.chunked_column[block], "input_grad")
    weight = costs.compute_time(work.column[block], "weight_grad")
    rest = (costs.compute_time(work.block[block], "backward") - weight
            - costs.compute_time(work.row[block], "input_grad") - costs.compute_time(work.column[block], "input_grad"))
    return _async_tp_fused(plan, net, costs, row, column) + rest + weight


def test_async_tp_step_against_te_userbuffers_by_the_closed_forms():
    """Same chunks, chunk GEMMs and SMs (none): AsyncTP's step differs from TE's userbuffers' by, per block,
    its forward's order (no gather chunk exposed but the shard's copy and what the fused GEMM cannot hide; no
    reduce-scatter chunk after the row GEMM; the reduction) and its backward's (the output gradient's gather
    fused with the row GEMM's input gradient, the input gradient's reduce-scatter with the column GEMMs', no
    input all-gather), in the simulation and in the estimate."""
    from sim.explore.estimate import estimate
    titan, te = _async_tp("async_tp", chunk_gemms=True), _async_tp("userbuffers", chunk_gemms=True)
    plan = resolve(titan)
    net = network.make("analytic", build_topology(plan), "auto", "auto")
    costs, work = make_costs(plan), blocks(plan)
    summed = tp_overlap.reduce_partials_seconds(plan, costs)
    assert summed > 0 and tp_overlap.shard_copy_seconds(plan, costs) > 0
    delta = 0.0
    for block in BLOCKS:
        te_forward, te_backward = _block_seconds(plan, net, costs, work, block, True, sms=0)
        delta += _async_tp_forward(plan, net, costs, work, block) - te_forward
        delta += _async_tp_backward(plan, net, costs, work, block) - te_backward
    delta *= MODEL["num_layers"]
    simulated = runner.run(titan).summary.step_time_s - runner.run(te).summary.step_time_s
    assert simulated == pytest.approx(delta, rel=1e-6, abs=1e-9)
    assert estimate(titan).step_time_s - estimate(te).step_time_s == pytest.approx(delta, rel=1e-6, abs=1e-9)


# torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (pytorch/torchtitan, June 2025): Llama 3 70B on
# 256 Grand Teton H100s (96 GB HBM2e, 500 W), FSDP 32 x TP 8, torch.compile, full activation checkpointing, local
# batch 16 (global 512, seq 8192 from train_configs/llama3_70b.toml): tokens/s per GPU, vanilla TP -> async TP.
ASYNC_TP_70B = {"bf16": (597.3, 652.4), "fp8": (809.8, 942.4)}  # bf16 1.09x; float8 tensorwise 1.16x
# The same layout at FSDP 16 (128 GPUs), March 2025 (pytorch/pytorch#149990, torchtitan#1185): bf16 598 -> 673
# (1.125x), float8 tensorwise 820 -> 950 (1.159x).
ASYNC_TP_70B_128 = {"bf16": (598.0, 673.0), "fp8": (820.0, 950.0)}
# torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 4 (December 2024, the torch / torchtitan commits of
# the TorchTitan 405B FSDP + PP rows): Llama 3.1 70B, 256 GPUs, FSDP 32 x TP 8, Float8, full AC: 829 -> 876.
ASYNC_TP_70B_DEC_2024 = (829.0, 876.0)


def _titan_70b(dtype: str, overlap: bool, nodes: int = 32):
    training = {"global_batch": 16 * nodes, "micro_batch": 16, "seq_len": 8192, "dtype": dtype, "grad_dtype": "fp32",
                "flash_attention": True, "attention_backend": "flash", "recompute": "full"}
    if dtype == "fp8":
        training["fp8_recipe"] = "current"  # torchao Float8Linear, tensorwise dynamic scaling
    return make_scenario(
        cluster={"gpu": {"preset": "H100-SXM", "hbm_capacity": "96 GiB", "hbm_bandwidth": "2.4 TB/s",
                         "board_power": 500}, "nodes": nodes, "gpus_per_node": 8},
        model="llama3-70b", training=training,
        parallel={"tp": 8, "pp": 1, "dp": nodes, "sequence_parallel": True, "tp_comm_overlap": overlap,
                  "tp_comm_overlap_method": "async_tp"},  # no SMs taken, chunk GEMMs, the partials' reduction
        fsdp={"sharding": "FULL_SHARD", "version": 2}, costs="roofline", network="analytic")


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_async_tp_speedup_within_5_percent_of_torchtitans_measurement(dtype):
    """TorchTitan's AsyncTP (``enable_async_tensor_parallel``: ``parallel.tp_comm_overlap_method: async_tp``)
    against vanilla TP on one layout: predicted 1.138x (bf16) / 1.137x (fp8) against 1.092x / 1.164x measured,
    +4.2% / -2.3% (with TE's userbuffers' order of chunks and no cost of AsyncTP's own: 1.170x / 1.209x, +7.1% /
    +3.9%). Its December 2024 run measured 1.057x for fp8
    (benchmarks/llama3_h100_202412_torchtitan.md Table 4), the version the TorchTitan 405B rows ran."""
    vanilla, async_tp = ASYNC_TP_70B[dtype]
    step = {overlap: runner.run(_titan_70b(dtype, overlap)).summary.step_time_s for overlap in (False, True)}
    predicted = step[False] / step[True]
    assert predicted == pytest.approx(async_tp / vanilla, rel=0.05)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_async_tp_speedup_at_128_gpus_within_5_percent_of_its_march_2025_measurement(dtype):
    """The same model and layout at FSDP 16 (pytorch/pytorch#149990): measured 1.125x (bf16) / 1.159x (float8
    tensorwise); predicted 1.138x / 1.137x (+1.1% / -1.9%)."""
    vanilla, async_tp = ASYNC_TP_70B_128[dtype]
    step = {overlap: runner.run(_titan_70b(dtype, overlap, nodes=16)).summary.step_time_s for overlap in (False, True)}
    assert step[False] / step[True] == pytest.approx(async_tp / vanilla, rel=0.05)


@pytest.mark.xfail(strict=True, reason=(
    "the December 2024 AsyncTP (torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 4, Float8: 829 -> 876 "
    "tokens/s per GPU, 1.057x) hid far less than the model's AsyncTP (1.137x, +7.6%), which matches the 2025 "
    "measurements; what changed between the versions is not modelled (docs/mechanisms/tp_comm_overlap.md). The "
    "TorchTitan 405B FSDP + PP rows ran that version"))
def test_async_tp_speedup_of_december_2024_within_5_percent():
    vanilla, async_tp = ASYNC_TP_70B_DEC_2024
    step = {overlap: runner.run(_titan_70b("fp8", overlap)).summary.step_time_s for overlap in (False, True)}
    assert step[False] / step[True] == pytest.approx(async_tp / vanilla, rel=0.05)



@pytest.mark.parametrize("overlap, cp", [(True, 1), (False, 2), (True, 2)], ids=["chunked", "cp", "chunked+cp"])
def test_a_split_backward_prices_each_weight_gradient_once(overlap, cp):
    """Zero-bubble schedules run the weight gradients in their own W pass, so the B pass must not also run them
    under the input-gradient reduction (Megatron's asynchronous backward, ``tp_collectives.overlaps_backward``): the
    step's compute FLOPs are 1F1B's (the same work in another order), with the chunked collectives and with
    context parallelism's attention block alike (the estimate against the simulation: test_estimate's layouts)."""
    def flops(schedule: str) -> float:
        sc = make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 4 * cp}, model=MODEL,
                           training={"global_batch": 1, "micro_batch": 1, "seq_len": 4096, "recompute": "none",
                                     "flash_attention": True}, schedule=schedule,
                           parallel={"tp": 4, "pp": 1, "dp": 1, "cp": cp, "sequence_parallel": True,
                                     "tp_comm_overlap": overlap})
        return sum(t.flops for t in build(resolve(sc)).tasks if t.rank == 0 and t.duration is not None)
    assert flops("zb-h1") == pytest.approx(flops("1f1b"), rel=1e-9)
