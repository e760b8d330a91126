"""``python -m analysis compare-profile``: a torch.profiler (Kineto) trace against a simulated step
(analysis.profile_compare). The trace is tests/data/kineto/two_steps.pt.trace.json (its README states its form)."""

import gzip

import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.profile_compare import (
    ATTENTION,
    GEMM,
    OTHER,
    compare,
    kernel_class,
    measured_steps,
    simulated_step,
    union_seconds,
)
from sim.cli.commands import main
from sim.costs.models import phase_scale
from sim.errors import ConfigError
from sim.model.attention_ops import ATTENTION_CORE
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.blocks import blocks
from sim.workload.cost_model import make_costs

from conftest import DATA, SCENARIOS

TRACE = DATA / "kineto" / "two_steps.pt.trace.json"
US = 1e-6


@pytest.mark.parametrize(("name", "collective", "expected"), [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "", GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn", "", GEMM),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "", GEMM),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "", GEMM),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "",
     ATTENTION),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "", ATTENTION),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", "", ATTENTION),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >", "", OTHER),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "", "NCCL all_reduce"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "", "NCCL all_gather"),  # older NCCL
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE", "", "NCCL reduce_scatter"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "", "NCCL send"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "all_to_all", "NCCL all_to_all"),
])
def test_kernel_names_fall_in_their_class(name, collective, expected):
    assert kernel_class(name, collective) == expected


def test_the_trace_sums_per_category_and_step():
    """Step 5: memcpy 100, GEMM 2000 + 1250, flash 1000, add 250 + layer norm 300 (launched in step 5, running past
    its end), all-reduce 3000, send/recv 500 us; busy = 100 + (1500..8500) + 300 = 7400 of 10000 us.
    Step 6: GEMM 1800, flash backward 2200, memset 10, all-gather 700, all-to-all 900 (Kineto's collective name on
    a SendRecv kernel), layer norm 200 and a Triton kernel of 100 us launched through the driver (cuLaunchKernel)
    at the end of step 6 and run after it; busy 5910 us."""
    five, six = measured_steps(TRACE)
    assert (five.step, six.step, five.seconds, six.seconds) == (5, 6, pytest.approx(0.01), pytest.approx(0.01))
    assert five.categories == pytest.approx({"memcpy": 100 * US, GEMM: 3250 * US, ATTENTION: 1000 * US,
                                             OTHER: 550 * US, "NCCL all_reduce": 3000 * US, "NCCL send": 500 * US})
    assert six.categories == pytest.approx({GEMM: 1800 * US, ATTENTION: 2200 * US, "memcpy": 10 * US,
                                            "NCCL all_gather": 700 * US, "NCCL all_to_all": 900 * US, OTHER: 300 * US})
    assert (five.busy, six.busy) == (pytest.approx(7400 * US), pytest.approx(5910 * US))


def test_union_of_intervals():
    assert union_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
    assert union_seconds([]) == 0


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["run", str(SCENARIOS / "tiny.yaml"), "-o", str(out), "--no-plot"]) == 0
    return out


def test_the_simulated_rank_splits_its_tasks_by_the_priced_kernels(tiny_run):
    """Every second of rank 0's tasks lands in one category: compute = the compute tasks, each collective = its
    tasks, idle = step - busy; the forward MLP blocks split as the cost model prices their kernels."""
    step, categories, busy = simulated_step(tiny_run, rank=0)
    trace = pd.read_parquet(tiny_run / "trace.parquet")
    mine = trace[trace["rank"] == 0].assign(duration=lambda t: t["end_s"] - t["start_s"])
    compute = mine[mine["stream"] == "compute"]
    assert sum(categories[c] for c in (GEMM, ATTENTION, OTHER)) == pytest.approx(compute["duration"].sum())
    for op, part in mine[mine["stream"] != "compute"].groupby("op"):
        assert categories[f"NCCL {op}"] == pytest.approx(part["duration"].sum())
    assert 0 < busy <= step
    plan = resolve(load_scenario(tiny_run / "scenario.resolved.yaml"))
    costs, attention = make_costs(plan), blocks(plan).block["attention"]
    core = sum(phase_scale(op, "forward") * costs.kernel_time(op) for op in attention.ops if op.name in ATTENTION_CORE)
    total = sum(phase_scale(op, "forward") * costs.kernel_time(op) for op in attention.ops)
    forward = compute[(compute["name"] == "attention") & (compute["kind"] == "forward")]["duration"].sum()
    backward = compute[(compute["name"] == "attention") & (compute["kind"] == "backward")]["duration"].sum()
    core_b = sum(phase_scale(op, "backward") * costs.kernel_time(op, "backward") for op in attention.ops
                 if op.name in ATTENTION_CORE)
    total_b = sum(phase_scale(op, "backward") * costs.kernel_time(op, "backward") for op in attention.ops)
    assert categories[ATTENTION] == pytest.approx(forward * core / total + backward * core_b / total_b)


def test_the_backward_attention_share_is_priced_at_the_kernels_backward_rate(tmp_path):
    """On an H100 with flash attention the kernel is priced on its measured curves, forward and backward apart
    (at tiny's size the backward costs 1.44x the forward's time per counted FLOP: sim/data/profiles/H100.json).
    The backward attention block's share of attention must use the backward rate: at the forward's (kernel_time
    without its phase, the old split) the core's share of tiny's backward block read 29.8% against the priced
    38.0%."""
    out = tmp_path / "h100"
    assert main(["run", str(SCENARIOS / "tiny.yaml"), "-o", str(out), "--no-plot", "--set",
                 "cluster.gpu=H100-SXM", "--set", "training.flash_attention=true"]) == 0
    _, categories, _ = simulated_step(out, rank=0)
    compute = pd.read_parquet(out / "trace.parquet").pipe(lambda t: t[(t["rank"] == 0) & (t["stream"] == "compute")])
    duration = compute["end_s"] - compute["start_s"]
    plan = resolve(load_scenario(out / "scenario.resolved.yaml"))
    costs, attention = make_costs(plan), blocks(plan).block["attention"]
    flash = next(op for op in attention.ops if op.name == "flash_attention")
    assert costs.kernel_time(flash, "backward") > 1.2 * costs.kernel_time(flash)  # the curves are in use

    def share(phase):
        priced = {op.name: phase_scale(op, phase) * costs.kernel_time(op, phase) for op in attention.ops}
        return sum(v for k, v in priced.items() if k in ATTENTION_CORE) / sum(priced.values())

    is_attention = compute["name"] == "attention"
    forward = duration[is_attention & (compute["kind"] == "forward")].sum()
    backward = duration[is_attention & (compute["kind"] == "backward")].sum()
    assert backward > 0
    assert categories[ATTENTION] == pytest.approx(forward * share("forward") + backward * share("backward"))


def test_the_table_holds_measured_against_simulated(tiny_run, tmp_path, capsys):
    table = compare(TRACE, tiny_run).set_index("category")
    step, categories, busy = simulated_step(tiny_run, 0)
    assert table.loc["step", "measured_s"] == pytest.approx(0.01) and table.loc["step", "simulated_s"] == step
    assert table.loc[GEMM, "measured_s"] == pytest.approx((3250 + 1800) / 2 * US)
    assert table.loc["idle", "measured_s"] == pytest.approx((2600 + 4090) / 2 * US)
    assert table.loc["idle", "simulated_s"] == pytest.approx(step - busy)
    assert table.loc["NCCL all_to_all", "simulated_s"] == 0 and table.loc["NCCL send", "simulated_s"] > 0  # tiny's pp
    row = table.loc[GEMM]
    assert row["difference_s"] == pytest.approx(row["simulated_s"] - row["measured_s"])
    assert row["error"] == pytest.approx(row["simulated_s"] / row["measured_s"] - 1)
    only_six = compare(TRACE, tiny_run, steps=[6]).set_index("category")
    assert only_six.loc[ATTENTION, "measured_s"] == pytest.approx(2200 * US)
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(TRACE.read_bytes()))
    markdown, chart = tmp_path / "table.md", tmp_path / "chart.png"
    assert analysis_main(["compare-profile", str(packed), str(tiny_run), "-o", str(markdown),
                          "--chart", str(chart)]) == 0
    printed = capsys.readouterr().out
    assert "| GEMM | 0.002525 |" in printed and markdown.read_text() in printed and chart.stat().st_size > 0


def test_bad_inputs_are_one_line(tiny_run, tmp_path, capsys):
    empty = tmp_path / "cpu_only.json"
    empty.write_text('{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", '
                     '"pid": 1, "tid": 1, "ts": 0, "dur": 10}]}')
    with pytest.raises(ConfigError, match="no GPU activity"):
        compare(empty, tiny_run)
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    assert analysis_main(["compare-profile", str(broken), str(tiny_run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "broken.json" in err and "not a Chrome trace JSON" in err
    with pytest.raises(ConfigError, match="no ProfilerStep#9"):
        compare(TRACE, tiny_run, steps=[9])
    with pytest.raises(ConfigError, match="not a sim run output"):
        compare(TRACE, tmp_path)


def test_the_simulated_rank_is_the_traces_own_by_default(tiny_run, tmp_path):
    """Kineto's distributedInfo.rank picks the simulated rank (tiny: rank 2 is the second pipeline stage, which
    runs the head, not the embedding); --rank overrides it."""
    import json

    data = json.loads(TRACE.read_text())
    data["distributedInfo"]["rank"] = 2
    ranked = tmp_path / "rank2.json"
    ranked.write_text(json.dumps(data))
    _, two, _ = simulated_step(tiny_run, 2)
    _, zero, _ = simulated_step(tiny_run, 0)
    assert two[OTHER] != zero[OTHER]
    table = compare(ranked, tiny_run).set_index("category")
    assert table.loc[OTHER, "simulated_s"] == pytest.approx(two[OTHER])
    assert compare(ranked, tiny_run, rank=0).set_index("category").loc[OTHER, "simulated_s"] == pytest.approx(
        zero[OTHER])


@pytest.fixture
def compare_trace_plugin(tmp_path, monkeypatch):
    """The ``clustersim.commands`` entry points pyproject.toml declares, visible to importlib.metadata: the
    installed (editable) metadata's own when it has them, else a distribution written here from pyproject.toml
    (an install older than the entry point; ``pip install -e .`` refreshes it)."""
    from importlib.metadata import entry_points

    from conftest import ROOT

    section = (ROOT / "pyproject.toml").read_text().split('[project.entry-points."clustersim.commands"]\n')[1]
    declared = dict(line.replace('"', "").split(" = ") for line in section.split("\n\n")[0].splitlines())
    assert declared == {"compare-trace": "analysis.profile_compare:compare_trace"}
    if "compare-trace" not in entry_points(group="clustersim.commands").names:
        info = tmp_path / "site" / "clustersim_commands-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clustersim-commands\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[clustersim.commands]\n" + "".join(
            f"{name} = {target}\n" for name, target in declared.items()))
        monkeypatch.syspath_prepend(str(info.parent))
    return declared


def test_sim_compare_trace_runs_the_scenario_and_prints_the_per_class_table(compare_trace_plugin, tmp_path, capsys):
    """Issue 26, must-show 4: ``sim compare-trace PROFILER.json SCENARIO`` (sim dispatching to analysis through the
    clustersim.commands entry point) runs the scenario into -o and prints the same table as compare() on that run."""
    run, markdown, chart = tmp_path / "run", tmp_path / "table.md", tmp_path / "chart.png"
    assert main(["compare-trace", str(TRACE), str(SCENARIOS / "tiny.yaml"), "-o", str(run), "--table", str(markdown),
                 "--chart", str(chart), "--steps", "5,6"]) == 0
    printed = capsys.readouterr().out
    assert (run / "summary.json").is_file() and (run / "trace.parquet").is_file()
    table = compare(TRACE, run).set_index("category")
    assert table.loc[GEMM, "measured_s"] == pytest.approx((3250 + 1800) / 2 * US)
    for category in (GEMM, ATTENTION, OTHER, "NCCL all_reduce", "NCCL send", "idle", "step"):
        row = table.loc[category]
        assert f"| {category} | {row['measured_s']:.6f} | {row['simulated_s']:.6f} |" in printed
    rows = [line for line in markdown.read_text().splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(table) and rows == [line for line in printed.splitlines() if line.startswith("|")]
    assert chart.stat().st_size > 0 and f"wrote {chart}" in printed


def test_sim_compare_trace_without_analysis_is_one_line_and_runs_nothing(tmp_path, monkeypatch, capsys):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: importlib.metadata.EntryPoints(()))
    run = tmp_path / "run"
    assert main(["compare-trace", str(TRACE), str(SCENARIOS / "tiny.yaml"), "-o", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: compare-trace: needs clustersim's analysis package, which registers the "
                   "'clustersim.commands' entry point 'compare-trace' (pip install clustersim, or pip install -e . "
                   "in a checkout)")
    assert not run.exists()
