"""Time what Megatron-Core's combined 1F1B machinery (``--combined-1f1b --combined-1f1b-recipe ep_a2a``) costs the
host per MoE layer pass, beside the same layer functions called plainly.

In: the Megatron-LM commit the Qwen3 "+1f1b overlap" row ran, ``moe_dev(f3e6c5)`` =
f3e6c55acfd2858714b131b963ea94db96680aa5 of github.com/lhb8125/Megatron-LM ("[MoE EA][WIP] 1F1B Overlap",
2025-04-29), read at run time: ``--mirror`` (a git directory holding that commit; its ``megatron/core`` is
``git archive``d into a temporary folder) or ``--source`` (a folder already holding that ``megatron/core``, e.g.
carried to a device machine). Nothing of it is copied into this repository. PyTorch; CUDA optional (``--device
cuda``). Out: ``-o FILE``, one CSV row per quantity (seconds per layer, per pass or per merged layer pair), and a
JSON line per case on stdout.

What runs. Megatron's own schedule code: ``ModelChunkSchedulePlan``, ``TransformerLayerSchedulePlan``,
``TransformerLayerNode`` and ``schedule_chunk_1f1b`` (megatron/core/models/gpt/fine_grained_schedule.py),
``ScheduleNode`` and ``set_streams`` (megatron/core/pipeline_parallel/combined_1f1b.py),
``TransformerLayerSubmoduleCallables`` (megatron/core/transformer/utils.py), ``TransformerLayer.
get_submodule_callables`` and its ``_submodule_*_postprocess`` and ``_submodule_*_dw`` methods
(megatron/core/transformer/transformer_layer.py; the dw ones through ``SelfAttention.backward_dw``,
``MoELayer.backward_dw`` and ``TEGroupedMLP.backward_dw``), with the flex (DeepEP) dispatcher's memory strategy.
What is not Megatron's: the four submodule forward functions the nodes wrap (``StandInLayer``: attention + router,
the dispatch all-to-all, the experts, the combine all-to-all + residual add), small torch functions of a MoE layer's
dataflow (a norm, the attention projections, the router's GEMM + softmax + top-k, a copy for each all-to-all, a
permute and two expert GEMMs), the same functions in both paths; a Transformer Engine linear module's
``backward_dw`` (TE is not installed: a one-line stand-in of Megatron's wrapper, a no-op without
``--delay-wgrad-compute``, as the row ran); and the plan's construction loop (``build_model_chunk_schedule_plan``
needs a GPTModel: the same classes built per layer here, with a plain ``ScheduleNode`` as the middle stage's
``pre_process``).

The two paths, per model chunk of ``--layers`` MoE layers (the row: 3 per virtual stage):
- ``plain``: Megatron's 1F1B without the overlap: the layers' functions chained in one forward, and one
  ``torch.autograd.backward`` for the chunk (forward_step / backward_step);
- ``combined``: the plan built per micro-batch (``build_s``), then ``schedule_chunk_1f1b`` alone for a forward
  (its warm-up path: ``forward_step`` with ``b_model`` None), alone for a backward (cool-down), and merged (F of one
  micro-batch with B of the one before, the steady state): per MoE layer 4 node forwards (attn, dispatch, mlp,
  combine), 4 node backwards (each its own ``Variable._execution_engine.run_backward``) and 2 ``dw`` calls.
Host seconds around the calls (on a CPU the calling thread's CPU time, ``time.thread_time``, so that a shared
machine's scheduling does not count; on a GPU wall time, ``time.perf_counter``), garbage collection off (the rows'
``--manual-gc``), per layer (per merged layer pair for ``merged``), the median of ``--reps`` after ``--warmup``, the
cases interleaved rep by rep.

On a CPU (``--device cpu``) the CUDA calls the nodes make are stubbed (no-ops): ``torch.cuda.Event`` (record, wait),
``torch.cuda.Stream`` / ``current_stream`` / ``stream``, ``torch.cuda.nvtx`` and ``Tensor.record_stream``; the
autograd engine runs CPU tensors' backward on the calling thread. So the CPU figure is a lower bound: a GPU adds the
event records and waits, the stream switches, and for each ``run_backward`` the hand-off to the engine's device
thread and back. ``--device cuda`` runs the same code with real streams and events (``CUDA_DEVICE_MAX_CONNECTIONS``
as set). Python modules Megatron imports but the measured path does not use (``einops``, ``triton`` where not
installed) get empty stand-ins, said so in the output's ``stubs``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

COMMIT = "f3e6c55acfd2858714b131b963ea94db96680aa5"
MIRROR = "/work/.mirror/lhb8125+Megatron-LM/repo"
# Node calls per MoE layer in the combined schedule (schedule_layer_1f1b): the forward's four node forwards, the
# backward's four node backwards and its two dw calls; plain 1F1B runs none of them.
NODE_CALLS = {"forward": 4, "backward": 6}


# -- loading f3e6c5 ---------------------------------------------------------------------------------------------
def megatron_tree(args: argparse.Namespace) -> Path:
    """A folder holding f3e6c5's megatron/core: ``--source``, or ``git archive`` of ``--mirror`` at ``COMMIT``."""
    if args.source:
        return Path(args.source)
    folder = Path(tempfile.mkdtemp(prefix="f3e6c5-"))
    archive = subprocess.run(["git", "-C", args.mirror, "archive", COMMIT, "megatron/core"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


class _Anything:
    """A stand-in value for modules imported but not used on the measured path (decorators pass functions through)."""

    def __init__(self, *a: Any, **k: Any) -> None: ...

    def __call__(self, *a: Any, **k: Any) -> Any:
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __getitem__(self, key: Any) -> Any:
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


def stub_missing_imports() -> list[str]:
    """Empty stand-ins for ``einops`` and ``triton`` where not installed (parallel_state imports einops for
    rank layouts, moe_utils triton for kernels this script never calls). ``torch.compile`` is touched first, so
    PyTorch's own probe for triton runs before the stand-in exists (Megatron's jit_fuser decorates with it)."""
    torch.compile(lambda x: x)
    stubbed = []
    for name in ("einops", "triton", "triton.language"):
        try:
            __import__(name)
        except ImportError:
            module = _StubModule(name)
            module.__path__ = []  # type: ignore[attr-defined]
            sys.modules[name] = module
            stubbed.append(name)
    if "triton" in stubbed:
        sys.modules["triton"].language = sys.modules["triton.language"]  # type: ignore[attr-defined]
    return stubbed


def stub_cuda_calls() -> list[str]:
    """``--device cpu``: the CUDA calls the schedule nodes make, as no-ops."""

    class Stream:
        def __init__(self, *a: Any, **k: Any) -> None: ...

        def wait_stream(self, other: Any) -> None: ...

        def synchronize(self) -> None: ...

    class Event:
        def __init__(self, *a: Any, **k: Any) -> None: ...

        def record(self, stream: Any = None) -> None: ...

        def wait(self, stream: Any = None) -> None: ...

    class StreamContext:
        def __init__(self, stream: Any) -> None: ...

        def __enter__(self) -> None: ...

        def __exit__(self, *a: Any) -> None: ...

    stream = Stream()
    torch.cuda.Stream = Stream  # type: ignore[misc,assignment]
    torch.cuda.Event = Event  # type: ignore[misc,assignment]
    torch.cuda.current_stream = lambda *a, **k: stream  # type: ignore[assignment]
    torch.cuda.stream = StreamContext  # type: ignore[assignment]
    torch.cuda.nvtx.range_push = lambda *a, **k: 0  # type: ignore[assignment]
    torch.cuda.nvtx.range_pop = lambda *a, **k: 0  # type: ignore[assignment]
    torch.cuda.nvtx.range = lambda *a, **k: StreamContext(None)  # type: ignore[assignment]
    torch.Tensor.record_stream = lambda self, s: None  # type: ignore[method-assign,assignment]
    return ["torch.cuda.Event", "torch.cuda.Stream", "torch.cuda.current_stream", "torch.cuda.stream",
            "torch.cuda.nvtx", "Tensor.record_stream"]


# -- the layer the nodes wrap -------------------------------------------------------------------------------------
class TEStandIn:
    """A Transformer Engine linear module's ``backward_dw`` as Megatron's wrapper has it (extensions/
    transformer_engine.py at f3e6c5): the delayed weight gradient only under ``--delay-wgrad-compute``."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def backward_dw(self) -> None:
        if self.config.delay_wgrad_compute:
            raise NotImplementedError("the row ran without --delay-wgrad-compute")


class StandInLayer:
    """One MoE transformer layer as the combined schedule sees it: f3e6c5's ``TransformerLayer.
    get_submodule_callables`` and its postprocess and dw methods (Megatron's), around four forward functions of the
    layer's dataflow (ours, the same in both paths). ``flex``: the DeepEP dispatcher (the row's), whose dispatch
    node keeps its inputs and whose mlp node reads the dispatched probabilities from the layer's state."""

    def __init__(self, hidden: int, experts: int, topk: int, ffn: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        from megatron.core.transformer.attention import SelfAttention
        from megatron.core.transformer.moe.experts import TEGroupedMLP
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher
        from megatron.core.transformer.transformer_layer import TransformerLayer

        self.config = types.SimpleNamespace(fp8=None, fp8_recipe=None, delay_wgrad_compute=False)
        self.layer_number = 1
        self.topk = topk

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=device, dtype=torch.float32) * 0.02).to(dtype).requires_grad_()

        self.norm1, self.norm2 = w(hidden), w(hidden)
        self.w_qkv, self.w_proj, self.w_router = w(hidden, hidden), w(hidden, hidden), w(hidden, experts)
        self.w_fc1, self.w_fc2 = w(hidden, 2 * ffn), w(ffn, hidden)
        self.params = [self.norm1, self.norm2, self.w_qkv, self.w_proj, self.w_router, self.w_fc1, self.w_fc2]
        # the submodules get_submodule_callables and the dw methods read, Megatron's classes without their init
        attention = types.SimpleNamespace(linear_qkv=TEStandIn(self.config), linear_proj=TEStandIn(self.config))
        for name in ("backward_dw", "_backward_qkv_proj", "_backward_output_proj"):
            setattr(attention, name, types.MethodType(getattr(SelfAttention, name), attention))
        self.self_attention = attention
        grouped = types.SimpleNamespace(linear_fc1=TEStandIn(self.config), linear_fc2=TEStandIn(self.config))
        grouped.backward_dw = types.MethodType(TEGroupedMLP.backward_dw, grouped)
        mlp = MoELayer.__new__(MoELayer)
        for name, value in (("experts", grouped), ("use_shared_expert", False), ("shared_expert_overlap", False),
                            ("token_dispatcher", MoEFlexTokenDispatcher.__new__(MoEFlexTokenDispatcher))):
            object.__setattr__(mlp, name, value)
        self.mlp = mlp
        for name in ("get_submodule_callables", "_submodule_attn_router_postprocess",
                     "_submodule_dispatch_postprocess", "_submodule_mlp_postprocess",
                     "_submodule_combine_postprocess", "_submodule_attn_router_dw", "_submodule_mlp_dw",
                     "_submodule_attn_postprocess", "_submodule_dense_postprocess", "_submodule_not_implemented",
                     "_forward_attention", "_forward_mlp"):  # the last two: a dense layer's, named, not called
            setattr(self, name, types.MethodType(getattr(TransformerLayer, name), self))
        self.is_moe, self.is_deepep = True, True

    # The four forward functions (their signatures are f3e6c5's _submodule_*_forward's).
    def _submodule_attn_router_forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                                       inference_params: Any = None, rotary_pos_emb: Any = None,
                                       rotary_pos_cos: Any = None, rotary_pos_sin: Any = None,
                                       attention_bias: Any = None, packed_seq_params: Any = None,
                                       sequence_len_offset: Any = None, state: Any = None) -> tuple[torch.Tensor, ...]:
        h = hidden_states
        x = F.rms_norm(h, (h.shape[-1],), self.norm1, 1e-6)
        attn = torch.softmax(x @ self.w_qkv, dim=-1) @ self.w_proj  # the attention block's GEMMs and core
        h = h + attn
        pre = F.rms_norm(h, (h.shape[-1],), self.norm2, 1e-6)
        scores = torch.softmax((pre.float() @ self.w_router.float()), dim=-1)
        top, _ = torch.topk(scores, self.topk, dim=-1)
        probs = top / top.sum(dim=-1, keepdim=True)
        return pre, probs, h, pre

    def _submodule_dispatch_forward(self, local_tokens: torch.Tensor, probs: torch.Tensor,
                                    state: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        return local_tokens.clone(), probs.clone()  # the all-to-all: a copy of the rows

    def _submodule_moe_forward(self, dispatched_tokens: torch.Tensor, probs: Any = None,
                               state: Any = None) -> tuple[torch.Tensor, None, None]:
        probs = state.dispatched_probs if state is not None else probs
        order = torch.arange(dispatched_tokens.shape[0] - 1, -1, -1, device=dispatched_tokens.device)
        tokens = dispatched_tokens.index_select(0, order)  # the permute by expert (its backward needs no input)
        gate, up = (tokens @ self.w_fc1).chunk(2, dim=-1)
        out = (F.silu(gate) * up * probs[..., :1].to(gate.dtype)) @ self.w_fc2
        return out.index_select(0, order), None, None  # the unpermute

    def _submodule_combine_forward(self, output: torch.Tensor, shared_expert_output: Any = None,
                                   state: Any = None) -> torch.Tensor:
        from megatron.core.utils import make_viewless_tensor
        hidden = output.clone() + state.residual  # the all-to-all back, then the residual add
        return make_viewless_tensor(inp=hidden, requires_grad=hidden.requires_grad, keep_graph=True)

    def plain(self, h: torch.Tensor) -> torch.Tensor:
        """The same four functions chained as Megatron's TransformerLayer.forward runs the layer without the
        combined schedule (no nodes, no detaches)."""
        local, probs, residual, _ = self._submodule_attn_router_forward(h)
        tokens, dispatched = self._submodule_dispatch_forward(local, probs)
        state = types.SimpleNamespace(dispatched_probs=dispatched, residual=residual)
        out, _, _ = self._submodule_moe_forward(tokens, state=state)
        return self._submodule_combine_forward(out, state=state)


# -- the two paths --------------------------------------------------------------------------------------------------
def build_plan(layers: list[StandInLayer], x: torch.Tensor) -> Any:
    """A middle pipeline stage's ModelChunkSchedulePlan, as build_model_chunk_schedule_plan makes it (Megatron's
    classes): a pre_process node returning the received input, one TransformerLayerSchedulePlan per layer, no
    post_process."""
    from megatron.core.models.gpt.fine_grained_schedule import ModelChunkSchedulePlan, TransformerLayerSchedulePlan
    from megatron.core.pipeline_parallel.combined_1f1b import ScheduleNode, get_com_stream, get_comp_stream
    comp, com = get_comp_stream(), get_com_stream()
    plan = ModelChunkSchedulePlan()
    state = plan.state
    for name in ("attention_mask", "attention_bias", "inference_params", "packed_seq_params", "sequence_len_offset",
                 "rotary_pos_emb", "rotary_pos_cos", "rotary_pos_sin"):
        setattr(state, name, None)
    plan.pre_process = ScheduleNode(lambda: x, comp, plan.event, name="pre_process")
    for layer in layers:
        plan.add_layer(TransformerLayerSchedulePlan(layer, plan.event, state, comp, com))
    return plan


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Host seconds of each case, rep by rep, all cases each rep (so drift in the host's speed hits them alike)."""
    from megatron.core.models.gpt.fine_grained_schedule import schedule_chunk_1f1b
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    layers = [StandInLayer(args.hidden, args.experts, args.topk, args.ffn, device, dtype) for _ in range(args.layers)]
    params = [p for layer in layers for p in layer.params]

    def fresh() -> torch.Tensor:
        return torch.randn(args.tokens, 1, args.hidden, device=device, dtype=dtype).requires_grad_()

    # On a CPU the host's cost is the calling thread's CPU time (the autograd engine runs CPU tensors' backward on
    # it; one intra-op thread): on a shared machine wall time also counts the time the thread waits to be scheduled.
    # On a GPU it is wall time: run_backward waits for the engine's device thread, which is host time the pass costs.
    clock = time.thread_time if device.type == "cpu" else time.perf_counter

    def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
        sync(device)
        t0 = clock()
        out = fn(*args)
        t1 = clock()
        sync(device)
        return t1 - t0, out

    samples: dict[str, list[float]] = {}
    n = args.layers
    gc.collect()
    gc.freeze()  # the imported modules' objects out of every later collection (each rep collects before it runs)
    previous = None  # the combined path's last forward: (plan, its output), for the next merged step's backward
    for rep in range(args.warmup + args.reps):
        for p in params:
            p.grad = None
        gc.collect()
        gc.disable()
        got: dict[str, float] = {}
        # plain: one forward chained through the layers, one backward for the chunk
        x = fresh()
        got["plain_fwd"], out = timed(_chain, layers, x)
        grad = torch.ones_like(out)
        got["plain_bwd"], _ = timed(torch.autograd.backward, out, grad)
        # combined, forward alone (warm-up) then backward alone (cool-down)
        x = fresh()
        got["build"], plan = timed(build_plan, layers, x)
        got["node_fwd"], out = timed(schedule_chunk_1f1b, plan, None)
        grad = torch.ones_like(out)
        got["node_bwd"], _ = timed(schedule_chunk_1f1b, None, plan, grad)
        # combined, merged: this rep's forward with the previous rep's backward (the steady state)
        if previous is None:
            x = fresh()
            plan0 = build_plan(layers, x)
            previous = (plan0, schedule_chunk_1f1b(plan0, None))
        x = fresh()
        got["build_merged"], plan = timed(build_plan, layers, x)
        b_plan, b_out = previous
        grad = torch.ones_like(b_out)
        got["merged"], out = timed(schedule_chunk_1f1b, plan, b_plan, grad)
        previous = (plan, out)
        gc.enable()
        if rep >= args.warmup:
            for key, value in got.items():
                samples.setdefault(key, []).append(value / n)
    meta = {"layers": n, "tokens": args.tokens, "hidden": args.hidden, "experts": args.experts, "topk": args.topk,
            "ffn": args.ffn, "reps": args.reps, "warmup": args.warmup}
    return samples, meta


def _chain(layers: list[StandInLayer], x: torch.Tensor) -> torch.Tensor:
    h = x
    for layer in layers:
        h = layer.plain(h)
    return h


def summarise(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Medians and quartiles per case, and the derived extras: per pass what the combined path adds over the plain
    one (its plan's construction counted with the forward), per merged layer pair, and per node call."""
    def stats(values: list[float]) -> dict[str, float]:
        q = statistics.quantiles(values, n=20) if len(values) > 1 else [values[0]] * 19
        return {"median": statistics.median(values), "p10": q[1], "p25": q[4], "p75": q[14]}

    pair = [m + b - f - g for m, b, f, g in zip(samples["merged"], samples["build_merged"], samples["plain_fwd"],
                                                samples["plain_bwd"], strict=True)]
    fwd = [nf + b - f for nf, b, f in zip(samples["node_fwd"], samples["build"], samples["plain_fwd"], strict=True)]
    bwd = [nb - g for nb, g in zip(samples["node_bwd"], samples["plain_bwd"], strict=True)]
    calls = NODE_CALLS["forward"] + NODE_CALLS["backward"]
    derived = {"extra_forward": fwd, "extra_backward": bwd, "extra_pair": pair,
               "extra_per_node_call": [v / calls for v in pair]}
    out = {key: stats(values) for key, values in {**samples, **derived}.items()}
    # the same extra from each case's 10th percentile: the least disturbed samples of a shared host
    p10 = {key: out[key]["p10"] for key in samples}
    quiet = p10["merged"] + p10["build_merged"] - p10["plain_fwd"] - p10["plain_bwd"]
    out["extra_pair_from_p10s"] = {"median": quiet, "p10": quiet, "p25": quiet, "p75": quiet}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirror", default=MIRROR, help=f"git directory holding {COMMIT}")
    ap.add_argument("--source", help="folder holding f3e6c5's megatron/core (instead of --mirror)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--layers", type=int, default=3, help="MoE layers per model chunk (the row: 3)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=32)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    stubs = stub_missing_imports()
    if device.type == "cpu":
        stubs += stub_cuda_calls()
        method = "cpu, CUDA calls stubbed (a lower bound)"
    else:
        torch.cuda.set_device(0)
        method = f"cuda, CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}"
    sys.path.insert(0, str(megatron_tree(args)))
    from megatron.core.pipeline_parallel.combined_1f1b import set_streams
    set_streams()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    source = {"host": cpu, "torch": torch.__version__, "device": torch.cuda.get_device_name(0)
              if device.type == "cuda" else "cpu", "method": method, "megatron": f"lhb8125/Megatron-LM@{COMMIT}",
              "date": datetime.date.today().isoformat(), "stubs": stubs}
    print(json.dumps({"source": source}), flush=True)
    samples, meta = run(args, device)
    summary = summarise(samples)
    print(json.dumps({"meta": meta, "summary": {k: {s: round(v * 1e6, 2) for s, v in d.items()}
                                                  for k, d in summary.items()}, "unit": "us"}), flush=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["date", "host", "torch", "device", "method", "megatron", "layers", "tokens", "hidden", "reps",
                    "quantity", "per", "median_s", "p10_s", "p25_s", "p75_s"])
        for key, d in summary.items():
            per = ("merged layer pair" if key in ("merged", "build_merged", "extra_pair", "extra_pair_from_p10s")
                   else "node call" if key == "extra_per_node_call" else "layer")
            w.writerow([source["date"], source["host"], source["torch"], source["device"], method, source["megatron"],
                        meta["layers"], meta["tokens"], meta["hidden"], meta["reps"], key, per,
                        f"{d['median']:.9f}", f"{d['p10']:.9f}", f"{d['p25']:.9f}", f"{d['p75']:.9f}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
