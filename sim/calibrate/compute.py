"""GEMM and device-copy microbenchmarks.

In: a torch device, dtypes, GEMM shapes (batch, m, n, k) and copy sizes; warm-up and repetition counts. Out:
rows (dicts) per measurement: the median and spread (10th/90th percentile) of the time, the achieved FLOP/s
or bytes/s, and for GEMMs the efficiency against the device's dense peak when it is known. On a GPU each
repetition is timed with CUDA events; on the CPU with the wall clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from sim.model.ops import layer_forward_ops
from sim.model.transformer import ModelSpec

TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def transformer_shapes(model: ModelSpec, tp: int, micro_batch: int, seq_len: int) -> list[tuple[str, tuple[int, ...]]]:
    """The GEMMs one layer runs on one TP rank: each forward (b, m, n, k) and its two backward GEMMs (the input
    gradient (m, k, n) and the weight gradient (k, n, m); for the attention core, the gradients of its two
    operands), deduplicated: the first name that needs a shape keeps it."""
    ops = layer_forward_ops(model, micro_batch, seq_len, tp, False, 2, False)
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


def time_repeated(fn: Callable[[], Any], device: Any, warmup: int, reps: int) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return times


def _spread(times: list[float]) -> dict[str, float]:
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
        stats = _spread(time_repeated(_gemm_call(device, dtype, b, m, n, k, generator), device, warmup, reps))
        flops = 2.0 * b * m * n * k
        rate = flops / stats["median_s"]
        rows.append({"dtype": dtype, "name": name, "b": b, "m": m, "n": n, "k": k, "flops": flops, **stats,
                     "achieved_flops_per_s": rate, "efficiency": rate / peak_flops if peak_flops else None})
    return rows


def bench_copy(device: Any, sizes: Iterable[int], warmup: int, reps: int) -> list[dict[str, Any]]:
    """Device-to-device copy; bytes moved = read + write = 2 x size (the convention of bandwidth tests)."""
    import torch

    rows = []
    for size in sizes:
        src = torch.empty(size, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        stats = _spread(time_repeated(partial(dst.copy_, src), device, warmup, reps))
        rows.append({"bytes": size, **stats, "bandwidth_Bps": 2 * size / stats["median_s"]})
    return rows
