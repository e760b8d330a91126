"""The host's time to issue one MoE layer pass in eager PyTorch, and what of it the GPU waits for
(docs/mechanisms/moe_host_sync.md).

In: the pass's direction, the rank's local experts, the host's seconds per eager op, per kernel launch, per
Transformer Engine module call beyond its kernels and per combined-1F1B schedule-node call (``costs.eager_op_overhead``,
``costs.launch_overhead``, ``costs.te_module_overhead``, ``costs.a2a_overlap_node_overhead``), the pass's device time.
Out: the host's issue time of the pass, and the pass's time when the host issues it behind a sync.

Megatron-Core's dropless token dispatchers copy the token counts to the host in every MoE layer's forward and wait
for them (Megatron-LM 1e05700595 ``token_dispatcher.py``: ``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``
``cuda_dtoh_stream.synchronize()`` at ``before_ep_alltoall``; ``MoEAllGatherTokenDispatcher`` ``.cpu()``;
``fused_a2a.py`` DeepEP's dispatch, "the CPU will wait for GPU's signal to arrive"): the grouped GEMM needs the
split sizes on the host. After the wait the host has no lead on the GPU, so whatever the host's time to issue the
layer exceeds the layer's device time shows as GPU idle:

    pass = max(device, host),
    host = (n_eager + n_megatron) x eager_op_overhead + n_gemm x launch_overhead + n_te x te_module_overhead

Measured on an H100 (sim/data/reference/moe_host_measurements.csv, scripts/measure_moe_host_overhead.py: the layer's
op sequence replayed per rank for the Qwen3-235B ModelZoo rows): the wall time of a layer pass is the larger of its
kernel time and its host time within 0.2-0.6 ms, and the host issues one kernel in 26-35 us (median 32 us) of
eager PyTorch, not the 5 us of a bare CUDA launch. The replay stood in plain torch ops for Transformer Engine's
modules; what a TE linear module's forward costs the host beyond them is ``te_module_overhead`` per call
(sim/data/reference/te_module_host_measurements.csv: 115 us per Megatron-Core TEColumnParallelLinear forward,
NVIDIA/TransformerEngine#1191, less the one eager op the replay issued for its GEMM). What Megatron-Core's own MoE code
(router, dispatcher, unpermute) costs the host beyond the replay's op sequence was measured by running it
(scripts/measure_megatron_moe_host.py, sim/data/reference/megatron_moe_host_measurements.csv): n_megatron eager ops'
worth per forward (``costs.megatron_moe_host_ops``).
"""

from __future__ import annotations

from typing import Literal

Direction = Literal["forward", "backward"]

# Kernels one MoE transformer layer pass launches from eager PyTorch besides the routed experts' GEMMs (attention
# block, router with its aux loss, the dispatcher's preprocess, permute, exchanges, sort, activation, unpermute):
# the replay's counts (sim/data/reference/moe_host_measurements.csv, quantity ``kernels``, exchange ``copy``) less
# its per-expert GEMMs, averaged over its three rows (forward 105, 99, 96; backward 86, 98, 91).
EAGER_MOE_LAYER_KERNELS: dict[Direction, int] = {"forward": 100, "backward": 92}
# The routed experts' GEMMs per local expert: Transformer Engine's GroupedLinear (mid-2025, bf16) loops one cuBLAS
# GEMM per expert in C++ (general_grouped_gemm), fc1 and fc2 in the forward, each one's input- and weight-gradient
# GEMM in the backward; issued at a CUDA launch's cost (``costs.launch_overhead``), not an eager op's.
EXPERT_GEMMS: dict[Direction, int] = {"forward": 2, "backward": 4}
# Transformer Engine linear-module calls per MoE transformer layer pass as Megatron-Core's TE spec builds the
# layer (Megatron-LM 1e05700595 gpt_layer_specs.py get_gpt_layer_with_transformer_engine_spec, moe_module_specs.py):
# attention's linear_qkv (TELayerNormColumnParallelLinear) and linear_proj (TERowParallelLinear), or under multi-head
# latent attention linear_q_proj (linear_q_down_proj + linear_q_up_proj with a query latent), linear_kv_down_proj,
# linear_kv_up_proj and linear_proj; the experts' linear_fc1 and linear_fc2 (TEColumnParallelGroupedLinear,
# TERowParallelGroupedLinear); a shared expert's linear_fc1 and linear_fc2 (TEColumnParallelLinear,
# TERowParallelLinear). The measured cost (TransformerEngine#1191) is a forward's; no public figure gives the
# backward's, so the backward counts none (a lower bound). TE's norms and DotProductAttention are modules too, but
# no figure prices them, so they stay at the replay's eager-op count.
TE_MODULE_PASSES: dict[Direction, int] = {"forward": 1, "backward": 0}
# Megatron-Core's own MoE code around those kernels (TopKRouter, the token dispatcher's bookkeeping, the unpermute:
# its Python, autograd Functions and asserts), in eager ops' worth of host time per pass (costs.megatron_moe_host_ops):
# measured in the forward (scripts/measure_megatron_moe_host.py, sim/data/reference/
# megatron_moe_host_measurements.csv); the backward measured no more than the replay's, so it adds none.
MEGATRON_MOE_PASSES: dict[Direction, int] = {"forward": 1, "backward": 0}


# The MoE part of a layer's forward as eager kernels (the pre-MLP norm, the router with its aux loss, the
# dispatcher's preprocess, permute, exchanges and sort, the activation, the unpermute and combine), what selective
# recomputation of module moe replays in the backward: the replay's MoE part at the tiny shape
# (sim/data/reference/megatron_moe_host_measurements.csv, impl replay, kernels_fwd 95) less its 2 x 16 expert GEMMs.
# A lower bound: at the row shapes the same ops launch 115 kernels (larger sorts and scans split into more).
EAGER_MOE_PART_KERNELS = 63


def moe_part_host_seconds(local_experts: int, eager_op_overhead: float, launch_overhead: float,
                          te_module_overhead: float, megatron_moe_host_ops: float) -> float:
    """Seconds the host takes to issue the MoE part of one layer's forward (router -> dispatch -> experts ->
    unpermute; no attention) on a rank with ``local_experts`` experts: its eager kernels, its expert GEMMs, the
    experts' two Transformer Engine grouped-linear modules and Megatron-Core's own MoE code. What Megatron's
    ``--recompute-modules moe`` reruns, host sync included, inside the backward (moe_layer.py at 1e05700595:
    ``tensor_parallel.checkpoint(custom_forward)``)."""
    return ((EAGER_MOE_PART_KERNELS + megatron_moe_host_ops) * eager_op_overhead
            + EXPERT_GEMMS["forward"] * local_experts * launch_overhead + 2 * te_module_overhead)


def te_linear_modules(mla: bool, q_latent: bool, shared_expert: bool) -> int:
    """Transformer Engine linear modules one MoE transformer layer's forward calls (Megatron-Core's TE layer spec):
    attention's 2 (GQA/MHA) or multi-head latent attention's 4 (5 with a query latent ``q_latent``), the routed
    experts' 2 grouped linears, and a ``shared_expert``'s 2. Qwen3 and Mixtral: 4; DeepSeek-V3: 9."""
    attention = 4 + int(q_latent) if mla else 2
    return attention + 2 + 2 * int(shared_expert)


def moe_layer_host_seconds(direction: Direction, local_experts: int, eager_op_overhead: float,
                           launch_overhead: float, te_module_overhead: float, te_modules: int = 4,
                           megatron_moe_host_ops: float = 0.0) -> float:
    """Seconds the host takes to issue one MoE layer's ``direction`` pass on a rank with ``local_experts``
    experts: its eager kernels at ``eager_op_overhead`` each, its expert GEMMs at ``launch_overhead`` each, its
    ``te_modules`` Transformer Engine linear-module calls (``te_linear_modules``; the forward's only) at
    ``te_module_overhead`` each beyond those kernels, and Megatron-Core's own MoE code (the forward's only) at
    ``megatron_moe_host_ops`` eager ops' worth."""
    return (EAGER_MOE_LAYER_KERNELS[direction] * eager_op_overhead
            + EXPERT_GEMMS[direction] * local_experts * launch_overhead
            + TE_MODULE_PASSES[direction] * te_modules * te_module_overhead
            + MEGATRON_MOE_PASSES[direction] * megatron_moe_host_ops * eager_op_overhead)


# Megatron-Core's combined 1F1B (``--combined-1f1b --combined-1f1b-recipe ep_a2a`` at f3e6c5, the Qwen3 overlap
# row's code; ``--overlap-moe-expert-parallel-comm`` later; ``moe.a2a_overlap``) runs every MoE layer pass, warm-up
# and cool-down ones included, as schedule nodes (models/gpt/fine_grained_schedule.py ``schedule_layer_1f1b``,
# pipeline_parallel/combined_1f1b.py ``ScheduleNode``): the forward as four node forwards (attn, dispatch, mlp,
# combine: each an event wait and record, a stream switch, its inputs detached and made viewless), the backward
# as four node backwards (each its own autograd ``run_backward``) and two ``dw`` calls, where plain 1F1B runs one
# forward and one autograd backward for the whole chunk.
SCHEDULE_NODE_CALLS: dict[Direction, int] = {"forward": 4, "backward": 6}


def schedule_node_host_seconds(direction: Direction, node_overhead: float) -> float:
    """Seconds the combined 1F1B's schedule nodes add to the host's issue of one MoE layer's ``direction`` pass
    beyond plain 1F1B's: its node calls (``SCHEDULE_NODE_CALLS``) at ``node_overhead`` each
    (``costs.a2a_overlap_node_overhead``: f3e6c5's own code timed around the same layer functions run plainly,
    sim/data/reference/combined_1f1b_host_measurements.csv, scripts/measure_combined_1f1b_host.py)."""
    return SCHEDULE_NODE_CALLS[direction] * node_overhead


def host_bound(device: float, host: float) -> float:
    """A pass the GPU runs in ``device`` seconds and the host issues in ``host``, from a host sync (no lead): the
    GPU cannot end it before the host has issued its last kernel."""
    return max(device, host)
