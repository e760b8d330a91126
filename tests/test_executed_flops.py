"""The FLOPs a task is priced on are the FLOPs the trace counts (``Op.executed_flops``): HFU never above 1.

The fuzz suite found, from a fresh clone, Llama 3 70B LoRA on one H100 at 509,712 tokens reporting HFU 1.00008
(1.00000016 without LoRA): a causal flash kernel's time was priced on the tiles it executes (about half
the s x s matrix, ``sim.model.flash_tiles.causal_fraction``) while the trace counted Megatron's full matrix, so
its attention tasks ran at 109-110% of the GPU's dense peak. Now both are the executed tiles; MFU keeps Megatron's
count.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import sim
from sim.costs.models import RooflineCosts, phase_scale
from sim.costs.profile import default_for
from sim.errors import ConfigError
from sim.model.flash_tiles import FLASH_TILE, causal_fraction
from sim.plan import resolve
from sim.runner import RunResult
from sim.workload.blocks import blocks
from sim.workload.cost_model import make_costs

# The fuzz suite's case (tests/test_fuzz.py, issue text): one H100, Llama 3 70B, LoRA r = 16 on every projection.
REPRODUCER: dict[str, Any] = {
    "name": "hfu-509712", "seed": 0,
    "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 1},
    "model": "llama3-70b",
    "training": {"method": "lora", "lora": {"r": 16, "lora_alpha": 32}, "global_batch": 16, "micro_batch": 1,
                 "seq_len": 509_712, "dtype": "bf16", "grad_dtype": "bf16", "recompute": "full",
                 "flash_attention": True, "fused_kernels": False},
    "costs": "roofline", "network": "analytic",
}


def variant(seq_len: int, layers: int | None = None, **training: Any) -> dict[str, Any]:
    """The reproducer at ``seq_len`` tokens, ``training`` keys replaced (None removes one), two micro-batches,
    optionally ``layers`` of the model only (the kernels of a layer do not depend on how many there are)."""
    data = copy.deepcopy(REPRODUCER)
    data["training"].update(seq_len=seq_len, global_batch=2)
    for key, value in training.items():
        if value is None:
            data["training"].pop(key, None)
        else:
            data["training"][key] = value
    if layers is not None:
        data["model"] = {"preset": "llama3-70b", "num_layers": layers}
    return data


FULL = {"method": "full", "lora": None}
CASES = {
    "reproducer": REPRODUCER,
    "lora-selective": variant(509_712, 4, recompute="selective"),
    "lora-none": variant(509_712, 4, recompute="none"),
    "full-full": variant(509_712, 4, **FULL),
    "full-none": variant(262_144, 4, recompute="none", **FULL),
    "full-selective-fused": variant(131_072, 4, recompute="selective", fused_kernels=True, **FULL),
    "full-none-not-causal": variant(509_712, 4, recompute="none", causal_attention=False, **FULL),
    "lora-full-not-causal": variant(262_144, 4, causal_attention=False),
    "full-none-unfused-attention": variant(65_536, 4, recompute="none", flash_attention=False, **FULL),
    "packed-documents": variant(262_144, 4, recompute="none",
                                sequence={"packing": True, "lengths": "uniform", "min_len": 1000}, **FULL),
}


def _context_parallel() -> dict[str, Any]:
    data = variant(262_144, 4, **FULL)  # cp 2: each rank's ring steps execute their causal shares
    data["cluster"]["gpus_per_node"] = 2
    data["parallel"] = {"cp": 2}
    return data


def _sliding_window() -> dict[str, Any]:
    data = variant(131_072, recompute="none", **FULL)  # GPT-OSS: a 128-token window on every second layer
    data["model"] = {"preset": "gpt-oss-120b", "num_layers": 4}
    return data


CASES["context-parallel"] = _context_parallel()
CASES["sliding-window"] = _sliding_window()


def _peak(run: RunResult) -> float:
    return run.scenario.cluster.gpu.peak(resolve(run.scenario).dtype)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request: pytest.FixtureRequest) -> RunResult:
    return sim.run(CASES[request.param])


def test_no_task_counts_more_flops_than_the_peak_runs_in_its_time(run: RunResult) -> None:
    trace = run.trace[run.trace["flops"] > 0]
    rate = trace["flops"] / (trace["end_s"] - trace["start_s"]) / _peak(run)
    assert len(trace) > 0 and rate.max() <= 1, rate.groupby([trace["kind"], trace["name"]]).max().to_dict()
    # Before the fix: the reproducer's attention tasks 1.093 (forward, recompute) and 1.102 (backward).
    summary = run.summary
    assert 0 < summary.hfu <= 1
    if run.scenario.model.window_size is None:  # mfu_causal counts a window's layers over every causal pair
        model = summary.mfu if summary.mfu_causal is None else summary.mfu_causal
        assert model <= summary.hfu * (1 + 1e-12)  # model FLOPs as a causal kernel runs them <= executed


def test_mfu_may_pass_1_where_hfu_does_not() -> None:
    """Megatron's MFU counts the full s x s matrix on every layer, sliding-window ones too (sim.model.flops
    model_flops_per_step), so at long context it passes 1 while the kernels run below the peak: the runner's
    physical check reads HFU (sim.runner.check_physical), which refused this scenario as 'MFU 1.1 is above 1
    (a simulator bug)' before. On an A100, whose profile prices attention on the GEMM curve (the H100's measured
    attention curves run it far slower: MFU 0.67 there)."""
    data = _sliding_window()
    data["cluster"]["gpu"] = "A100-80GB-SXM"
    summary = sim.run(data).summary
    assert summary.mfu == pytest.approx(1.5046, abs=1e-4)
    assert summary.hfu == pytest.approx(0.6052, abs=1e-4)


def test_the_reproducers_figures() -> None:
    """HFU was 1.00008 (the full matrix counted, the step 47,521.5 s with attention on the GEMM curve); counting the
    executed tiles it was 0.536. Since attention runs at FlashAttention-2's measured rate (eager PyTorch: fused
    kernels off; docs/mechanisms/attention_kernels.md) and eager RMSNorm at its measured 52 bytes per element, the
    step is 109,115 s (the attention curves counted in executed tiles, H100 factor 1.35), and MFU (Megatron's
    full-matrix count) stays above HFU."""
    summary = sim.run(REPRODUCER).summary
    assert summary.step_time_s == pytest.approx(109114.855, rel=1e-6)
    assert summary.mfu == pytest.approx(0.32404, abs=1e-5)
    assert summary.hfu == pytest.approx(0.23365, abs=1e-5)
    assert summary.mfu_causal is not None and summary.mfu_causal < summary.hfu < summary.mfu


@pytest.mark.parametrize("causal", [True, False])
def test_attention_flops_counted_and_priced_are_the_closed_form(causal: bool) -> None:
    """The attention block's counted FLOPs (a trace task's ``flops``) are its GEMMs' plus the flash kernel's
    executed tiles, in closed form: 4 b heads s^2 d (Megatron's full matrix) x (n + 1) / 2n, n = ceil(s / 128)
    (FlashAttention-2 Sec. 3.1.1: the tiles on and below the diagonal), or x 1 without a causal mask; the
    kernel's priced time is those FLOPs at the rate of the GPU's measured attention curve for them (the H100's
    FlashAttention-2 curve here: fused kernels off). Forward, recompute and backward (2x)."""
    s = 509_712
    data = variant(s, 2, recompute="full", causal_attention=causal)
    plan = resolve(sim.load_scenario(data))
    m = plan.model
    heads, d = m.num_attention_heads, m.head_dim
    n = -(-s // FLASH_TILE)
    assert n == 3983 and causal_fraction(s) == (n + 1) / (2 * n)
    executed = 4 * 1 * heads * s * s * d * ((n + 1) / (2 * n) if causal else 1.0)
    attention = blocks(plan).block["attention"]
    flash = next(op for op in attention.ops if op.name == "flash_attention")
    assert flash.flops == 4 * heads * s * s * d  # the unit: Megatron's full-matrix count (MFU)
    assert flash.executed_flops == pytest.approx(executed, rel=1e-12)
    others = sum(op.flops for op in attention.ops if op is not flash)
    assert attention.flops("forward") == pytest.approx(others + executed, rel=1e-12)

    costs = make_costs(plan)
    assert isinstance(costs, RooflineCosts)
    assert costs.attention is not None  # the H100 profile's FlashAttention-2 curves
    priced = executed / (costs.attention.rate("forward", executed) * costs.scale) * costs.factor
    assert flash.bytes / costs.bytes_rate < priced  # compute-bound at this length: the FLOPs set the time
    assert costs.kernel_time(flash) == pytest.approx(priced, rel=1e-12)

    trace = sim.run(data).trace
    rows = trace[(trace["name"] == "attention") & (trace["layer"] == 0) & (trace["microbatch"] == 0)]
    by_kind = dict(zip(rows["kind"], rows["flops"], strict=True))
    assert by_kind["forward"] == pytest.approx(attention.flops("forward"), rel=1e-12)
    assert by_kind["recompute"] == by_kind["forward"]
    assert by_kind["backward"] == pytest.approx(attention.flops("backward"), rel=1e-12)
    # The backward's flash part is twice the forward's executed tiles (no weights: Qi et al. ICLR 2024 Table 1).
    others_backward = sum(op.flops * phase_scale(op, "backward") for op in attention.ops if op is not flash)
    assert by_kind["backward"] - others_backward == pytest.approx(2 * executed, rel=1e-9)


def test_a_scenario_that_makes_kernels_faster_than_the_peak_is_refused_naming_the_field() -> None:
    """HFU above 1 names what asked for it: here an end-to-end factor of 0.3 against the H100's fitted one (1.35:
    every kernel 4.5x faster than its calibrated time), never a result past the peak."""
    data = variant(509_712, 4)
    calibrated = sim.run(data).summary.hfu
    data["costs"] = {"model": "roofline", "end_to_end_factor": 0.3}
    with pytest.raises(ConfigError, match=r"^costs\.end_to_end_factor: 0\.3 runs the kernels at HFU (\S+), above "
                                          r"the GPU's dense peak \(HFU must be at most 1\)$") as error:
        sim.run(data)
    hfu = float(str(error.value).split("HFU ")[1].split(",")[0])
    fitted = default_for("H100-SXM").end_to_end_factor
    assert hfu == pytest.approx(calibrated * fitted / 0.3, rel=0.01)  # 3 significant digits in the message
    data["costs"]["end_to_end_factor"] = 0.9  # faster than the fit, still below the peak: a result
    assert sim.run(data).summary.hfu == pytest.approx(calibrated * fitted / 0.9, rel=1e-3)
