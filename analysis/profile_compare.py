"""A PyTorch profiler trace of the real step held against a simulated step, per kernel class, on one rank.

In: a Chrome trace JSON written by ``torch.profiler`` (Kineto; ``prof.export_chrome_trace`` or
``tensorboard_trace_handler``, plain or .gz) and a ``sim run`` output directory (``trace.parquet``/``.csv``,
``summary.json``, ``scenario.resolved.yaml``). Out: one row per category (GEMM, attention, other compute, each
NCCL collective, memcpy, idle, and the step) with measured and simulated seconds per step on one rank, their
difference and the signed error simulated / measured - 1 (``python -m analysis compare-profile``).

The measured side (the format: pytorch/kineto libkineto/src/output_json.cpp ``ChromeTraceLogger``): ``traceEvents``
holds complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds). GPU work is ``cat`` ``kernel``,
``gpu_memcpy`` or ``gpu_memset``, with ``pid`` the device and ``tid`` the CUDA stream, and ``args.correlation``
naming the ``cuda_runtime`` or ``cuda_driver`` launch (``cudaLaunchKernel``, Triton's ``cuLaunchKernel``, ...) that
issued it; the step is the CPU ``user_annotation`` ``ProfilerStep#N`` that ``profiler.step()`` opens. A GPU activity
belongs to the step whose ProfilerStep contains its launch (its own start when it has no launch event). Per step:
each category's seconds are the sum of its activities' durations (overlapping streams both count, as Holistic Trace
Analysis' kernel breakdown sums them); idle is the step minus the union of all its GPU activity (never below zero);
the step time is the ProfilerStep's duration. The table averages the steps (``steps`` picks some, e.g. skipping a
warm-up step).

Kernel classes, by name (``KERNEL_CLASSES``; first match wins; names as the libraries write them):
- NCCL: ``ncclDevKernel_<Coll>_<RedOp>_<type>_<Algo>_<Proto>`` (current NCCL, src/device/generate.py) and
  ``ncclKernel_<Coll>_...`` (older NCCL, src/collectives/device/), e.g. ncclDevKernel_AllReduce_Sum_bf16_RING_LL;
  the collective from ``<Coll>``: AllReduce, AllGather, ReduceScatter, Broadcast, SendRecv / Send / Recv (point to
  point). NCCL runs all-to-all as grouped send/recv, so a SendRecv kernel is ``send`` unless Kineto's collective
  record on it (``args["Collective name"]``, libkineto kCollectiveName) says all_to_all. Holistic Trace Analysis
  (facebookresearch/HolisticTraceAnalysis hta/utils/utils.py ``get_kernel_type``) classes communication, memory and
  computation the same way: NCCL by name, Memcpy / Memset apart, the rest computation.
- attention: FlashAttention-2's ``flash_fwd_kernel``, ``flash_fwd_splitkv_kernel``, ``flash_bwd_*`` (Dao-AILab
  flash-attention csrc/flash_attn/src; PyTorch's SDPA copy is ``pytorch_flash::flash_fwd_kernel``),
  FlashAttention-3's ``FlashAttnFwdSm90`` / ``FlashAttnBwdSm90`` (hopper/), PyTorch's memory-efficient SDPA
  ``fmha_cutlassF_*`` / ``fmha_cutlassB_*`` (xFormers' CUTLASS kernels), cuDNN's fused SDPA
  ``cudnn_generated_fort_native_sdpa_*`` (also Transformer Engine's fused attention), Triton's tutorial flash
  attention ``_attn_fwd`` / ``_attn_bwd``.
- GEMM: cuBLAS / cuBLASLt kernels ``sm90_xmma_gemm_*``, ``sm80_xmma_gemm_*``, ``ampere_bf16_s16816gemm_*``,
  ``nvjet_*`` (cuBLAS 12.x on Hopper / Blackwell), ``gemv*``, ``splitKreduce_kernel``; CUTLASS tensor-op GEMMs
  (``cutlass_80_tensorop_*gemm*``, ``cutlass::Kernel<... Gemm ...>``); Inductor's Triton matmul templates
  (``triton_tem_fused_*mm*``).
- other compute: every other ``kernel`` (element-wise, norms, softmax outside flash attention, optimizer, ...).
- memcpy: ``gpu_memcpy`` and ``gpu_memset`` activities.

The simulated side: the run's tasks on one rank. Communication streams give each collective's seconds by the
trace's ``op`` column (``send`` for pipeline sends); the offload stream's PCIe copies are memcpy. A compute task
is split into GEMM, attention and other compute by its block's kernels as the run's cost model prices them
(sim.workload.blocks.blocks, sim.costs.models.phase_scale and kernel_time: the GEMMs with weights, the
attention core of sim.model.attention_ops.ATTENTION_CORE, the rest), summed over the rank so a backward split in
two tasks splits as one; compute the model does not break into kernels (the optimizer step, gradient norm) is
other compute. Idle is the step minus the union of the rank's GPU tasks. Unfused attention
(``flash_attention: false``) runs its score and value products as cuBLAS batched GEMMs on a real GPU, which the
measured side then counts as GEMM.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import ConfigError

GEMM, ATTENTION, OTHER, MEMCPY, IDLE, STEP = "GEMM", "attention", "other compute", "memcpy", "idle", "step"
COMPUTE = (GEMM, ATTENTION, OTHER)
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")
CATEGORIES = (*COMPUTE, *(f"NCCL {op}" for op in NCCL_OPS), MEMCPY, IDLE, STEP)

# NCCL's <Coll> in a kernel name -> the simulator's collective (sim.network.collectives.OPS).
NCCL_COLLECTIVES = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                    "Broadcast": "broadcast", "Reduce": "all_reduce", "SendRecv": "send", "Send": "send",
                    "Recv": "send", "AllToAll": "all_to_all"}
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
# (class, pattern), first match wins; the sources are in the module docstring.
KERNEL_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (ATTENTION, re.compile(r"flash_(fwd|bwd)|FlashAttn|fmha|_sdpa_|native_sdpa|_attn_(fwd|bwd)", re.IGNORECASE)),
    (GEMM, re.compile(r"gemm|xmma|nvjet|gemv|splitKreduce|triton_tem_fused_\w*mm", re.IGNORECASE)),
)
# Kineto's categories (libkineto ActivityType toString), lower-cased: PyTorch 1.8-1.9 wrote "Kernel", "Memcpy",
# "Memset", "Runtime". Launches come through the runtime (cudaLaunchKernel) or the driver (cuLaunchKernel:
# Triton's kernels).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "runtime")
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
MAX_TRACE_BYTES = 2 << 30


def kernel_class(name: str, collective: str = "") -> str:
    """The category of a GPU kernel by its name (and Kineto's collective name for NCCL kernels)."""
    if match := NCCL_KERNEL.match(name):
        op = NCCL_COLLECTIVES.get(match[1], "send")
        if op == "send" and re.search(r"all_?to_?all", collective, re.IGNORECASE):
            op = "all_to_all"
        return f"NCCL {op}"
    for category, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return category
    return OTHER


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


# ------------------------------------------------------------------------------------------- measured side


@dataclass(frozen=True)
class MeasuredStep:
    step: int
    seconds: float
    categories: dict[str, float]  # category -> seconds (sum of durations)
    busy: float  # union of the step's GPU activity


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()[:MAX_TRACE_BYTES]
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except (ValueError, EOFError) as error:  # JSONDecodeError, UnicodeDecodeError, a broken gzip stream
        raise ConfigError(f"{path}: not a Chrome trace JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError(f"{path}: no 'traceEvents' list: not a torch.profiler / Kineto trace")
    return data


def trace_rank(data: dict[str, Any]) -> int | None:
    """The rank Kineto recorded for the trace (``distributedInfo.rank``), if any."""
    rank = (data.get("distributedInfo") or {}).get("rank")
    try:
        return int(rank) if rank is not None else None
    except (TypeError, ValueError):
        return None


def measured_steps(path: Path | str, device: int | None = None,
                   data: dict[str, Any] | None = None) -> list[MeasuredStep]:
    """Per ProfilerStep of the trace: its duration and the seconds of each category on ``device`` (default: the
    lowest device with kernels; a trace from one rank has one). ``data``: the trace already loaded."""
    path = Path(path)
    data = data if data is not None else _load(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    steps = []
    launches: dict[int, float] = {}
    gpu: list[dict[str, Any]] = []
    for index, event in enumerate(events):
        cat, name = str(event.get("cat", "")).lower(), str(event.get("name", ""))
        try:
            if cat == "user_annotation" and (match := STEP_NAME.match(name)):
                steps.append((float(event["ts"]), float(event["ts"]) + float(event["dur"]), int(match[1])))
            elif cat in LAUNCH_CATEGORIES and "correlation" in event.get("args", {}):
                launches[int(event["args"]["correlation"])] = float(event["ts"])
            elif cat in GPU_CATEGORIES:
                float(event["ts"]), float(event["dur"]), int(event["pid"])
                gpu.append(event)
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"{path}: traceEvents[{index}] ({cat} {name[:60]!r}): missing or bad {error}") from None
    if not steps:
        raise ConfigError(f"{path}: no ProfilerStep#N annotation: profile with torch.profiler.profile(schedule=...) "
                          "and call prof.step() every iteration")
    if not gpu:
        raise ConfigError(f"{path}: no GPU activity (cat kernel / gpu_memcpy / gpu_memset): a CPU-only profile "
                          "(pass activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])")
    devices = sorted({int(e["pid"]) for e in gpu if str(e["cat"]).lower() == "kernel"} or {int(e["pid"]) for e in gpu})
    if device is None:
        device = devices[0]
    elif device not in devices:
        raise ConfigError(f"--device {device}: the trace has GPU activity on devices {devices}")
    steps.sort()
    per_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in gpu:
        if int(event["pid"]) != device:
            continue
        correlation = event.get("args", {}).get("correlation")
        at = launches.get(int(correlation), float(event["ts"])) if correlation is not None else float(event["ts"])
        for start, end, number in steps:
            if start <= at < end:
                per_step[number].append(event)
                break
    result = []
    for start, end, number in steps:
        categories: dict[str, float] = defaultdict(float)
        intervals = []
        for event in per_step[number]:
            ts, dur = float(event["ts"]) * 1e-6, float(event["dur"]) * 1e-6
            if str(event["cat"]).lower() == "kernel":
                args = event.get("args", {})
                category = kernel_class(str(event["name"]), str(args.get("Collective name", "")))
            else:
                category = MEMCPY
            categories[category] += dur
            intervals.append((ts, ts + dur))
        result.append(MeasuredStep(number, (end - start) * 1e-6, dict(categories), union_seconds(intervals)))
    return result


# ------------------------------------------------------------------------------------------ simulated side


def _compute_shares(run_dir: Path) -> tuple[dict[tuple[str, str], dict[str, float]], Any]:
    """Per (task name, compute phase): the share of GEMM / attention / other compute in its priced kernels."""
    from sim.costs.models import phase_scale
    from sim.model.attention_ops import ATTENTION_CORE
    from sim.plan import resolve
    from sim.spec.scenario import load_scenario
    from sim.workload.blocks import blocks
    from sim.workload.cost_model import make_costs
    from sim.workload.moe_layer import moe_blocks

    scenario = load_scenario(run_dir / "scenario.resolved.yaml")
    plan = resolve(scenario)
    costs = make_costs(plan)
    work = blocks(plan)
    named = {**work.block, "attention_core": work.selective, "embedding": work.embedding, "lm_head": work.head}
    if plan.model.is_moe:
        named.update(moe_blocks(plan))
    kernel_time = getattr(costs, "kernel_time", None)
    shares: dict[tuple[str, str], dict[str, float]] = {}
    for name, block in named.items():
        for phase in ("forward", "backward", "input_grad", "weight_grad"):
            seconds: dict[str, float] = defaultdict(float)
            for op in block.ops:
                # fixed costs price no kernel: FLOPs stand in for time. The phase is the kernel's own: a flash
                # kernel's backward runs at its measured backward rate, not twice its forward's time
                # (RooflineCosts.kernel_time), and an FP8 GEMM's backward accumulates split.
                each = kernel_time(op, phase) if kernel_time else op.executed_flops
                category = GEMM if op.matmul and op.has_weights else ATTENTION if op.name in ATTENTION_CORE else OTHER
                seconds[category] += phase_scale(op, phase) * each  # type: ignore[arg-type]
            total = sum(seconds.values())
            if total > 0:
                shares[(name, phase)] = {category: value / total for category, value in seconds.items()}
    return shares, plan


def simulated_step(run_dir: Path | str, rank: int = 0) -> tuple[float, dict[str, float], float]:
    """(step seconds, category -> seconds, busy union) of ``rank`` in a ``sim run`` output directory."""
    from sim.output.trace import read_trace

    run_dir = Path(run_dir)
    found = [p for p in (run_dir / "trace.parquet", run_dir / "trace.csv") if p.is_file()]
    if not found or not (run_dir / "scenario.resolved.yaml").is_file():
        raise ConfigError(f"run_dir: {str(run_dir)!r} is not a sim run output (trace.parquet or trace.csv and "
                          "scenario.resolved.yaml)")
    trace = read_trace(found[0])
    if rank not in set(trace["rank"]):
        raise ConfigError(f"--rank {rank}: the run traced ranks {sorted(set(trace['rank']))[:8]}...")
    tasks = trace[(trace["rank"] == rank) & (trace["stream"] != "host")]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    step = float(summary.get("step_time_s") or trace["end_s"].max())
    shares, _ = _compute_shares(run_dir)
    categories: dict[str, float] = defaultdict(float)
    tasks = tasks.assign(duration=tasks["end_s"] - tasks["start_s"])
    compute = tasks[tasks["stream"] == "compute"]
    split_weight = set(compute.loc[compute["kind"] == "weight", "name"])
    phase_of = {"forward": "forward", "recompute": "forward", "weight": "weight_grad"}
    for (name, kind), duration in compute.groupby(["name", "kind"])["duration"].sum().items():
        phase = phase_of.get(str(kind), "input_grad" if name in split_weight else "backward")
        for category, share in shares.get((str(name), phase), {OTHER: 1.0}).items():
            categories[category] += float(duration) * share
    comm = tasks[tasks["stream"] != "compute"]
    for (stream, op), duration in comm.groupby(["stream", "op"])["duration"].sum().items():
        categories[MEMCPY if stream == "offload" else f"NCCL {op or 'send'}"] += float(duration)
    busy = union_seconds(zip(tasks["start_s"], tasks["end_s"], strict=True))
    return step, dict(categories), busy


# ------------------------------------------------------------------------------------------------ compare


def compare(profile: Path | str, run_dir: Path | str, rank: int | None = None, device: int | None = None,
            steps: Sequence[int] | None = None) -> pd.DataFrame:
    """The table: category, measured_s, simulated_s (per step on one rank), difference_s (simulated - measured)
    and error (simulated / measured - 1; NaN where nothing was measured). ``rank``: the simulated rank (default:
    the trace's own, from ``distributedInfo``, else 0)."""
    data = _load(Path(profile))
    measured = measured_steps(profile, device, data)
    if rank is None:
        rank = trace_rank(data) or 0
    if steps:
        missing = sorted(set(steps) - {s.step for s in measured})
        if missing:
            raise ConfigError(f"--steps: no ProfilerStep#{missing[0]} in the trace (it has "
                              f"{', '.join(str(s.step) for s in measured)})")
        measured = [s for s in measured if s.step in set(steps)]
    count = len(measured)
    real: dict[str, float] = defaultdict(float)
    for s in measured:
        for category, seconds in s.categories.items():
            real[category] += seconds / count
        real[IDLE] += max(0.0, s.seconds - s.busy) / count
        real[STEP] += s.seconds / count
    step, simulated, busy = simulated_step(run_dir, rank)
    simulated = {**simulated, IDLE: max(0.0, step - busy), STEP: step}
    rows = []
    for category in CATEGORIES:
        m, p = real.get(category, 0.0), simulated.get(category, 0.0)
        if category.startswith("NCCL") and m == 0 and p == 0:
            continue
        rows.append({"category": category, "measured_s": m, "simulated_s": p, "difference_s": p - m,
                     "error": p / m - 1 if m > 0 else float("nan")})
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    lines = [f"{title}\n" if title else "", "| category | measured s/step | simulated s/step | simulated - measured "
             "| error |", "|---|---:|---:|---:|---:|"]
    for r in table.itertuples(index=False):
        error = "" if r.error != r.error else f"{r.error:+.1%}"  # NaN: nothing measured
        lines.append(f"| {r.category} | {r.measured_s:.6f} | {r.simulated_s:.6f} | {r.difference_s:+.6f} | "
                     f"{error} |")
    return "\n".join(line for line in lines if line) + "\n"


def write_chart(table: pd.DataFrame, path: Path | str) -> None:
    """Bars of measured and simulated seconds per category (the step last), on a bare Figure."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 4.5))
    ax = figure.add_subplot()
    y = range(len(table))
    ax.barh([i + 0.2 for i in y], table["measured_s"], height=0.4, label="measured (profiler)", color="#4c72b0")
    ax.barh([i - 0.2 for i in y], table["simulated_s"], height=0.4, label="simulated", color="#dd8452")
    ax.set_yticks(list(y), list(table["category"]))
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step, one rank")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    figure.tight_layout()
    figure.savefig(path)


def compare_trace(profile: Path | str, run_dir: Path | str, *, rank: int | None = None, device: int | None = None,
                  steps: Sequence[int] | None = None, table: Path | str | None = None,
                  chart: Path | str | None = None) -> tuple[str, list[str]]:
    """The comparison as a command gives it (``python -m analysis compare-profile``, and ``sim compare-trace``
    through the ``clustersim.commands`` entry point): (the markdown table, the paths written: ``table``, the
    markdown; ``chart``, the bars)."""
    result = compare(profile, run_dir, rank, device, steps)
    markdown = to_markdown(result, f"measured ({Path(profile).name}) vs simulated ({run_dir}), seconds per step on "
                                   "one rank")
    written = []
    if table:
        Path(table).write_text(markdown)
        written.append(str(table))
    if chart:
        write_chart(result, chart)
        written.append(str(chart))
    return markdown, written
