"""Collective microbenchmarks through ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).

In: an initialized process group (this process's rank and the world size), the device, the collectives and
a log-spaced list of sizes (bytes, nccl-tests convention: the gathered size for all-gather/reduce-scatter, the
per-rank buffer for all-to-all). Out (on every rank; rank 0's are kept): rows with the op, group size, bytes,
the median and spread of the time over repetitions (each repetition starts after a barrier and is timed to
the slowest rank, as nccl-tests reports), algbw = bytes / time and busbw = algbw x the nccl-tests factor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sim.network.collectives import algbw, busbw

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")


def buffer_elements(nbytes: int, world: int) -> int:
    """float32 elements of a buffer of about ``nbytes``, divisible by the group size (at least one per rank)."""
    return max(world, nbytes // 4 // world * world)


def _operation(op: str, nbytes: int, device: Any, group: Any = None) -> Callable[[], Any]:
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    elements = buffer_elements(nbytes, world)
    full = torch.ones(elements, dtype=torch.float32, device=device)
    shard = torch.ones(elements // world, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    # torch >= 2.13 names these *_single; the *_tensor names are deprecated there.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_gather":
        return lambda: gather(full, shard, group=group)
    if op == "reduce_scatter":
        return lambda: scatter(shard, full, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(full, dist.get_global_rank(group, 0) if group else 0, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if op == "send":  # ranks 0 -> 1; the others idle
        if rank == 0:
            return lambda: dist.send(full, dist.get_global_rank(group, 1) if group else 1, group=group)
        if rank == 1:
            return lambda: dist.recv(full, dist.get_global_rank(group, 0) if group else 0, group=group)
        return lambda: None
    raise ValueError(f"unknown collective {op!r}")


def _timed(fn: Callable[[], Any], device: Any, group: Any = None) -> float:
    import torch
    import torch.distributed as dist

    dist.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    if device.type == "cuda":
        elapsed = elapsed.to(device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the collective ends when its slowest rank does
    return float(elapsed.item())


def bench_collectives(device: Any, ops: tuple[str, ...], sizes: list[int], warmup: int,
                      reps: int, group: Any = None) -> list[dict[str, Any]]:
    """Every op at every size on ``group`` (default: the whole world); the caller's ranks all call this."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rows = []
    for op in ops:
        for size in sizes:
            fn = _operation(op, size, device, group)
            nbytes = buffer_elements(size, world) * 4
            for _ in range(warmup):
                _timed(fn, device, group)
            times = sorted(_timed(fn, device, group) for _ in range(reps))
            median = times[len(times) // 2]
            members = 2 if op == "send" else world
            rows.append({"op": op, "n": members, "bytes": nbytes, "median_s": median, "p10_s": times[len(times) // 10],
                         "p90_s": times[min(len(times) - 1, 9 * len(times) // 10)],
                         "algbw_Bps": algbw(nbytes, median), "busbw_Bps": busbw(op, nbytes, median, members)})
    return rows
