"""Time the kernels clustersim prices on a real GPU: bf16 and FP8 GEMMs (fast and split accumulation), grouped
GEMMs, causal flash attention, eager element-wise ops and one eager Llama layer. Needs a CUDA GPU, PyTorch and this
checkout on the path (the timing is ``sim calibrate``'s).

In: ``-o DIR``. Out: ``DIR/kernels.csv``, one row per measurement (kind, name, shape fields, dtype, backend,
median/p10/p90 seconds over ``--reps`` timed groups, FLOPs), and ``DIR/device.json`` (torch, CUDA, device name,
clocks). The rows the shipped data keeps are copied by hand, with the date and device, into
``sim/data/reference/gpu_gemm_measurements.csv`` and ``gpu_eager_measurements.csv``.

Timing: ``sim.calibrate.compute.time_repeated`` (CUDA events around back-to-back calls lasting about a
millisecond, after ``--warmup`` calls; the median of ``--reps`` groups), and for the eager ops, whose autograd CPU
side can outlast their kernels, ``kernel_time_repeated`` (the kernels' own time by PyTorch's profiler). The
2026-11-26 GEMM rows were taken by an earlier copy of this script with groups of 10 calls (fewer above 2e12 FLOPs)
instead. Random normal inputs (tensor cores draw more power on random data than on zeros: the measurement should
be the one training sees).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sim.calibrate.compute import kernel_time_repeated, spread, time_repeated

ROWS: list[dict[str, Any]] = []


def timed(fn: Callable[[], Any], args: argparse.Namespace) -> dict[str, float]:
    """Seconds per call of ``fn`` on the GPU, back to back (``sim calibrate``'s timing)."""
    return spread(time_repeated(fn, torch.device("cuda"), args.warmup, args.reps))


def record(kind: str, name: str, flops: float, stats: dict[str, float], **fields: Any) -> None:
    row = {"kind": kind, "name": name, **fields, "flops": flops, **stats,
           "tflops": flops / stats["median_s"] / 1e12 if flops else None}
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def gemm_inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16))


def bench_gemm(name: str, m: int, n: int, k: int, args: argparse.Namespace) -> None:
    """out[m, n] = a[m, k] @ w[n, k]^T in bf16, and in FP8 e4m3 (torch._scaled_mm, per-tensor scales, bf16 out)
    with fast and with split (FP32-promoted) accumulation."""
    a, w = gemm_inputs(m, n, k)
    flops = 2.0 * m * n * k
    record("gemm", name, flops, timed(lambda: a @ w.t(), args),
           m=m, n=n, k=k, dtype="bf16", backend="cublas")
    if m % 16 or n % 16 or k % 16:
        return
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    for fast in (True, False):
        def fn(fast: bool = fast) -> torch.Tensor:
            return torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)

        record("gemm", name, flops, timed(fn, args), m=m, n=n, k=k,
               dtype="fp8", backend="cublas_fast_accum" if fast else "cublas_split_accum")


def bench_grouped(name: str, experts: int, tokens: int, hidden: int, ffn: int, args: argparse.Namespace) -> None:
    """One MoE layer's first expert GEMM over ``tokens`` routed rows split evenly over ``experts``: the grouped
    kernel (torch._grouped_mm) against a loop of per-expert GEMMs."""
    per = tokens // experts
    a = torch.randn(per * experts, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, hidden, ffn, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * per * experts * hidden * ffn
    fields = {"m": per, "n": ffn, "k": hidden, "groups": experts, "dtype": "bf16"}
    chunks = a.split(per)
    loop = timed(lambda: [c @ w[i] for i, c in enumerate(chunks)], args)
    record("grouped_gemm", name, flops, loop, backend="loop", **fields)
    offs = torch.arange(per, per * experts + 1, per, device="cuda", dtype=torch.int32)
    try:
        grouped = timed(lambda: torch._grouped_mm(a, w, offs=offs), args)
        record("grouped_gemm", name, flops, grouped, backend="torch_grouped_mm", **fields)
    except (RuntimeError, AttributeError, TypeError) as error:
        print(f"grouped_mm: {error}"[:300], flush=True)


def bench_attention(seq: int, heads: int, head_dim: int, batch: int, args: argparse.Namespace) -> None:
    """Causal self-attention, forward and forward+backward, per SDPA backend. FLOPs counted as the causal half
    of full attention: forward 2 x 2 b h s^2 d / 2, backward 2.5 x that (FlashAttention's convention)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fwd_flops = 4.0 * batch * heads * seq * seq * head_dim / 2
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                fields = {"m": seq, "n": heads, "k": head_dim, "groups": batch, "dtype": "bf16",
                          "backend": backend.name.lower()}
                def fwd() -> torch.Tensor:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                record("attention_fwd", f"causal_s{seq}", fwd_flops, timed(fwd, args), **fields)
                out = fwd()

                def both() -> None:
                    torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad)
                record("attention_fwd_bwd", f"causal_s{seq}", 3.5 * fwd_flops, timed(both, args),
                       **fields)
                del out
        except RuntimeError as error:
            print(f"{backend}: {error}"[:300], flush=True)


class EagerLlamaLayer(torch.nn.Module):
    """A Llama layer as plain PyTorch runs it (no fusion beyond SDPA): RMSNorm, QKV, causal GQA attention, output
    projection, residual, RMSNorm, SwiGLU MLP, residual. Rotary embeddings left out (elementwise, small)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.gate_up = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                                 self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def bench_layer(name: str, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, batch: int,
                args: argparse.Namespace) -> None:
    layer = EagerLlamaLayer(hidden, heads, kv_heads, ffn).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    fields = {"m": batch * seq, "n": hidden, "k": ffn, "groups": heads, "dtype": "bf16", "backend": "eager"}
    with torch.no_grad():
        record("layer_fwd", name, 0.0, timed(lambda: layer(x), args), **fields)
    record("layer_fwd_bwd", name, 0.0, timed(lambda: layer(x).backward(grad), args), **fields)


def kernel_seconds(fn: Callable[[], Any], args: argparse.Namespace) -> dict[str, float]:
    """Seconds of GPU kernels per call of ``fn`` (the profiler's sum: autograd's CPU side is not counted)."""
    return spread(kernel_time_repeated(fn, torch.device("cuda"), args.warmup, args.reps))


def bench_eager(tokens: int, hidden: int, heads: int, kv_heads: int, ffn: int, args: argparse.Namespace) -> None:
    """A Hugging Face Llama's unfused element-wise ops (LlamaRMSNorm, apply_rotary_pos_emb, SwiGLU, residual add)
    and PyTorch's own RMSNorm, forward and forward + backward, as kernel time."""
    dim = hidden // heads
    bf16 = torch.bfloat16

    def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        return w * (x32 * torch.rsqrt(variance + 1e-5)).to(bf16)

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

    cos = torch.randn(1, 1, tokens, dim, device="cuda", dtype=bf16)
    sin = torch.randn(1, 1, tokens, dim, device="cuda", dtype=bf16)

    def hf_rope(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    x = torch.randn(tokens, hidden, device="cuda", dtype=bf16, requires_grad=True)
    y = torch.randn(tokens, hidden, device="cuda", dtype=bf16, requires_grad=True)
    w = torch.ones(hidden, device="cuda", dtype=bf16, requires_grad=True)
    q = torch.randn(1, heads, tokens, dim, device="cuda", dtype=bf16, requires_grad=True)
    k = torch.randn(1, kv_heads, tokens, dim, device="cuda", dtype=bf16, requires_grad=True)
    g = torch.randn(tokens, ffn, device="cuda", dtype=bf16, requires_grad=True)
    u = torch.randn(tokens, ffn, device="cuda", dtype=bf16, requires_grad=True)
    cases = {"hf_rmsnorm": (lambda: hf_rmsnorm(x, w), (x, w)),
             "torch_rms_norm": (lambda: F.rms_norm(x, (hidden,), w, 1e-5), (x, w)),
             "hf_rope_qk": (lambda: hf_rope(q, k), (q, k)),
             "swiglu": (lambda: F.silu(g) * u, (g, u)),
             "residual_add": (lambda: x + y, (x, y))}
    for name, (fn, inputs) in cases.items():
        fields = {"m": tokens, "n": hidden, "k": ffn, "groups": heads, "dtype": "bf16", "backend": "eager"}
        with torch.no_grad():
            record("eager_fwd", name, 0.0, kernel_seconds(fn, args), **fields)

        first = fn()
        grads = [torch.ones_like(o) for o in (first if isinstance(first, tuple) else (first,))]

        def both(fn: Callable[[], Any] = fn, inputs: tuple[torch.Tensor, ...] = inputs,
                 grads: list[torch.Tensor] = grads) -> None:
            out = fn()
            torch.autograd.grad(out if isinstance(out, tuple) else (out,), inputs, grads)
        record("eager_fwd_bwd", name, 0.0, kernel_seconds(both, args), **fields)


def device_info() -> dict[str, Any]:
    query = "name,driver_version,clocks.max.sm,clocks.sm,power.limit,temperature.gpu"
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    props = torch.cuda.get_device_properties(0)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "name": torch.cuda.get_device_name(0),
            "sms": props.multi_processor_count, "memory_bytes": props.total_memory, "nvidia_smi": smi}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--only", default="gemm,grouped,attention,eager,layer")
    parser.add_argument("--head-dims", default="128", help=(
        "comma-separated head dims for the attention rows (128: Llama's; 64: GPT-OSS's; 192: MLA's q/k head "
        "of DeepSeek-V3, its v head timed at 192 too)"))
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    info = device_info()
    print(json.dumps(info), flush=True)
    if "gemm" in only:
        for size in (1024, 2048, 4096, 8192, 16384):
            bench_gemm(f"square{size}", size, size, size, args)
        # One layer's GEMMs at 8,192 tokens (one 8k sequence, or two 4k): Llama 3 8B (h 4096, GQA 8 of 32
        # heads, ffn 14336) at tp 1 and 70B (h 8192, 8 of 64, ffn 28672) at tp 8; each forward and its two
        # backward shapes (input gradient m x k from m x n, weight gradient n x k over m).
        for model, h, qkv, ffn, tp in (("llama3-8b", 4096, 6144, 14336, 1), ("llama3-70b", 8192, 10240, 28672, 8),
                                       ("llama3-70b", 8192, 10240, 28672, 4)):
            tokens = 8192
            for op, n, k in (("qkv", qkv // tp, h), ("proj", h, h // tp), ("fc1", 2 * ffn // tp, h),
                             ("fc2", h, ffn // tp)):
                base = f"{model}_tp{tp}_{op}"
                bench_gemm(base, tokens, n, k, args)
                bench_gemm(base + ".dgrad", tokens, k, n, args)
                bench_gemm(base + ".wgrad", n, k, tokens, args)
        # Mixtral 8x7B expert FFN (h 4096, ffn 14336, 8 experts, top-2) at 4,096 tokens per micro-batch per EP
        # rank: 1,024 rows per expert when balanced; Qwen3-30B-A3B's experts (h 2048, ffn 768, 128 experts top-8).
        for rows in (256, 512, 1024, 2048, 4096):
            bench_gemm(f"mixtral_expert_fc1_m{rows}", rows, 2 * 14336, 4096, args)
            bench_gemm(f"mixtral_expert_fc2_m{rows}", rows, 4096, 14336, args)
        for rows in (128, 256, 512, 1024):
            bench_gemm(f"qwen3_expert_fc1_m{rows}", rows, 2 * 768, 2048, args)
    if "grouped" in only:
        bench_grouped("mixtral_fc1_8x1024", 8, 8192, 4096, 2 * 14336, args)
        bench_grouped("qwen3_fc1_128x256", 128, 32768, 2048, 2 * 768, args)
    if "attention" in only:
        for head_dim in (int(d) for d in args.head_dims.split(",")):
            for seq in (2048, 4096, 8192, 16384):
                bench_attention(seq, 32, head_dim, 1, args)
    if "eager" in only:
        bench_eager(8192, 4096, 32, 8, 14336, args)
    if "layer" in only:
        bench_layer("llama3-8b_s8192", 4096, 32, 8, 14336, 8192, 1, args)
        bench_layer("llama3-8b_s4096_b2", 4096, 32, 8, 14336, 4096, 2, args)
    info["after"] = device_info()["nvidia_smi"]
    (args.output / "device.json").write_text(json.dumps(info, indent=1) + "\n")
    keys = list(dict.fromkeys(key for row in ROWS for key in row))
    lines = [",".join(keys)] + [",".join("" if row.get(key) is None else str(row.get(key)) for key in keys)
                                for row in ROWS]
    (args.output / "kernels.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
