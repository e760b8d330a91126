"""Collective microbenchmarks through ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).

In: an initialized process group (this process's rank and the world size), the device, the collectives and
a log-spaced list of sizes (bytes, nccl-tests convention: the gathered size for all-gather/reduce-scatter, the
per-rank buffer for all-to-all). Out (on every rank; rank 0's are kept): rows with the op, group size, bytes,
the median and spread of the time over repetitions (each repetition starts after a barrier and is timed to
the slowest rank, as nccl-tests reports), algbw = bytes / time and busbw = algbw x the nccl-tests factor.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from sim.collectives import algbw, busbw

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")


def _operation(op: str, nbytes: int, device: Any) -> Callable[[], Any]:
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    elements = max(world, nbytes // 4 // world * world)  # float32, divisible by the world size
    full = torch.ones(elements, dtype=torch.float32, device=device)
    shard = torch.ones(elements // world, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    # torch >= 2.13 names these *_single; the *_tensor names are deprecated there.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_gather":
        return lambda: gather(full, shard)
    if op == "reduce_scatter":
        return lambda: scatter(shard, full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, 0)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if op == "send":  # ranks 0 -> 1; the others idle
        if rank == 0:
            return lambda: dist.send(full, 1)
        if rank == 1:
            return lambda: dist.recv(full, 0)
        return lambda: None
    raise ValueError(f"unknown collective {op!r}")


def _timed(fn: Callable[[], Any], device: Any) -> float:
    import torch
    import torch.distributed as dist

    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends when its slowest rank does
    return float(elapsed.item())


def bench_collectives(device: Any, ops: tuple[str, ...], sizes: list[int], warmup: int,
                      reps: int) -> list[dict[str, Any]]:
    import torch.distributed as dist

    world = dist.get_world_size()
    rows = []
    for op in ops:
        for size in sizes:
            fn = _operation(op, size, device)
            nbytes = (max(world, size // 4 // world * world)) * 4
            for _ in range(warmup):
                _timed(fn, device)
            times = sorted(_timed(fn, device) for _ in range(reps))
            median = times[len(times) // 2]
            group = 2 if op == "send" else world
            rows.append({"op": op, "n": group, "bytes": nbytes, "median_s": median, "p10_s": times[len(times) // 10],
                         "p90_s": times[min(len(times) - 1, 9 * len(times) // 10)],
                         "algbw_Bps": algbw(nbytes, median), "busbw_Bps": busbw(op, nbytes, median, group)})
    return rows
