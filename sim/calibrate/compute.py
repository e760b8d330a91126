"""GEMM, attention and device-copy microbenchmarks.

In: a torch device, dtypes, GEMM shapes (batch, m, n, k), attention shapes (heads, sequence length, head dim) and
copy sizes; warm-up and repetition counts. Out: rows (dicts) per measurement: the median and spread (10th/90th
percentile) of the time, the achieved FLOP/s or bytes/s, and for GEMMs the efficiency against the device's dense
peak when it is known. On a GPU each repetition is timed with CUDA events around back-to-back calls (``calls_for``:
enough of them that the group runs about a millisecond), so a small kernel's time is the GPU's, as in a training
step where the CPU runs ahead, not the launch latency of one call against an idle GPU: the first version timed
one call per event pair and measured a 2048^3 bf16 GEMM on an H100 at 368 TFLOP/s, against 636 back to back
(2026-11-26). On the CPU the wall clock, one call per repetition.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from sim.model.flash_tiles import causal_fraction
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.transformer import ModelSpec

TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def transformer_shapes(model: ModelSpec, tp: int, micro_batch: int, seq_len: int) -> list[tuple[str, tuple[int, ...]]]:
    """The GEMMs one layer runs on one TP rank: each forward (b, m, n, k) and its two backward GEMMs (the input
    gradient (m, k, n) and the weight gradient (k, n, m); for the attention core, the gradients of its two
    operands), deduplicated: the first name that needs a shape keeps it."""
    ops = layer_forward_ops(LayerShape(model, micro_batch, seq_len, tp, sequence_parallel=False, elem_bytes=2,
                                       flash_attention=False))
    shapes: dict[tuple[int, ...], str] = {}
    for block in ops.values():
        for op in block:
            if op.shape is None:
                continue
            b, m, n, k = op.shape
            first, second = (".dgrad", ".wgrad") if op.has_weights else (".grad_a", ".grad_b")
            for suffix, shape in (("", (b, m, n, k)), (first, (b, m, k, n)), (second, (b, k, n, m))):
                shapes.setdefault(shape, op.name + suffix)
    return [(name, shape) for shape, name in shapes.items()]


def square_shapes(sizes: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"square{s}", (1, s, s, s)) for s in sizes]


# A timed group of back-to-back calls lasts about this long on a GPU (``calls_for``).
GROUP_SECONDS = 1e-3


def calls_for(seconds: float) -> int:
    """Back-to-back calls per timed group for a kernel of about ``seconds`` (at least 1, at most 100)."""
    return max(1, min(100, int(GROUP_SECONDS / max(seconds, 1e-7))))


def time_repeated(fn: Callable[[], Any], device: Any, warmup: int, reps: int) -> list[float]:
    """Seconds per call, ``reps`` times, after ``warmup`` calls. On a GPU each time is a group of ``calls_for``
    back-to-back calls between two CUDA events divided by their count (the group size set by one timed call)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        calls = calls_for(start.elapsed_time(end) / 1e3)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
    else:
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return times


def spread(times: list[float]) -> dict[str, float]:
    """The median, 10th and 90th percentile of repeated times, and their count."""
    ordered = sorted(times)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_s": statistics.median(ordered), "p10_s": pick(0.1), "p90_s": pick(0.9), "reps": len(ordered)}


def supports_fp8(device: Any) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) or 9.0+ (Hopper, Blackwell)."""
    import torch

    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _gemm_call(device: Any, dtype: str, b: int, m: int, n: int, k: int, generator: Any) -> Callable[[], Any]:
    import torch

    if dtype == "fp8":  # torch._scaled_mm: e4m3 inputs, the second one column-major, bf16 out, unit scales
        a = torch.randn(b * m, k, generator=generator).to(device=device, dtype=torch.float8_e4m3fn)
        w = torch.randn(n, k, generator=generator).to(device=device, dtype=torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    kind = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(b, m, k, generator=generator).to(device=device, dtype=kind)
    w = torch.randn(b, k, n, generator=generator).to(device=device, dtype=kind)
    return lambda: torch.bmm(a, w)


def bench_gemms(device: Any, dtype: str, shapes: list[tuple[str, tuple[int, ...]]], warmup: int, reps: int,
                peak_flops: float | None) -> list[dict[str, Any]]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for name, (b, m, n, k) in shapes:
        if dtype == "fp8" and (m % 16 or n % 16 or k % 16):
            continue  # FP8 GEMMs need dimensions that are multiples of 16
        stats = spread(time_repeated(_gemm_call(device, dtype, b, m, n, k, generator), device, warmup, reps))
        flops = 2.0 * b * m * n * k
        rate = flops / stats["median_s"]
        rows.append({"dtype": dtype, "name": name, "b": b, "m": m, "n": n, "k": k, "flops": flops, **stats,
                     "achieved_flops_per_s": rate, "efficiency": rate / peak_flops if peak_flops else None})
    return rows


def kernel_time_repeated(fn: Callable[[], Any], device: Any, warmup: int, reps: int) -> list[float]:
    """Seconds of GPU kernel time per call, ``reps`` times: the CUDA kernels' durations summed by PyTorch's
    profiler (CUPTI) over ``calls_for`` calls, not the wall time between events. For work driven through autograd,
    whose CPU side (~0.2 ms a call for SDPA's backward) outlasts a small kernel: timed with events, an H200's
    cuDNN backward of 8 heads x 1k tokens read 188 us whatever its size, the CPU's time, not the kernels'."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    calls = calls_for(time.perf_counter() - began)
    times = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize(device)
        microseconds = sum(event.self_device_time_total for event in prof.key_averages())
        times.append(microseconds / 1e6 / calls)
    return times


# Attention kernels per SDPA backend, named as the cost model's ``training.attention_backend``: ``fused`` is
# cuDNN's fused flash attention (what Transformer Engine's FusedAttention runs; PyTorch's CUDNN_ATTENTION),
# ``flash`` FlashAttention-2 (the flash-attn package; PyTorch's FLASH_ATTENTION backend is its kernels), ``math``
# the unfused composition (the only one on a CPU).
ATTENTION_BACKENDS = {"fused": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "math": "MATH"}


def attention_flops(heads: int, seq_len: int, head_dim: int, batch: int = 1) -> float:
    """The forward FLOPs of causal flash attention as the simulator prices them (``Op.executed_flops``: Megatron's
    full-matrix 4 b h s^2 d x ``causal_fraction``, the score tiles on and below the diagonal; 2 b h s^2 d x
    (n+1)/n for n tiles per row). The backward is counted as twice the forward (sim.costs.models.phase_scale),
    whatever the kernel recomputes. The attention curves' axis and rates are in this count, so the op priced at a
    measured shape takes the measured time (counted on exactly 2 b h s^2 d, every price read (n+1)/n too long:
    +12.5% at 1,024 tokens)."""
    return 4.0 * batch * heads * seq_len * seq_len * head_dim * causal_fraction(seq_len)


def bench_attention(device: Any, backends: Iterable[str], shapes: Iterable[tuple[int, int, int]], warmup: int,
                    reps: int) -> list[dict[str, Any]]:
    """Causal self-attention (PyTorch's scaled_dot_product_attention, bf16 on a GPU, fp32 on the CPU), batch 1,
    per backend and (heads, sequence length, head dim): the forward, and the backward as the time of forward +
    backward less the forward's; on a GPU as kernel time (``kernel_time_repeated``). A backend that refuses a shape
    or is missing is left out (no row)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for backend in backends:
        for heads, seq, dim in shapes:
            q, k, v = (torch.randn(1, heads, seq, dim, generator=generator).to(device=device, dtype=kind)
                       .requires_grad_() for _ in range(3))
            grad = torch.randn(1, heads, seq, dim, generator=generator).to(device=device, dtype=kind)

            def forward(q: Any = q, k: Any = k, v: Any = v) -> Any:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def both(q: Any = q, k: Any = k, v: Any = v, grad: Any = grad) -> Any:
                return torch.autograd.grad(forward(q, k, v), (q, k, v), grad)

            timer = kernel_time_repeated if device.type == "cuda" else time_repeated
            try:
                with sdpa_kernel([getattr(SDPBackend, ATTENTION_BACKENDS[backend])]):
                    fwd = spread(timer(forward, device, warmup, reps))
                    total = spread(timer(both, device, warmup, reps))
            except RuntimeError:  # "No available kernel": this backend does not run this shape here
                continue
            flops = attention_flops(heads, seq, dim)
            back = max(total["median_s"] - fwd["median_s"], 1e-9)
            for phase, seconds, counted in (("forward", fwd["median_s"], flops), ("backward", back, 2 * flops)):
                rows.append({"backend": backend, "phase": phase, "heads": heads, "seq_len": seq, "head_dim": dim,
                             "flops": counted, "median_s": seconds, "reps": reps,
                             "achieved_flops_per_s": counted / seconds})
    return rows


def bench_copy(device: Any, sizes: Iterable[int], warmup: int, reps: int) -> list[dict[str, Any]]:
    """Device-to-device copy; bytes moved = read + write = 2 x size (the convention of bandwidth tests)."""
    import torch

    rows = []
    for size in sizes:
        src = torch.empty(size, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        stats = spread(time_repeated(partial(dst.copy_, src), device, warmup, reps))
        rows.append({"bytes": size, **stats, "bandwidth_Bps": 2 * size / stats["median_s"]})
    return rows
