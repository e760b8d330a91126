"""Replay one Megatron-Core MoE transformer layer's eager op sequence on one GPU and measure what the host sync of
its token dispatcher costs: the GPU kernel time of a layer pass, its wall time with and without the sync, and the
CPU time per kernel issued (what ``costs.launch_overhead`` stands for). Needs PyTorch and this checkout on the path
(the timing helpers are ``sim calibrate``'s); ``--tiny`` runs the same sequence on a CPU with small shapes.

In: ``-o FILE`` and the rows to replay (``--rows``, default all of ``ROWS``). Out: FILE, one CSV row per (row,
dispatcher, exchange stand-in, pass, quantity) in the style of ``sim/data/reference/gpu_eager_measurements.csv``
(a source line with torch / CUDA / driver, the device name, the date), and a JSON line per measurement on stdout.

What is replayed (Megatron-LM ``1e05700595``, 2025-05-24, the code of the ModelZoo rows marked main(1e057005); the
ModelZoo's flags: ``--moe-permute-fusion``, ``--moe-grouped-gemm``, ``--enable-experimental``, router in fp32, aux
loss, ``CUDA_DEVICE_MAX_CONNECTIONS=1``), per rank, forward and backward through autograd:

- attention block: RMSNorm, the sequence-parallel all-gather (a copy of the gathered bytes), QKV GEMM, QK
  layernorm, rotary (Transformer Engine's fused kernel: one op per tensor), causal SDPA, output GEMM, the
  reduce-scatter (a sum over the TP shards), residual add;
- router (``router.py`` ``TopKRouter``, ``moe_utils.topk_softmax_with_capacity``, ``switch_load_balancing_loss_func``):
  fp32 gating GEMM, top-k, softmax, the scatters into the routing map and probabilities, the aux loss's softmax and
  sums, ``MoEAuxLossAutoScaler``, the loss tracker's add;
- ``MoEAlltoAllTokenDispatcher`` (``token_dispatcher.py``): ``preprocess`` (token counts, the counts' all-gather
  over the tp x ep group as a copy, the split sums), the device-to-host copies on the side stream at
  ``before_permutation_1``, the fused permute, the **host sync** ``cuda_dtoh_stream.synchronize()`` at
  ``before_ep_alltoall`` (dropless with ep > 1), the all-to-all of tokens and probabilities, the fused
  ``sort_chunks_by_idxs``; and back: sort, all-to-all, fused unpermute;
- ``MoEFlexTokenDispatcher`` with DeepEP (``fused_a2a.py``): the metadata's reshapes, ``torch.topk`` of the probs,
  ``get_dispatch_layout``, the dispatch's notify and **host wait** ("the CPU will wait for GPU's signal to
  arrive"), the dispatch, ``fused_indices_to_multihot``, the fused permute; and back: unpermute, combine;
- ``TEGroupedMLP``: ``tokens_per_expert.tolist()``, fc1 as one GEMM per local expert (Transformer Engine's grouped
  GEMM of that time loops cuBLAS per expert), SwiGLU weighted by the probabilities, fc2 likewise.

What is not: the all-to-all, the all-gather, the reduce-scatter and DeepEP's kernels cannot run on one GPU; each is
a copy of the same bytes (``--exchange copy``) or that copy followed by ``torch.cuda._sleep`` up to the
simulator's predicted exchange time for the row (``--exchange timed``; the seconds in ``ROWS``, from
``Plan.deepep_seconds`` / the analytic all-to-all). Transformer Engine's fused kernels (permute, sort, unpermute,
rotary, RMSNorm) are torch ops with about the same kernel count. Routing is uniform (a fixed top-k pattern), so
every split size is known up front: the variant without the sync uses those sizes, the one with it copies them to
the host and waits, as Megatron does.

Quantities per layer pass (median of ``--reps`` after ``--warmup``), ``--layers`` layers back to back:
``kernel_s`` the GPU kernel time (PyTorch's profiler, summed), ``wall_sync_s`` / ``wall_nosync_s`` the wall time
per layer with and without the sync, ``host_s`` the CPU time issuing one layer pass, ``kernels`` the kernels and
copies it launches, ``host_per_kernel_s`` = host_s / kernels.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the ModelZoo's setting without the 1F1B overlap

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Qwen3-235B-A22B (model_configs/benchmarking/Qwen3-235B-A22B.yaml): hidden 4096, 64 heads, 4 query groups,
# kv_channels 128, 128 experts top-8, moe_ffn_hidden 1536; sequence 4096, micro-batch 1.
QWEN3 = {"hidden": 4096, "heads": 64, "groups": 4, "head_dim": 128, "experts": 128, "topk": 8, "ffn": 1536,
         "seq": 4096}

# The ModelZoo rows (best_practice/qwen3/readme.md, H100 table) as per-rank layouts, with the simulator's exchange
# seconds for one dispatch (``Plan.deepep_seconds`` for flex; the alltoall row's NCCL all-to-all of 134 MB over
# NVLink at the analytic model's rate).
ROWS: dict[str, dict[str, Any]] = {
    "deepep-ep32": {"tp": 2, "ep": 32, "dispatcher": "flex", "exchange_s": 1.050e-3},
    "a2a-pp32": {"tp": 2, "ep": 8, "dispatcher": "alltoall", "exchange_s": 0.40e-3},
    "deepep-tp4": {"tp": 4, "ep": 8, "dispatcher": "flex", "exchange_s": 0.130e-3},
}
TINY = {"hidden": 64, "heads": 8, "groups": 4, "head_dim": 8, "experts": 128, "topk": 8, "ffn": 32, "seq": 128}


class AuxLossAutoScaler(torch.autograd.Function):
    """Megatron's ``MoEAuxLossAutoScaler``: the output is the input; the backward adds the aux loss's gradient."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (aux_loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(aux_loss)


class GroupedLinear(torch.autograd.Function):
    """Transformer Engine's ``GroupedLinear`` of mid-2025 in bf16: one cuBLAS GEMM per local expert, forward
    (``x_e @ w_e``), and in the backward one data-gradient and one weight-gradient GEMM per expert."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, splits: list[int]) -> torch.Tensor:
        out = torch.empty(x.shape[0], weight.shape[2], device=x.device, dtype=x.dtype)
        for xe, we, oe in zip(x.split(splits), weight, out.split(splits), strict=True):
            torch.mm(xe, we, out=oe)
        ctx.save_for_backward(x, weight)
        ctx.splits = splits
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight = ctx.saved_tensors
        dx = torch.empty_like(x)
        dw = torch.empty_like(weight)
        for xe, we, ge, dxe, dwe in zip(x.split(ctx.splits), weight, grad.split(ctx.splits), dx.split(ctx.splits),
                                        dw, strict=True):
            torch.mm(ge, we.t(), out=dxe)
            torch.mm(xe.t(), ge, out=dwe)
        return dx, dw, None


def stand_in(x: torch.Tensor, seconds: float, sleep_cycles_per_s: float, copies: int = 1) -> torch.Tensor:
    """An exchange that cannot run on one GPU: a copy of its bytes (``copies`` times the input's rows: DeepEP's
    dispatch writes a row per (token, expert) pair), then (``--exchange timed``) a device sleep up to the row's
    predicted exchange time."""
    out = x.repeat(copies, 1) if copies > 1 else x.clone()
    if seconds > 0 and out.is_cuda:
        torch.cuda._sleep(int(seconds * sleep_cycles_per_s))
    return out


class MoELayer:
    """One transformer layer with a routed-expert MLP as one rank of the row's layout sees it."""

    def __init__(self, shape: dict[str, int], tp: int, ep: int, dispatcher: str, device: torch.device,
                 exchange_s: float, cycles_per_s: float) -> None:
        h, d = shape["hidden"], shape["head_dim"]
        self.h, self.d, self.tp, self.ep, self.dispatcher = h, d, tp, ep, dispatcher
        self.hq, self.hkv = shape["heads"] // tp, max(1, shape["groups"] // tp)
        self.seq, self.tokens = shape["seq"], shape["seq"] // tp  # sequence parallel: seq / tp tokens per rank
        self.experts, self.topk, self.ffn = shape["experts"], shape["topk"], shape["ffn"]
        self.local = self.experts // ep
        self.exchange_s, self.cycles_per_s = exchange_s, cycles_per_s
        self.device = device
        bf, f32 = torch.bfloat16, torch.float32

        def param(*size: int, dtype: torch.dtype = bf) -> torch.Tensor:
            return (torch.randn(*size, device=device, dtype=f32) * 0.02).to(dtype).requires_grad_()

        self.norm1, self.norm2 = param(h), param(h)
        self.w_qkv = param(h, (self.hq + 2 * self.hkv) * d)
        self.q_norm, self.k_norm = param(d), param(d)
        self.w_proj = param(self.hq * d, h)
        self.w_router = param(self.experts, h, dtype=f32)
        self.fc1 = param(self.local, h, 2 * self.ffn)
        self.fc2 = param(self.local, self.ffn, h)
        self.rope = torch.randn(self.seq, 1, d, device=device, dtype=bf)
        self.tracker = torch.zeros((), device=device, dtype=f32)
        # Uniform routing: token t's j-th expert is (t x topk + j) mod E, so every expert gets tokens x topk / E
        # rows from every rank and every split size is known before the run.
        t = torch.arange(self.tokens, device=device)
        self.top_static = (t[:, None] * self.topk + torch.arange(self.topk, device=device)) % self.experts
        rows = self.tokens * self.topk
        self.per_chunk = rows // self.experts  # rows from one source rank for one local expert
        self.recv_rows = rows  # uniform: a rank receives what it sends
        self.splits = [self.recv_rows // self.local] * self.local
        self.input_splits = [rows // ep] * ep
        # The fused sort_chunks_by_idxs as one gather by a fixed row map (source, expert) -> (expert, source),
        # and its inverse for the way back.
        chunk = torch.arange(rows, device=device).view(ep, self.local, self.per_chunk)
        self.sort_rows = chunk.transpose(0, 1).reshape(-1)
        self.unsort_rows = torch.argsort(self.sort_rows)
        self.chunk_sizes = torch.full((ep * self.local,), self.per_chunk, device=device, dtype=torch.long)
        self.params = [self.norm1, self.norm2, self.w_qkv, self.q_norm, self.k_norm, self.w_proj, self.w_router,
                       self.fc1, self.fc2]
        self.dtoh_stream = torch.cuda.Stream() if device.type == "cuda" else None

    # -- attention block ---------------------------------------------------------------------------------------
    def attention(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x, (self.h,), self.norm1, 1e-6)
        y = torch.cat([y] * self.tp) if self.tp > 1 else y  # sequence-parallel all-gather: the gathered bytes
        q, k, v = (y @ self.w_qkv).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = F.rms_norm(q.view(self.seq, self.hq, self.d), (self.d,), self.q_norm, 1e-6)
        k = F.rms_norm(k.view(self.seq, self.hkv, self.d), (self.d,), self.k_norm, 1e-6)
        q, k = q * self.rope, k * self.rope  # TE's fused rotary: one kernel per tensor
        v = v.view(self.seq, self.hkv, self.d)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
        o = o[0].transpose(0, 1).reshape(self.seq, self.hq * self.d) @ self.w_proj
        o = o.view(self.tp, self.tokens, self.h).sum(0) if self.tp > 1 else o  # reduce-scatter: the shard sum
        return x + o

    # -- router ------------------------------------------------------------------------------------------------
    def router(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = F.linear(y.float(), self.w_router)  # --moe-router-dtype fp32
        scores, top = torch.topk(logits, self.topk, dim=1)
        top = self.top_static + 0 * top  # uniform routing, the op sequence kept
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
        routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
        # switch_load_balancing_loss_func (aux_loss), tokens_per_expert all-reduced over tp x cp (a copy here)
        aux_scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        tokens_per_expert = routing_map.sum(dim=0).clone()
        aux = torch.sum(aux_scores.sum(dim=0) * tokens_per_expert) * (1e-3 * self.experts / self.tokens ** 2)
        routing_probs = AuxLossAutoScaler.apply(routing_probs, aux)
        self.tracker += aux.detach()
        return routing_probs, routing_map, top

    # -- dispatchers -------------------------------------------------------------------------------------------
    def permute(self, tokens: torch.Tensor, pair_probs: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Transformer Engine's fused permute (row map, then the gather): sorted by expert, one row per (token,
        expert) pair; ``pair_probs`` is each pair's probability, ``top`` each token's experts."""
        order = torch.argsort(top.reshape(-1), stable=True)
        token_of = torch.div(order, self.topk, rounding_mode="floor")
        return tokens.index_select(0, token_of), pair_probs.index_select(0, order), token_of

    def dispatch(self, y: torch.Tensor, routing_probs: torch.Tensor, routing_map: torch.Tensor, top: torch.Tensor,
                 sync: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.dispatcher == "alltoall":
            local_counts = routing_map.sum(dim=0).long()
            input_splits = local_counts.reshape(self.ep, self.local).sum(dim=1)
            gathered = torch.cat([local_counts] * self.ep).reshape(self.ep, 1, self.experts).transpose(0, 1)
            global_local = gathered[:, :, : self.local].contiguous()
            per_rank = global_local.sum(dim=2)
            output_splits, output_splits_tp = per_rank[0], per_rank.sum(dim=1)
            tokens_per_local = global_local.sum(dim=(0, 1))
            # dtoh at before_permutation_1 (side stream); permute; sync at before_ep_alltoall
            if self.dtoh_stream is not None:
                self.dtoh_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.dtoh_stream):
                    _ = [c.to("cpu", non_blocking=True)
                         for c in (tokens_per_local, input_splits, output_splits, output_splits_tp)]
            permuted, permuted_probs, token_of = self.permute(y, routing_probs.gather(1, top).reshape(-1), top)
            if sync and self.dtoh_stream is not None:
                self.dtoh_stream.synchronize()
            recv = stand_in(permuted, self.exchange_s, self.cycles_per_s)
            recv_probs = stand_in(permuted_probs, 0.0, self.cycles_per_s)
            torch.cumsum(self.chunk_sizes, 0)  # fused sort_chunks_by_idxs: its row map, then the gather
            return recv.index_select(0, self.sort_rows), recv_probs.index_select(0, self.sort_rows), token_of
        # flex (DeepEP): _initialize_metadata, setup_metadata's topk, get_dispatch_layout, dispatch (notify, the
        # host waits for the received counts, the dispatch kernel), fused_indices_to_multihot, fused permute
        rmap = routing_map.reshape(self.tokens, self.ep, 1, self.local).contiguous()
        rprobs = routing_probs.reshape(self.tokens, self.ep, 1, self.local).contiguous()
        token_probs, token_indices = torch.topk(rprobs.view(self.tokens, -1), self.topk, dim=-1)
        token_indices = self.top_static + 0 * token_indices
        layout = rmap.view(self.tokens, self.ep, self.local).any(dim=2).sum(dim=0)  # get_dispatch_layout
        notify = layout + 0  # notify_dispatch: the counts the host waits for
        if self.dtoh_stream is not None:
            counts = notify.to("cpu", non_blocking=True)
            if sync:
                torch.cuda.current_stream().synchronize()  # DeepEP's busy wait on the mapped counter
            del counts
        recv = stand_in(y, self.exchange_s, self.cycles_per_s, copies=self.topk)
        recv_probs = token_probs.reshape(-1).clone()
        multihot = torch.zeros(self.recv_rows, self.local, device=y.device).scatter(
            1, (token_indices.reshape(-1, 1) % self.local), 1.0)  # fused_indices_to_multihot
        del multihot
        permuted, permuted_probs, token_of = self.permute(recv, recv_probs, (token_indices // self.ep) % self.local)
        return permuted, permuted_probs, token_of

    def combine(self, out: torch.Tensor, token_of: torch.Tensor) -> torch.Tensor:
        if self.dispatcher == "alltoall":
            out = out.index_select(0, self.unsort_rows)  # sort_chunks back
            out = stand_in(out, self.exchange_s, self.cycles_per_s)
            return torch.zeros(self.tokens, self.h, device=out.device, dtype=out.dtype).index_add(0, token_of, out)
        out = torch.zeros(self.recv_rows, self.h, device=out.device, dtype=out.dtype).index_add(
            0, torch.arange(self.recv_rows, device=out.device), out)  # fused unpermute
        # DeepEP combine: the reduction over a token's copies, then the exchange's time
        return stand_in(out.view(self.topk, self.tokens, self.h).sum(0), self.exchange_s, self.cycles_per_s)

    def experts_mlp(self, tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        splits = torch.tensor(self.splits).tolist()  # tokens_per_expert.tolist(): on the host already
        act = GroupedLinear.apply(tokens, self.fc1, splits)
        gate, up = act.chunk(2, dim=-1)
        act = F.silu(gate) * up * probs.unsqueeze(-1).to(up.dtype)  # weighted SwiGLU (probs on the experts)
        return GroupedLinear.apply(act, self.fc2, splits)

    def forward(self, x: torch.Tensor, sync: bool) -> torch.Tensor:
        x = self.attention(x)
        y = F.rms_norm(x, (self.h,), self.norm2, 1e-6)
        routing_probs, routing_map, top = self.router(y)
        tokens, probs, token_of = self.dispatch(y, routing_probs, routing_map, top, sync)
        return x + self.combine(self.experts_mlp(tokens, probs), token_of)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_layers(layer: MoELayer, x: torch.Tensor, layers: int, sync: bool) -> dict[str, float]:
    """Forward ``layers`` layers back to back, then their backward; wall time per layer of each, and the host's
    time issuing each (the backward's host time is the autograd engine's, returned when it has queued the
    last kernel)."""
    device = x.device
    for tensor in layer.params + [x]:
        tensor.grad = None
    synchronize(device)
    began = time.perf_counter()
    h = x
    for _ in range(layers):
        h = layer.forward(h, sync)
    issued = time.perf_counter()
    synchronize(device)
    forward_end = time.perf_counter()
    h.backward(torch.ones_like(h))
    backward_issued = time.perf_counter()
    synchronize(device)
    ended = time.perf_counter()
    return {"forward_wall": (forward_end - began) / layers, "backward_wall": (ended - forward_end) / layers,
            "forward_host": (issued - began) / layers, "backward_host": (backward_issued - forward_end) / layers}


def kernel_profile(fn: Callable[[], Any], device: torch.device) -> tuple[float, int]:
    """GPU kernel seconds and the number of kernels and copies ``fn`` runs (PyTorch's profiler; CUDA only)."""
    if device.type != "cuda":
        return 0.0, 0
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    seconds, count = 0.0, 0
    for event in prof.key_averages():
        # torch.cuda._sleep's spin kernel is the stand-in's padding, not a kernel Megatron runs (the 2026-11-26 rows
        # were taken before this filter named "spin": their timed forward counts it, 2 x exchange_s)
        if event.self_device_time_total > 0 and not any(word in event.key.lower() for word in ("sleep", "spin")):
            seconds += event.self_device_time_total / 1e6
            count += event.count
    return seconds, count


def cycles_per_second(device: torch.device) -> float:
    """``torch.cuda._sleep`` spins for clock cycles: calibrate cycles per second on this GPU."""
    if device.type != "cuda":
        return 0.0
    cycles = 10_000_000
    torch.cuda._sleep(cycles)
    synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def cpu_model() -> str:
    """The host CPU's model name (the host's speed is what is measured)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def source_line(device: torch.device) -> tuple[str, str]:
    today = datetime.date.today().isoformat()
    if device.type != "cuda":
        return (f"scripts/measure_moe_host_overhead.py --tiny (clustersim {today}): torch {torch.__version__}, "
                f"host {cpu_model()}"), "cpu"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        driver = "unknown"
    return (f"scripts/measure_moe_host_overhead.py (clustersim {today}): torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}, driver {driver}, host {cpu_model()}; kernel time summed by PyTorch's profiler, "
            f"wall and host time by time.perf_counter"), torch.cuda.get_device_name(device)


def measure_row(row_name: str, row: dict[str, Any], exchange: str, shape: dict[str, int], device: torch.device,
                cycles: float, args: argparse.Namespace, source: str, name: str) -> list[dict[str, Any]]:
    """The quantities of one replayed row with one exchange stand-in, forward and backward, as CSV records."""
    today = datetime.date.today().isoformat()
    seconds = row["exchange_s"] if exchange == "timed" else 0.0
    layer = MoELayer(shape, row["tp"], row["ep"], row["dispatcher"], device, seconds, cycles)
    x = torch.randn(layer.tokens, layer.h, device=device, dtype=torch.bfloat16, requires_grad=True)
    results: dict[str, list[float]] = {}
    for sync in (True, False):
        for _ in range(args.warmup):
            run_layers(layer, x, args.layers, sync)
        for _ in range(args.reps):
            for key, value in run_layers(layer, x, args.layers, sync).items():
                results.setdefault(f"{key}_{'sync' if sync else 'nosync'}", []).append(value)
    med = {key: statistics.median(values) for key, values in results.items()}
    fwd_kernel, fwd_count = kernel_profile(lambda: layer.forward(x, False), device)
    grad = torch.ones(layer.tokens, layer.h, device=device, dtype=torch.bfloat16)
    both_kernel, both_count = kernel_profile(lambda: layer.forward(x, False).backward(grad), device)
    if args.trace is not None and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        run_layers(layer, x, 2, True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_layers(layer, x, 2, True)
        args.trace.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(args.trace / f"{row_name}-{exchange}.json"))
    records = []
    for pass_name, kernel, count in (("forward", fwd_kernel, fwd_count),
                                     ("backward", both_kernel - fwd_kernel, both_count - fwd_count)):
        host = med[f"{pass_name}_host_nosync"]
        quantities = {
            "kernel_s": kernel, "kernels": count,
            "wall_sync_s": med[f"{pass_name}_wall_sync"], "wall_nosync_s": med[f"{pass_name}_wall_nosync"],
            "host_s": host, "host_per_kernel_s": host / count if count else 0.0,
            "exposed_sync_s": med[f"{pass_name}_wall_sync"] - med[f"{pass_name}_wall_nosync"],
        }
        for quantity, value in quantities.items():
            record = {"source": source, "device": name, "date": today, "row": row_name,
                      "dispatcher": row["dispatcher"], "exchange": exchange, "exchange_s": seconds,
                      "tp": row["tp"], "ep": row["ep"], "tokens": layer.tokens, "local_experts": layer.local,
                      "pass": pass_name, "quantity": quantity, "median": value}
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "source"}), flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--exchange", default="copy,timed", help="copy, timed or both (comma-separated)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=None,
                        help="folder for a Chrome trace (CPU ops and kernels) of two synced layer passes per row")
    parser.add_argument("--tiny", action="store_true", help="small shapes on the CPU (a test of the script)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    shape = TINY if device.type == "cpu" else QWEN3
    torch.manual_seed(0)
    source, name = source_line(device)
    cycles = cycles_per_second(device)
    out_rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for row_name in args.rows.split(","):
        row = ROWS[row_name]
        for exchange in args.exchange.split(","):
            out_rows += measure_row(row_name, row, exchange, shape, device, cycles, args, source, name)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            write(args.output, out_rows)
            print(f"# {row_name} {exchange}: {time.perf_counter() - started:.1f} s", flush=True)


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows so far (written after each replayed row, so a cut-off run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
