"""Time Megatron-Core's own MoE layer (router, token dispatcher, grouped experts, unpermute) on one GPU, beside the
plain-PyTorch replay of its op sequence (``scripts/measure_moe_host_overhead.py``), to measure the host time that
Megatron's Python adds per MoE layer pass.

In: a Megatron-LM ``megatron/core`` tree on ``--mcore`` (the ModelZoo rows' code, ``git archive 1e05700595
megatron/core``), PyTorch with CUDA (``--cpu-dry-run`` runs the same code on a CPU with stand-ins for the CUDA stream
calls, to check the harness, not to time anything). Out: ``-o FILE``, one CSV row per (shape, implementation,
quantity), and a JSON line per measurement on stdout.

What runs. ``MoELayer`` built from Megatron's own local spec (``get_moe_module_spec(use_te=False,
moe_grouped_gemm=True)``: ``TopKRouter``, ``MoEAlltoAllTokenDispatcher``, the legacy ``GroupedMLP``) with the
ModelZoo's Qwen3-235B-A22B settings (128 experts top-8, moe ffn 1536, router in fp32, aux loss 1e-3, forced load
balancing, dropless, bf16), as one rank of an ep 8 / etp 1 layout sees it: 16 local experts, the dispatcher's
expert-parallel group is an 8-rank stand-in whose all-to-all is a copy of the received rows and whose counts
all-gather tiles this rank's counts (every rank routes alike). What is not Megatron's: the grouped GEMM
(``grouped_gemm`` is not installed: ``torch._grouped_mm``, one kernel per GEMM like the CUTLASS library, or a loop
of ``torch.mm`` where that is not available) and, in the ``fused`` variant, Transformer Engine's fused permute,
sort-chunks and unpermute (Transformer Engine is not installed: torch ops of about their kernel count; the
``unfused`` variant runs Megatron's own torch permute instead, which syncs the host more).

Per layer pass (``--layers`` MoE layers back to back, forward then backward, median of ``--reps`` after
``--warmup``): ``host_fwd_s`` the CPU time issuing the forward (it includes the dispatcher's host sync: on the
``tiny`` shape the GPU is idle at the sync, so this is the host's issue time), ``wall_fwd_s`` the forward's wall
time to a device sync, ``host_bwd_s`` / ``wall_bwd_s`` likewise for the backward (``backward()`` returns when the
autograd engine has issued the last kernel), and the forward's parts: ``router_s``, ``dispatch_s``
(``token_permutation``), ``experts_s``, ``combine_s`` (``token_unpermutation``); ``kernels_fwd`` / ``kernels_bwd``
the kernels and copies a pass launches and ``kernel_fwd_s`` / ``kernel_bwd_s`` their summed device time (PyTorch's
profiler). The replay's MoE part (``router``, ``dispatch``, ``experts_mlp``, ``combine``; no attention) is timed the
same way on the same shapes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

QWEN3 = {"experts": 128, "topk": 8, "ep": 8}
# Per-rank shapes: the A2A pp 32 row (tp 2, sequence parallel: 2048 tokens), the tp 4 row (1024 tokens), and a
# tiny one whose kernels are shorter than their launch so the CPU time is the host's issue time.
SHAPES: dict[str, dict[str, int]] = {
    "a2a-pp32": {"tokens": 2048, "hidden": 4096, "ffn": 1536},
    "tp4": {"tokens": 1024, "hidden": 4096, "ffn": 1536},
    "tiny": {"tokens": 256, "hidden": 256, "ffn": 128},
}


class FakeGroup:
    """An ``n``-rank process group seen from rank 0; only ``size`` and ``rank`` are asked of it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


def _rows(splits: Any) -> int:
    if splits is None:
        return -1
    if torch.is_tensor(splits):
        return int(splits.sum().item())
    return int(sum(int(v) for v in splits))


class FakeAllToAll(torch.autograd.Function):
    """The all-to-all of ``n_out`` rows: a copy of this rank's rows (repeated or cut to ``n_out``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n_out: int) -> torch.Tensor:
        ctx.n_in = x.shape[0]
        return _resize_rows(x, n_out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _resize_rows(grad, ctx.n_in), None


def _resize_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    if n <= x.shape[0]:
        return x[:n].clone()
    reps = -(-n // max(1, x.shape[0]))
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:n]


def fake_all_to_all(group: Any, input_: torch.Tensor, output_split_sizes_: Any = None,
                    input_split_sizes: Any = None) -> torch.Tensor:
    n_out = _rows(output_split_sizes_)
    return FakeAllToAll.apply(input_, input_.shape[0] if n_out < 0 else n_out)


def make_fake_gather(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def gather(input_: torch.Tensor, tensor_parallel_output_grad: bool = True, group: Any = None,
               output_split_sizes: Any = None, use_global_buffer: bool = False) -> torch.Tensor:
        if isinstance(group, FakeGroup):
            return torch.cat([input_] * group.size(), dim=0)
        return real(input_, tensor_parallel_output_grad, group, output_split_sizes, use_global_buffer)
    return gather


def make_gmm() -> tuple[Callable[..., torch.Tensor], str]:
    """``grouped_gemm.ops.gmm(a, b, batch_sizes, trans_b=False)``: ``torch._grouped_mm`` where it runs, else a loop."""

    def loop_gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool = False) -> torch.Tensor:
        sizes = batch_sizes.tolist()
        outs = [x @ (w.t() if trans_b else w) for x, w in zip(a.split(sizes), b, strict=True)]
        return torch.cat(outs)

    def fused_gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool = False,
                  col_major: bool = False) -> torch.Tensor:
        offs = torch.cumsum(batch_sizes, 0).to(torch.int32).to(a.device, non_blocking=True)
        w = b.transpose(1, 2) if trans_b else b
        if col_major:  # the layout CUTLASS wants for the second operand: one copy kernel more
            w = w.transpose(1, 2).contiguous().transpose(1, 2)
        return torch._grouped_mm(a, w, offs=offs)

    if torch.cuda.is_available() and hasattr(torch, "_grouped_mm"):
        for col_major in (False, True):
            def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool = False,
                    _c: bool = col_major) -> torch.Tensor:
                return fused_gmm(a, b, batch_sizes, trans_b, _c)
            try:
                a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                b = torch.randn(4, 32, 48, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                out = gmm(a, b, torch.tensor([16, 16, 16, 16]))
                out.backward(torch.randn_like(out))  # a dense gradient, as the unpermute's backward gives
                torch.cuda.synchronize()
                return gmm, "torch._grouped_mm" + (" (second operand copied column-major)" if col_major else "")
            except Exception as exc:  # noqa: BLE001 - report and try the next
                print(json.dumps({"note": f"_grouped_mm col_major={col_major}: {type(exc).__name__}: {exc}"[:300]}),
                      flush=True)
    return loop_gmm, "loop of torch.mm"


# -- Transformer Engine's fused permute family as torch ops (the ``fused`` variant) --------------------------------
def te_permute_with_probs(tokens: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor,
                          num_out_tokens: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows sorted by expert, one per routed (token, expert) pair; every row of the map has top-k pairs
    (dropless), so the count is known without a sync."""
    t, e = routing_map.shape
    n = t * QWEN3["topk"]
    order = torch.argsort((~routing_map.T.reshape(-1)).to(torch.int8), stable=True)[:n]
    token_of = order % t
    return tokens.index_select(0, token_of), probs.T.reshape(-1).index_select(0, order), token_of


def te_permute(tokens: torch.Tensor, routing_map: torch.Tensor, num_out_tokens: Any = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    permuted, _, token_of = te_permute_with_probs(tokens, routing_map.float(), routing_map)
    return permuted, token_of


def te_unpermute(inp: torch.Tensor, row_id_map: torch.Tensor, merging_probs: Any = None,
                 restore_shape: Any = None, **_: Any) -> torch.Tensor:
    rows = restore_shape[0] if restore_shape is not None else int(row_id_map.max().item()) + 1
    out = torch.zeros(rows, inp.shape[-1], device=inp.device, dtype=inp.dtype)
    return out.index_add(0, row_id_map, inp)


def te_sort_chunks(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    """Chunks of rows reordered on the device without a sync (the row count is the input's)."""
    sizes = torch.as_tensor(split_sizes, device=inp.device)
    idx = torch.as_tensor(sorted_idxs, device=inp.device)
    n = sizes.index_select(0, idx)
    src_start = (torch.cumsum(sizes, 0) - sizes).index_select(0, idx)
    dst_start = torch.cumsum(n, 0) - n
    rows = inp.shape[0]
    offset = torch.repeat_interleave(src_start - dst_start, n, output_size=rows)
    return inp.index_select(0, offset + torch.arange(rows, device=inp.device))


def te_sort_chunks_with_probs(inp: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor,
                              sorted_idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return te_sort_chunks(inp, split_sizes, sorted_idxs), te_sort_chunks(probs.unsqueeze(-1), split_sizes,
                                                                         sorted_idxs).squeeze(-1)


def install_cpu_stand_ins() -> None:
    """``--cpu-dry-run``: CUDA streams (and, without triton, the flex converter) good enough to import and run
    Megatron's code."""
    class _Stream:
        def __init__(self, *a: Any, **k: Any) -> None: ...
        def wait_stream(self, other: Any) -> None: ...
        def synchronize(self) -> None: ...
        def __eq__(self, other: object) -> bool:
            return isinstance(other, _Stream)
        def __hash__(self) -> int:
            return 0

    class _Ctx:
        def __init__(self, *a: Any) -> None: ...
        def __enter__(self) -> None: ...
        def __exit__(self, *a: Any) -> None: ...

    torch.cuda.Stream = _Stream  # type: ignore[misc,assignment]
    torch.cuda.current_stream = lambda *a, **k: _Stream()  # type: ignore[assignment]
    torch.cuda.stream = _Ctx  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        import triton  # noqa: F401
    except ImportError:  # only the flex dispatcher's fused converter needs it, not run here
        conv = types.ModuleType("megatron.core.fusions.fused_indices_converter")
        conv.fused_indices_to_multihot = None  # type: ignore[attr-defined]
        sys.modules[conv.__name__] = conv


def build_megatron(shape: dict[str, int], fused: bool, device: torch.device, gmm: Callable[..., torch.Tensor]) -> Any:
    """Megatron's MoELayer for one rank of ep 8, with the stand-ins above patched into its modules."""
    gg = types.ModuleType("grouped_gemm")
    gg.ops = types.SimpleNamespace(gmm=gmm)  # type: ignore[attr-defined]
    sys.modules.setdefault("grouped_gemm", gg)
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe import experts as experts_mod
    from megatron.core.transformer.moe import grouped_gemm_util, moe_utils
    from megatron.core.transformer.moe import token_dispatcher as td
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    grouped_gemm_util.grouped_gemm = gg
    grouped_gemm_util.ops = gg.ops
    experts_mod.gg = grouped_gemm_util
    td.all_to_all = fake_all_to_all
    if not getattr(td, "_patched_gather", False):
        td.gather_from_sequence_parallel_region = make_fake_gather(td.gather_from_sequence_parallel_region)
        td._patched_gather = True
    if fused:
        moe_utils.HAVE_TE = True
        moe_utils.fused_permute = te_permute
        moe_utils.fused_permute_with_probs = te_permute_with_probs
        moe_utils.fused_unpermute = te_unpermute
        moe_utils.fused_sort_chunks_by_index = te_sort_chunks
        moe_utils.fused_sort_chunks_by_index_with_probs = te_sort_chunks_with_probs
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = TransformerConfig(
        num_layers=8, hidden_size=shape["hidden"], num_attention_heads=8, ffn_hidden_size=shape["ffn"],
        num_moe_experts=QWEN3["experts"], moe_router_topk=QWEN3["topk"], moe_ffn_hidden_size=shape["ffn"],
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3, moe_router_dtype="fp32", moe_router_force_load_balancing=True,
        moe_permute_fusion=fused, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bf16=device.type == "cuda", params_dtype=dtype, perform_initialization=False,
        use_cpu_initialization=device.type != "cuda", expert_model_parallel_size=QWEN3["ep"],
    )
    from megatron.core.transformer.moe.moe_utils import get_default_model_comm_pgs
    pgs = get_default_model_comm_pgs()
    pgs.ep = FakeGroup(QWEN3["ep"])
    pgs.tp_ep = FakeGroup(QWEN3["ep"])
    spec = get_moe_module_spec(use_te=False, num_experts=QWEN3["experts"], moe_grouped_gemm=True)
    layer = build_module(spec, config=config, model_comm_pgs=pgs)
    layer.set_layer_number(1)
    layer = layer.to(device)
    for p in layer.parameters():
        with torch.no_grad():
            p.normal_(0, 0.02)
    layer.train()
    return layer


def wrap_parts(obj_methods: dict[str, tuple[Any, str]], acc: dict[str, float]) -> None:
    """Replace each (object, method) with a wrapper adding its CPU time to ``acc[part]``."""
    for part, (obj, name) in obj_methods.items():
        inner = getattr(obj, name)

        def timed(*a: Any, _inner: Callable[..., Any] = inner, _part: str = part, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = _inner(*a, **k)
            acc[_part] += time.perf_counter() - t0
            return out
        setattr(obj, name, timed)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(forward: Callable[[torch.Tensor], torch.Tensor], params: list[torch.Tensor], x: torch.Tensor,
            layers: int, reps: int, warmup: int, acc: dict[str, float]) -> dict[str, float]:
    device = x.device
    samples: dict[str, list[float]] = {}
    for rep in range(warmup + reps):
        for p in params + [x]:
            p.grad = None
        # --manual-gc (the ModelZoo's Qwen3 yaml): no collection inside a step
        gc.collect()
        gc.disable()
        for k in acc:
            acc[k] = 0.0
        sync(device)
        t0 = time.perf_counter()
        h = x
        for _ in range(layers):
            h = h + forward(h)
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        loss = h.float().sum()
        sync(device)
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        sync(device)
        t5 = time.perf_counter()
        gc.enable()
        if rep < warmup:
            continue
        got = {"host_fwd_s": (t1 - t0) / layers, "wall_fwd_s": (t2 - t0) / layers,
               "host_bwd_s": (t4 - t3) / layers, "wall_bwd_s": (t5 - t3) / layers}
        got.update({k: v / layers for k, v in acc.items()})
        for k, v in got.items():
            samples.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in samples.items()}


def profile_pass(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> dict[str, float]:
    """Kernels (and copies/memsets) and their device time in one forward and one backward of one layer."""
    from torch.profiler import ProfilerActivity, profile
    out: dict[str, float] = {}
    h = x + forward(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        h = x + forward(x)
        torch.cuda.synchronize()
    out.update(_count(prof, "fwd"))
    loss = h.float().sum()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loss.backward()
        torch.cuda.synchronize()
    out.update(_count(prof, "bwd"))
    return out


def _count(prof: Any, tag: str) -> dict[str, float]:
    from torch.autograd import DeviceType
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return {f"kernels_{tag}": float(len(evs)),
            f"kernel_{tag}_s": sum(getattr(e, "device_time", getattr(e, "cuda_time", 0.0)) for e in evs) * 1e-6}


def replay_forward(shape: dict[str, int], device: torch.device, acc: dict[str, float]) -> tuple[Any, Any]:
    """The plain-PyTorch replay's MoE part (router, alltoall dispatch with its sync, experts, combine)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import measure_moe_host_overhead as replay
    rshape = {"hidden": shape["hidden"], "heads": 8, "groups": 8, "head_dim": 8, "experts": QWEN3["experts"],
              "topk": QWEN3["topk"], "ffn": shape["ffn"], "seq": shape["tokens"]}
    layer = replay.MoELayer(rshape, tp=1, ep=QWEN3["ep"], dispatcher="alltoall", device=device, exchange_s=0.0,
                            cycles_per_s=1.0)
    if device.type != "cuda":
        for p in layer.params:
            p.data = p.data.float()
    wrap_parts({"router_s": (layer, "router"), "dispatch_s": (layer, "dispatch"),
                "experts_s": (layer, "experts_mlp"), "combine_s": (layer, "combine")}, acc)

    def forward(h: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(h, (layer.h,), layer.norm2, 1e-6)
        routing_probs, routing_map, top = layer.router(y)
        tokens, probs, token_of = layer.dispatch(y, routing_probs, routing_map, top, True)
        return layer.combine(layer.experts_mlp(tokens, probs), token_of)
    return forward, layer.params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mcore", required=True, help="folder holding megatron/core")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--shapes", default="tiny,tp4,a2a-pp32")
    ap.add_argument("--impls", default="replay,megatron-fused,megatron-unfused")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="times over all (shape, impl), the order reversed each time")
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.mcore)
    if args.cpu_dry_run:
        install_cpu_stand_ins()
        device = torch.device("cpu")
    else:
        device = torch.device("cuda")
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo" if args.cpu_dry_run else "nccl", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    gmm, gmm_name = make_gmm()
    source = {"torch": torch.__version__, "cuda": torch.version.cuda, "grouped_gemm": gmm_name,
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "date": datetime.date.today().isoformat()}
    try:
        source["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=20).stdout.strip()
        source["cpu"] = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                              if ln.startswith("model name")), "")
    except Exception:  # noqa: BLE001 - informational only
        pass
    print(json.dumps({"source": source}), flush=True)
    rows: list[dict[str, Any]] = []
    cases = [(s, i) for s in args.shapes.split(",") for i in args.impls.split(",")]
    order = [(p, c) for p in range(args.passes) for c in (cases if p % 2 == 0 else cases[::-1])]
    for pass_, (shape_name, impl) in order:
        shape = SHAPES[shape_name]
        if args.cpu_dry_run:
            shape = {"tokens": 64, "hidden": 32, "ffn": 16}
        acc = {"router_s": 0.0, "dispatch_s": 0.0, "experts_s": 0.0, "combine_s": 0.0}
        try:
            torch.manual_seed(0)
            if impl == "replay":
                forward, params = replay_forward(shape, device, acc)
            else:
                layer = build_megatron(shape, impl == "megatron-fused", device, gmm)
                wrap_parts({"router_s": (layer.router, "forward"),
                            "dispatch_s": (layer.token_dispatcher, "token_permutation"),
                            "experts_s": (layer.experts, "forward"),
                            "combine_s": (layer.token_dispatcher, "token_unpermutation")}, acc)

                def forward(h: torch.Tensor, _layer: Any = layer) -> torch.Tensor:
                    return _layer(h)[0]
                params = list(layer.parameters())
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            x = (torch.randn(shape["tokens"], 1, shape["hidden"], device=device, dtype=torch.float32)
                 ).to(dtype).requires_grad_()
            if impl == "replay":
                x = x.detach().view(shape["tokens"], shape["hidden"]).requires_grad_()
            got = measure(forward, params, x, args.layers, args.reps, args.warmup, acc)
            if device.type == "cuda":
                got.update(profile_pass(forward, x))
            row = {"shape": shape_name, "impl": impl, "pass": pass_,
                   **{k: round(v, 9) for k, v in got.items()}}
        except Exception as exc:  # noqa: BLE001 - one failing variant must not lose the others
            import traceback
            row = {"shape": shape_name, "impl": impl, "pass": pass_,
                   "error": f"{type(exc).__name__}: {exc}"[:400], "trace": traceback.format_exc()[-1500:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(args.out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["source", json.dumps(source)])
        w.writerow(["shape", "impl", "pass", "quantity", "value"])
        for row in rows:
            for k, v in row.items():
                if k not in ("shape", "impl", "pass"):
                    w.writerow([row["shape"], row["impl"], row["pass"], k, v])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
